//! The repository browser and the workflow pages over real HTTP: what a
//! member sees, 404 for everyone else, paths that try to leave the repository
//! refused before anything is read, binary files not shown, the chat page's
//! "Ask Duo about this file" context rebuilt on the server, and CSRF on the
//! workflow forms.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::rest_support::post;
use crate::support::{Fx, Server};

use monolith::config::Realm;
use monolith::policy::access;
use reqwest::redirect::Policy as Redirects;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A signed-in page client: the session cookie and its CSRF token.
pub(crate) struct Session {
    http: reqwest::Client,
    cookie: String,
    pub(crate) csrf: String,
}

impl Session {
    pub(crate) async fn get(&self, server: &Server, path: &str) -> (u16, String) {
        let res = self
            .http
            .get(server.url(path))
            .header("Cookie", &self.cookie)
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.text().await.unwrap())
    }

    /// A form post; the answer's status and `Location`.
    pub(crate) async fn post_form(
        &self,
        server: &Server,
        path: &str,
        fields: &[(&str, &str)],
    ) -> (u16, Option<String>) {
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        let res = self
            .http
            .post(server.url(path))
            .header("Cookie", &self.cookie)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        let location = res
            .headers()
            .get("location")
            .map(|l| l.to_str().unwrap().to_owned());
        (res.status().as_u16(), location)
    }

    /// A request line sent as is (no client-side path normalisation), for
    /// `..` segments a URL library would resolve before sending.
    async fn raw_get(&self, server: &Server, path: &str) -> u16 {
        let address = server.base.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {address}\r\nCookie: {}\r\nConnection: close\r\n\r\n",
            self.cookie
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let text = String::from_utf8_lossy(&answer);
        let status = text.split(' ').nth(1).unwrap();
        status.parse().unwrap()
    }
}

/// A web session for `user`, made directly (signing in has its own tests).
pub(crate) async fn session(fx: &Fx, user: i64) -> Session {
    let db = fx.pool.get().await.unwrap();
    let created = monolith::identity::sessions::create(&**db, user)
        .await
        .unwrap();
    Session {
        http: reqwest::Client::builder()
            .redirect(Redirects::none())
            .build()
            .unwrap(),
        cookie: format!("_duo_session={}", created.cookie_value),
        csrf: created.csrf_token,
    }
}

pub(crate) struct Site {
    pub(crate) fx: Fx,
    pub(crate) server: Server,
    pub(crate) project: i64,
    pub(crate) owner: monolith::policy::Actor,
    pub(crate) alice: Session,
    pub(crate) bob: Session,
}

