//! Duo context exclusion on every path by which repository content reaches a
//! model: file and snippet context (read by the monolith or sent by the
//! editor), `currentFile` (named or sent), the slash commands, the agent's
//! `commit_reader`, a merge request's diff, and Duo Workflow's file reads
//! over REST. The real gateway and the fake provider: what matters is what
//! the provider received.

use contracts::AdditionalContext;
use monolith::chat::CompletionJob;
use monolith::chat::CurrentFile;
use monolith::repositories::writer::{self, CommitRequest, Signature};
use serde_json::json;
use uuid::Uuid;

use crate::agent_support::{Answered, Bench, World, gid};

/// Inside the excluded file: must never reach the provider.
const SECRET: &str = "SECRET_MARKER_hunter2";
/// Inside an ordinary file: reaches the provider.
const PLAIN: &str = "PLAIN_MARKER_fn";

async fn commit(bench: &Bench, project: i64, files: &[(&str, &str)]) -> String {
    let path = bench.repositories().ensure(project, "main").await.unwrap();
    writer::commit(
        &path,
        &CommitRequest {
            branch: "main".into(),
            start: None,
            message: "Change".into(),
            author: Signature {
                name: "Dev".into(),
                email: "dev@example.com".into(),
                when: None,
            },
            actions: crate::agent_support::upserts(files),
        },
    )
    .await
    .unwrap()
    .commit_id
}

/// `gl/app` with `secrets/` and `*.env` excluded, an excluded and a plain file.
async fn world(bench: &Bench) -> World {
    let world = bench.world().await;
    commit(
        bench,
        world.project,
        &[
            (
                "secrets/key.rs",
                &format!("// {SECRET}\npub const KEY: &str = \"x\";\n"),
            ),
            ("src/app.rs", &format!("// {PLAIN}\npub fn app() {{}}\n")),
        ],
    )
    .await;
    bench
        .fx
        .exec(
            "UPDATE projects SET duo_context_exclusion_rules = '{secrets/,*.env}' WHERE id = $1",
            &[&world.project],
        )
        .await;
    world
}

fn leaked(bench: &Bench) -> bool {
    bench.provider_bodies().iter().any(|b| b.contains(SECRET))
}

async fn ask(
    bench: &Bench,
    world: &World,
    content: &str,
    resource: Option<String>,
    current_file: Option<CurrentFile>,
    items: Vec<AdditionalContext>,
) -> Answered {
    let thread_id = bench
        .fx
        .id(
            "INSERT INTO ai_conversation_threads (user_id, conversation_type) VALUES ($1, 1) RETURNING id",
            &[&world.user.id],
        )
        .await;
    let request_id = Uuid::new_v4();
    bench
        .fx
        .exec(
            "INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid)
             VALUES ($1, 1, $2, $3, $4)",
            &[&thread_id, &content, &Uuid::new_v4(), &request_id],
        )
        .await;
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let answer = bench
        .responder_ref()
        .answer(
            &CompletionJob {
                request_id,
                user_id: world.user.id,
                thread_id,
                content: content.into(),
                resource_id: resource,
                current_file,
                additional_context: items,
                ..Default::default()
            },
            tx.into(),
        )
        .await
        .expect("no transient failure");
    Answered {
        answer,
        chunks: Vec::new(),
        tools: Vec::new(),
    }
}

fn item(category: &str, project: i64, path: &str, content: &str) -> AdditionalContext {
    serde_json::from_value(json!({
        "category": category,
        "id": format!("file:///{path}"),
        "content": content,
        "metadata": {"projectId": gid("Project", project), "relativePath": path, "ref": "main"},
    }))
    .unwrap()
}

#[tokio::test]
async fn file_and_snippet_context_of_an_excluded_file_never_reach_the_model() {
    let bench = Bench::start().await;
    let world = world(&bench).await;
    bench.fake.set_default_text(" I know.\nFinal Answer: ok.");

    // "Ask Duo about this file": the monolith would read it; it does not.
    let answered = ask(
        &bench,
        &world,
        "What is in these files?",
        None,
        None,
        vec![
            item("file", world.project, "secrets/key.rs", ""),
            item("file", world.project, "src/app.rs", ""),
        ],
    )
    .await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let body = bench.provider_bodies().pop().unwrap();
    assert!(body.contains(PLAIN), "the plain file is read: {body}");
    assert!(!body.contains(SECRET), "an excluded file was read");
    assert!(body.contains("secrets/key.rs is not shown"), "{body}");

    // An editor's file and selection, sent with their text.
    bench.fake.reset();
    bench.fake.set_default_text(" I know.\nFinal Answer: ok.");
    let answered = ask(
        &bench,
        &world,
        "And these?",
        None,
        None,
        vec![
            item("file", world.project, "secrets/key.rs", SECRET),
            item("snippet", world.project, "config/prod.env", SECRET),
            item("snippet", world.project, "src/app.rs", PLAIN),
        ],
    )
    .await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    assert!(!leaked(&bench), "sent text of an excluded file went on");
    assert!(bench.provider_bodies().iter().any(|b| b.contains(PLAIN)));
}

fn selection(file: &str, text: &str) -> Option<CurrentFile> {
    Some(CurrentFile {
        file_name: file.into(),
        selected_text: text.into(),
        content_above_cursor: (!text.is_empty()).then(|| format!("// above {text}\n")),
        content_below_cursor: None,
    })
}

#[tokio::test]
async fn explain_and_the_current_file_skip_an_excluded_file() {
    let bench = Bench::start().await;
    let world = world(&bench).await;
    let project = Some(gid("Project", world.project));

    // `/explain` on a repository file named by its blob link, and on a
    // selection the editor sent from an excluded file.
    let link = format!("{}/gl/app/-/blob/main/secrets/key.rs", bench.external_url);
    for (file, text) in [
        (link.as_str(), ""),
        ("secrets/key.rs", SECRET),
        ("a.env", SECRET),
    ] {
        bench.fake.reset();
        let answered = ask(
            &bench,
            &world,
            "/explain",
            project.clone(),
            selection(file, text),
            vec![],
        )
        .await;
        assert_eq!(answered.answer.error, None, "{file}: {:?}", answered.answer);
        assert!(
            answered.answer.content.contains("exclusion rules"),
            "{file}: {}",
            answered.answer.content
        );
        assert!(
            bench.fake.requests().is_empty(),
            "{file}: the gateway was asked"
        );
    }
    // A plain file is explained as before.
    bench.fake.reset();
    bench.fake.set_default_text("It is the app.");
    let plain = format!("{}/gl/app/-/blob/main/src/app.rs", bench.external_url);
    let answered = ask(
        &bench,
        &world,
        "/explain",
        project.clone(),
        selection(&plain, ""),
        vec![],
    )
    .await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    assert!(bench.provider_bodies().iter().any(|b| b.contains(PLAIN)));

    // A question to the agent with an excluded current file: asked, without it.
    bench.fake.reset();
    bench.fake.set_default_text(" I know.\nFinal Answer: ok.");
    let answered = ask(
        &bench,
        &world,
        "What does this do?",
        project,
        selection("secrets/key.rs", SECRET),
        vec![],
    )
    .await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    assert!(!bench.provider_bodies().is_empty());
    assert!(!leaked(&bench));
}