/// `acme/site` (private) with alice as owner and a Duo Enterprise seat, bob
/// outside; the repository holds text, a binary file and a nested directory.
pub(crate) async fn site() -> Site {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let alice = fx.user("alice").await;
    let bob = fx.user("bob").await;
    fx.seat(alice, "duo_enterprise", false).await;
    fx.seat(bob, "duo_enterprise", false).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, alice, access::OWNER).await;
    let project = fx.project(group, "site", "private").await;
    let server = Server::start(&fx).await;
    let token = fx.token(alice, &["api"]).await;
    let (status, body) = post(
        &server,
        &format!("/projects/{project}/repository/commits"),
        &token,
        json!({
            "branch": "main",
            "commit_message": "The site",
            "actions": [
                { "action": "create", "file_path": "README.md", "content": "# Site\n" },
                { "action": "create", "file_path": "src/lib.rs", "content": "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n" },
                { "action": "create", "file_path": "src/deep/more.rs", "content": "// <script>alert(1)</script>\n" },
                { "action": "create", "file_path": "docs/logo.bin", "content": "AAECAwQ=", "encoding": "base64" }
            ]
        }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = post(
        &server,
        &format!("/projects/{project}/repository/commits"),
        &token,
        json!({
            "branch": "feature/more",
            "start_branch": "main",
            "commit_message": "More",
            "actions": [{ "action": "create", "file_path": "NEW.md", "content": "Only on the branch\n" }]
        }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let owner = alice;
    let (alice, bob) = (session(&fx, alice.id).await, session(&fx, bob.id).await);
    Site {
        fx,
        server,
        project,
        owner,
        alice,
        bob,
    }
}

#[tokio::test]
async fn members_browse_the_tree_and_files_and_others_get_404() {
    let s = site().await;
    let (status, html) = s.alice.get(&s.server, "/acme/site/-/tree").await;
    assert_eq!(status, 200, "{html}");
    assert!(
        html.contains("href=\"/acme/site/-/tree/main/src\""),
        "{html}"
    );
    assert!(html.contains("href=\"/acme/site/-/blob/main/README.md\""));
    assert!(html.contains("Ask Duo about this repository"));
    assert!(html.contains("context=repository"));
    // Another branch, with a slash in its name, is offered and browsable.
    assert!(
        html.contains("href=\"/acme/site/-/tree/feature/more\""),
        "{html}"
    );
    let (status, html) = s
        .alice
        .get(&s.server, "/acme/site/-/blob/feature/more/NEW.md")
        .await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("Only on the branch"));
    assert_eq!(
        s.alice
            .get(&s.server, "/acme/site/-/blob/main/NEW.md")
            .await
            .0,
        404
    );

    let (status, html) = s.alice.get(&s.server, "/acme/site/-/tree/main/src").await;
    assert_eq!(status, 200);
    assert!(html.contains("href=\"/acme/site/-/tree/main/src/deep\""));
    assert!(html.contains("Ask Duo about this directory"));
    assert!(
        html.contains("context=directory&amp;context_ref=main&amp;context_path=src"),
        "{html}"
    );

    let (status, html) = s
        .alice
        .get(&s.server, "/acme/site/-/blob/main/src/lib.rs")
        .await;
    assert_eq!(status, 200);
    assert!(html.contains("id=\"L2\""), "line numbers: {html}");
    assert!(html.contains("a + b"));
    assert!(html.contains("context=file&amp;context_ref=main&amp;context_path=src%2Flib.rs"));
    // File content is text on the page, never markup.
    let (_, html) = s
        .alice
        .get(&s.server, "/acme/site/-/blob/main/src/deep/more.rs")
        .await;
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!html.contains("<script>alert"));
    // Binary files are described, not shown, and cannot be asked about.
    let (status, html) = s
        .alice
        .get(&s.server, "/acme/site/-/blob/main/docs/logo.bin")
        .await;
    assert_eq!(status, 200);
    assert!(html.contains("This file is binary"), "{html}");
    assert!(!html.contains("Ask Duo about this file"));

    for missing in [
        "/acme/site/-/blob/main/nope.rs",
        "/acme/site/-/tree/no-such-branch",
        "/acme/site/-/tree/main/README.md",
        "/acme/site/-/blob/main/src",
    ] {
        assert_eq!(s.alice.get(&s.server, missing).await.0, 404, "{missing}");
    }
    // Not a member of a private project: nothing exists for bob.
    for page in [
        "/acme/site/-/tree",
        "/acme/site/-/tree/main/src",
        "/acme/site/-/blob/main/src/lib.rs",
        "/acme/site/-/workflows",
    ] {
        let (status, html) = s.bob.get(&s.server, page).await;
        assert_eq!(status, 404, "{page}");
        assert!(!html.contains("a + b"));
    }
}

#[tokio::test]
async fn paths_leaving_the_repository_are_refused() {
    let s = site().await;
    for path in [
        "/acme/site/-/blob/main/../../../../etc/passwd",
        "/acme/site/-/tree/main/src/../../..",
        "/acme/site/-/blob/main/src/%00lib.rs",
        "/acme/site/-/blob/main/src\\..\\..\\x",
    ] {
        assert_eq!(s.alice.raw_get(&s.server, path).await, 400, "{path}");
    }
    let long = format!("/acme/site/-/blob/main/{}", "a/".repeat(3000));
    assert_eq!(s.alice.get(&s.server, &long).await.0, 400);
    // Bob learns nothing either way.
    assert_eq!(
        s.bob
            .raw_get(&s.server, "/acme/site/-/blob/main/src/lib.rs")
            .await,
        404
    );
}

/// The JSON data block of a page.
pub(crate) fn page_data(html: &str) -> Value {
    let start = html.find("id=\"page-data\">").unwrap() + "id=\"page-data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    serde_json::from_str(&html[start..end]).unwrap()
}

#[tokio::test]
async fn the_chat_page_builds_the_file_context_itself() {
    let s = site().await;
    let gid = format!("gid%3A%2F%2Fgitlab%2FProject%2F{}", s.project);
    let (status, html) = s
        .alice
        .get(
            &s.server,
            &format!(
                "/-/chat?resource={gid}&context=file&context_ref=main&context_path=src%2Flib.rs"
            ),
        )
        .await;
    assert_eq!(status, 200);
    let data = page_data(&html);
    let item = &data["additionalContext"][0];
    assert_eq!(item["category"], "FILE", "{data}");
    assert_eq!(item["content"], "", "the chat reads the file itself");
    assert_eq!(item["metadata"]["relativePath"], "src/lib.rs");
    assert_eq!(
        item["metadata"]["projectId"],
        format!("gid://gitlab/Project/{}", s.project)
    );
    assert!(
        item["id"]
            .as_str()
            .unwrap()
            .ends_with("/acme/site/-/blob/main/src/lib.rs")
    );

    let (_, html) = s
        .alice
        .get(
            &s.server,
            &format!("/-/chat?resource={gid}&context=directory&context_path=src"),
        )
        .await;
    let data = page_data(&html);
    assert_eq!(data["additionalContext"][0]["category"], "DIRECTORY");
    assert_eq!(
        data["additionalContext"][0]["metadata"]["relativePath"],
        "src"
    );

    // A traversal in the path, or a project bob cannot read: nothing attached.
    let (_, html) = s
        .alice
        .get(
            &s.server,
            &format!("/-/chat?resource={gid}&context=file&context_path=..%2F..%2Fetc%2Fpasswd"),
        )
        .await;
    assert_eq!(page_data(&html)["additionalContext"], Value::Null);
    let (status, html) = s
        .bob
        .get(
            &s.server,
            &format!("/-/chat?resource={gid}&context=file&context_path=src%2Flib.rs"),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(page_data(&html)["additionalContext"], Value::Null);
}

pub(crate) async fn workflow_count(fx: &Fx) -> i64 {
    fx.id("SELECT count(*) FROM duo_workflows_workflows", &[])
        .await
}

#[tokio::test]
async fn workflow_forms_need_their_token_and_runs_are_their_owners() {
    let s = site().await;
    let (status, html) = s.alice.get(&s.server, "/acme/site/-/workflows").await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("Start a workflow"));
    assert!(html.contains("No runs yet."));

    // No token, or a wrong one: refused, nothing created.
    let goal = ("goal", "Summarize issue #1");
    let (status, _) = s
        .alice
        .post_form(&s.server, "/acme/site/-/workflows", &[goal])
        .await;
    assert_eq!(status, 403);
    let wrong = "0".repeat(s.alice.csrf.len());
    let (status, _) = s
        .alice
        .post_form(
            &s.server,
            "/acme/site/-/workflows",
            &[goal, ("authenticity_token", &wrong)],
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(workflow_count(&s.fx).await, 0);
    // A blank goal is sent back with the reason.
    let (status, _) = s
        .alice
        .post_form(
            &s.server,
            "/acme/site/-/workflows",
            &[("goal", "   "), ("authenticity_token", &s.alice.csrf)],
        )
        .await;
    assert_eq!(status, 422);
    assert_eq!(workflow_count(&s.fx).await, 0);

    let (status, location) = s
        .alice
        .post_form(
            &s.server,
            "/acme/site/-/workflows",
            &[
                goal,
                ("authenticity_token", &s.alice.csrf),
                ("allow_gitlab_writes", "on"),
            ],
        )
        .await;
    assert_eq!(status, 303);
    let location = location.unwrap();
    assert!(
        location.starts_with("/acme/site/-/workflows/"),
        "{location}"
    );
    let db = s.fx.pool.get().await.unwrap();
    let row = db
        .query_one(
            "SELECT id, workflow_definition, agent_privileges, pre_approved_agent_privileges, status
             FROM duo_workflows_workflows",
            &[],
        )
        .await
        .unwrap();
    let id: i64 = row.get(0);
    assert_eq!(location, format!("/acme/site/-/workflows/{id}"));
    assert_eq!(row.get::<_, String>(1), "chat");
    assert_eq!(row.get::<_, Vec<i16>>(2), vec![2, 3]);
    assert_eq!(row.get::<_, Vec<i16>>(3), vec![2]);

    let (status, html) = s.alice.get(&s.server, &location).await;
    assert_eq!(status, 200);
    assert!(html.contains("Summarize issue #1"));
    let data = page_data(&html);
    assert_eq!(data["status"], "created");
    assert_eq!(data["workflowId"], id);
    assert_eq!(data["browserClient"], true, "GitLab privileges only");
    assert!(html.contains("workflow-"), "the run page loads its script");
    let (_, list) = s.alice.get(&s.server, "/acme/site/-/workflows").await;
    assert!(list.contains(&location));
    // The log of the newest checkpoint is in the page (and readable without
    // the script); the agents' conversation is not.
    db.execute(
        "INSERT INTO duo_workflows_checkpoints
           (workflow_id, project_id, thread_ts, checkpoint_ns, checkpoint, metadata)
         VALUES ($1, $2, 'ts-1', '', $3, '{}')",
        &[
            &id,
            &s.project,
            &json!({"channel_values": {
                "ui_chat_log": [{"message_type": "agent", "content": "Reading issue #1 <b>now</b>"}],
                "conversation_history": {"chat": [{"content": "the system prompt"}]}
            }})
            .to_string(),
        ],
    )
    .await
    .unwrap();
    let (_, html) = s.alice.get(&s.server, &location).await;
    assert!(
        html.contains("Reading issue #1 &lt;b&gt;now&lt;/b&gt;"),
        "{html}"
    );
    assert!(!html.contains("the system prompt"));
    assert_eq!(page_data(&html)["log"][0]["message_type"], "agent");

    // A run with workspace privileges (as the IDE creates them) continues in
    // its executor: the page only follows it.
    let token = s.fx.token(s.owner, &["api"]).await;
    let (status, created) = post(
        &s.server,
        "/ai/duo_workflows/workflows",
        &token,
        json!({"project_id": s.project, "goal": "Edit files", "agent_privileges": [1, 2]}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (_, html) = s
        .alice
        .get(
            &s.server,
            &format!("/acme/site/-/workflows/{}", created["id"]),
        )
        .await;
    assert_eq!(page_data(&html)["browserClient"], false);

    // Another user's run does not exist for them, even with a project of their own.
    assert_eq!(s.bob.get(&s.server, &location).await.0, 404);
    let (status, _) = s
        .bob
        .post_form(
            &s.server,
            &format!("{location}/stop"),
            &[("authenticity_token", &s.bob.csrf)],
        )
        .await;
    assert_eq!(status, 404);

    // Stopping needs the token too.
    let (status, _) = s
        .alice
        .post_form(&s.server, &format!("{location}/stop"), &[])
        .await;
    assert_eq!(status, 403);
    let (status, back) = s
        .alice
        .post_form(
            &s.server,
            &format!("{location}/stop"),
            &[("authenticity_token", &s.alice.csrf)],
        )
        .await;
    assert_eq!(status, 303);
    assert_eq!(back.as_deref(), Some(location.as_str()));
    let status: i16 = db
        .query_one(
            "SELECT status FROM duo_workflows_workflows WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, 5, "stopped");
}

#[tokio::test]
async fn a_user_without_a_seat_cannot_start_workflows() {
    let s = site().await;
    let carol = s.fx.user("carol").await;
    let group: i64 =
        s.fx.id("SELECT group_id FROM projects WHERE id = $1", &[&s.project])
            .await;
    s.fx.group_member(group, carol, access::DEVELOPER).await;
    let carol = session(&s.fx, carol.id).await;
    let (status, html) = carol.get(&s.server, "/acme/site/-/workflows").await;
    assert_eq!(status, 200);
    assert!(!html.contains("Start a workflow"));
    assert!(html.contains("Agent Platform"));
    let (status, _) = carol
        .post_form(
            &s.server,
            "/acme/site/-/workflows",
            &[("goal", "x"), ("authenticity_token", &carol.csrf)],
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(workflow_count(&s.fx).await, 0);
}

#[tokio::test]
async fn a_workflow_token_reaches_the_gitlab_tool_endpoints_only() {
    let s = site().await;
    let db = s.fx.pool.get().await.unwrap();
    let minted = monolith::identity::oauth::mint(
        &**db,
        s.owner.id,
        monolith::identity::oauth::USER_TOKEN_LIFETIME,
    )
    .await
    .unwrap();
    let issue = s.fx.issue(s.project, s.owner, false).await;
    let iid: i32 = db
        .query_one("SELECT iid FROM issues WHERE id = $1", &[&issue])
        .await
        .unwrap()
        .get(0);
    // The note tool's endpoint accepts it, as the user.
    let (status, body) = post(
        &s.server,
        &format!("/projects/{}/issues/{iid}/notes", s.project),
        &minted.token,
        json!({"body": "From a workflow"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["author"]["username"], "alice");
    // Anything else stays refused.
    let (status, body) = post(
        &s.server,
        &format!("/projects/{}/issues", s.project),
        &minted.token,
        json!({"title": "Not from a workflow"}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("insufficient_scope"))
    );
}

#[tokio::test]
async fn ask_duo_is_offered_only_for_what_may_reach_a_model() {
    let s = site().await;
    let token = s.fx.token(s.owner, &["api"]).await;
    let (status, body) = crate::rest_support::put(
        &s.server,
        &format!("/projects/{}", s.project),
        &token,
        json!({ "duo_context_exclusion_settings": { "exclusion_rules": ["src/deep/"] } }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // People still read an excluded file; Duo is not offered for it.
    let (status, html) = s
        .alice
        .get(&s.server, "/acme/site/-/blob/main/src/deep/more.rs")
        .await;
    assert_eq!(status, 200);
    assert!(html.contains("alert(1)"), "{html}");
    assert!(!html.contains("Ask Duo about this file"), "{html}");
    let (_, html) = s
        .alice
        .get(&s.server, "/acme/site/-/blob/main/src/lib.rs")
        .await;
    assert!(html.contains("Ask Duo about this file"));
    let gid = format!("gid%3A%2F%2Fgitlab%2FProject%2F{}", s.project);
    let chat = |path: &str| {
        format!("/-/chat?resource={gid}&context=file&context_ref=main&context_path={path}")
    };
    let (_, html) = s.alice.get(&s.server, &chat("src%2Fdeep%2Fmore.rs")).await;
    assert_eq!(page_data(&html)["additionalContext"], Value::Null);
    let (_, html) = s.alice.get(&s.server, &chat("src%2Flib.rs")).await;
    assert_eq!(page_data(&html)["additionalContext"][0]["category"], "FILE");

    // Duo off for the project: no "Ask Duo" anywhere, nothing attached.
    let (status, body) = crate::rest_support::put(
        &s.server,
        &format!("/projects/{}", s.project),
        &token,
        json!({ "duo_features_enabled": false }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, html) = s.alice.get(&s.server, "/acme/site/-/tree/main/src").await;
    assert!(html.contains("href=\"/acme/site/-/tree/main/src/deep\""));
    assert!(!html.contains("Ask Duo"), "{html}");
    let (_, html) = s
        .alice
        .get(&s.server, "/acme/site/-/blob/main/src/lib.rs")
        .await;
    assert!(html.contains("a + b"));
    assert!(!html.contains("Ask Duo"));
    let (_, html) = s.alice.get(&s.server, &chat("src%2Flib.rs")).await;
    assert_eq!(page_data(&html)["additionalContext"], Value::Null);
}