#[tokio::test]
async fn commit_reader_leaves_out_the_diff_of_an_excluded_file() {
    let bench = Bench::start().await;
    let world = world(&bench).await;
    let sha = commit(
        &bench,
        world.project,
        &[
            ("secrets/key.rs", &format!("// {SECRET} rotated\n")),
            (
                "src/app.rs",
                &format!("// {PLAIN} changed\npub fn app() {{}}\n"),
            ),
        ],
    )
    .await;
    let question = format!("What does commit {} in gl/app change?", &sha[..8]);
    bench.fake.push_text(format!(
        " I should read it.\nAction: commit_reader\nAction Input: {question}"
    ));
    bench
        .fake
        .push_text(" I know now.\nFinal Answer: It rotates a key.");
    let answered = ask(&bench, &world, &question, None, None, vec![]).await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), 2);
    let observation = &bodies[1];
    assert!(observation.contains("changed"), "{observation}");
    assert!(
        observation.contains("secrets/key.rs is not shown"),
        "{observation}"
    );
    assert!(
        observation.contains("\\\"excluded\\\":true"),
        "{observation}"
    );
    assert!(!leaked(&bench));
}

#[tokio::test]
async fn a_merge_requests_diff_loses_the_hunks_of_excluded_files() {
    let bench = Bench::start().await;
    let world = world(&bench).await;
    let mr = bench.fx.merge_request(world.project, world.user).await;
    let diff = format!(
        "diff --git a/src/app.rs b/src/app.rs\n@@ -1 +1 @@\n-old\n+{PLAIN}\n\
         diff --git a/secrets/key.rs b/secrets/key.rs\n@@ -1 +1 @@\n-old\n+{SECRET}\n"
    );
    bench
        .fx
        .exec(
            "UPDATE merge_requests SET diff = $2 WHERE id = $1",
            &[&mr, &diff],
        )
        .await;
    bench.fake.set_default_text(" I know.\nFinal Answer: ok.");
    let answered = ask(
        &bench,
        &world,
        "Review this merge request",
        Some(gid("MergeRequest", mr)),
        None,
        vec![],
    )
    .await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let body = bench.provider_bodies().pop().unwrap();
    assert!(body.contains(PLAIN), "{body}");
    assert!(!leaked(&bench));
}

mod workflow_reads {
    //! Duo Workflow reads files through `GET .../repository/files/:path/raw`.
    use reqwest::Method;
    use serde_json::json;

    use crate::rest_support::{put, send};
    use crate::workflows_support::world;

    #[tokio::test]
    async fn a_workflow_token_cannot_read_an_excluded_file_but_people_still_can() {
        let w = world().await;
        let (status, body) = crate::rest_support::post(
            &w.server,
            &format!("/projects/{}/repository/commits", w.project),
            &w.admin_token,
            json!({
                "branch": "main",
                "commit_message": "Files",
                "actions": [
                    { "action": "create", "file_path": "README.md", "content": "# App\n" },
                    { "action": "create", "file_path": "secrets/key.txt", "content": "hunter2\n" }
                ]
            }),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        let (status, body) = put(
            &w.server,
            &format!("/projects/{}", w.project),
            &w.admin_token,
            json!({ "duo_context_exclusion_settings": { "exclusion_rules": ["secrets/"] } }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let token = w.workflow_token(w.dev).await;
        let raw = |file: &str| {
            format!(
                "/projects/{}/repository/files/{file}/raw?ref=main",
                w.project
            )
        };
        let reply = send(
            &w.server,
            Method::GET,
            &raw("README.md"),
            Some(&token),
            None,
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        for file in ["secrets%2Fkey.txt", "secrets/key.txt"] {
            let reply = send(&w.server, Method::GET, &raw(file), Some(&token), None).await;
            assert_eq!(reply.status, 403, "{file}: {}", reply.body);
            let message = reply.body["message"].as_str().unwrap_or_default();
            assert!(message.contains("exclusion rules"), "{message}");
        }
        // The user's own token reads it: exclusion keeps files from AI only.
        let reply = reqwest::Client::new()
            .get(
                w.server
                    .url(&format!("/api/v4{}", raw("secrets%2Fkey.txt"))),
            )
            .bearer_auth(&w.dev_token)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 200);
        assert_eq!(reply.text().await.unwrap(), "hunter2\n");
    }
}
