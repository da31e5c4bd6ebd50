//! The repository over REST: tree, files, blobs, commits, compare, branches and
//! tags in GitLab's shapes (snapshots), file and commit writes, and the bad
//! input table (paths, refs, sizes, roles).

use monolith::policy::access;
use serde_json::{Value, json};

use crate::git_support::{GitClient, clone_url};
use crate::rest_support::{api_tokens, delete, get, get_with_headers, post, put, users};
use crate::support::{Fx, Server};

/// Ids, times and the server's address replaced, so snapshots hold shapes.
fn redact(value: Value, base: &str) -> Value {
    match value {
        Value::String(s) => {
            let s = s.replace(base, "http://HOST");
            let hex = |t: &str, n: usize| t.len() == n && t.bytes().all(|b| b.is_ascii_hexdigit());
            if hex(&s, 40) {
                Value::String("[sha]".into())
            } else if hex(&s, 8) {
                Value::String("[short sha]".into())
            } else if hex(&s, 64) {
                Value::String("[sha256]".into())
            } else if chrono::DateTime::parse_from_rfc3339(&s).is_ok() {
                Value::String("[time]".into())
            } else if let Some(i) = s.find("/-/commit/") {
                Value::String(format!("{}/-/commit/[sha]", &s[..i]))
            } else {
                Value::String(s)
            }
        }
        Value::Array(items) => Value::Array(items.into_iter().map(|v| redact(v, base)).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, redact(v, base))).collect())
        }
        other => other,
    }
}

struct Repo {
    fx: Fx,
    server: Server,
    project: i64,
    maintainer: String,
    developer: String,
    reporter: String,
    stranger: String,
}

async fn repo() -> Repo {
    repo_with(&[]).await
}

async fn repo_with(settings: &[(&str, &str)]) -> Repo {
    let fx = Fx::new().await;
    let server = Server::start_with_settings(&fx, fx.pool.clone(), settings).await;
    let acme = fx.group(None, "acme", "private", "ultimate").await;
    let project = fx.project(acme, "website", "private").await;
    let [m, d, r, s] = users(&fx, ["maria", "dev", "rita", "stan"]).await;
    fx.project_member(project, m, access::MAINTAINER).await;
    fx.project_member(project, d, access::DEVELOPER).await;
    fx.project_member(project, r, access::REPORTER).await;
    let [maintainer, developer, reporter, stranger] = api_tokens(&fx, [m, d, r, s]).await;
    Repo {
        fx,
        server,
        project,
        maintainer,
        developer,
        reporter,
        stranger,
    }
}

impl Repo {
    fn path(&self, rest: &str) -> String {
        format!("/projects/{}/repository{rest}", self.project)
    }

    /// Two commits on `main` and one on `feature`, through the commits API.
    async fn history(&self) {
        let (status, body) = post(
            &self.server,
            &self.path("/commits"),
            &self.maintainer,
            json!({
                "branch": "main",
                "commit_message": "Initial layout\n\nThe site's skeleton.",
                "actions": [
                    { "action": "create", "file_path": "README.md", "content": "# Website\n" },
                    { "action": "create", "file_path": "src/main.rs", "content": "fn main() {\n    println!(\"hi\");\n}\n" },
                    { "action": "create", "file_path": "src/lib.rs", "content": "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n" },
                    { "action": "create", "file_path": "docs/logo.bin", "content": "AAECAwQ=", "encoding": "base64" }
                ]
            }),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        let (status, body) = put(
            &self.server,
            &self.path("/files/README.md"),
            &self.developer,
            json!({ "branch": "main", "content": "# Website\n\nOur public site.\n", "commit_message": "Describe the site" }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = post(
            &self.server,
            &self.path("/commits"),
            &self.developer,
            json!({
                "branch": "feature",
                "start_branch": "main",
                "commit_message": "Subtract too",
                "actions": [
                    { "action": "update", "file_path": "src/lib.rs", "content": "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\npub fn sub(a: i32, b: i32) -> i32 {\n    a - b\n}\n" },
                    { "action": "move", "previous_path": "src/main.rs", "file_path": "src/bin/site.rs" }
                ]
            }),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
}

#[tokio::test]
async fn repository_reads_in_gitlabs_shapes() {
    let r = repo().await;
    r.history().await;
    let base = r.server.base.clone();
    let snap = |v: Value| redact(v, &base);

    let (status, tree) = get(&r.server, &r.path("/tree"), &r.reporter).await;
    assert_eq!(status, 200);
    insta::assert_json_snapshot!("tree_root", snap(tree));
    let (_, tree) = get(
        &r.server,
        &r.path("/tree?recursive=true&ref=feature"),
        &r.reporter,
    )
    .await;
    let paths: Vec<&str> = tree
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        vec![
            "docs",
            "src",
            "README.md",
            "docs/logo.bin",
            "src/bin",
            "src/lib.rs",
            "src/bin/site.rs"
        ]
    );
    let (status, headers, page) = get_with_headers(
        &r.server,
        &r.path("/tree?recursive=true&per_page=2&page=2"),
        &r.reporter,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(page.as_array().unwrap().len(), 2);
    assert_eq!(headers["x-total"], "6");

    let (status, file) = get(
        &r.server,
        &r.path("/files/src%2Flib.rs?ref=main"),
        &r.reporter,
    )
    .await;
    assert_eq!(status, 200);
    insta::assert_json_snapshot!("file", snap(file));
    let raw = reqwest::Client::new()
        .get(r.server.url(&format!(
            "/api/v4{}",
            r.path("/files/README.md/raw?ref=main")
        )))
        .bearer_auth(&r.reporter)
        .send()
        .await
        .unwrap();
    assert_eq!(raw.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(raw.headers()["x-content-type-options"], "nosniff");
    assert_eq!(raw.text().await.unwrap(), "# Website\n\nOur public site.\n");
    let binary = reqwest::Client::new()
        .get(
            r.server
                .url(&format!("/api/v4{}", r.path("/files/docs%2Flogo.bin/raw"))),
        )
        .bearer_auth(&r.reporter)
        .send()
        .await
        .unwrap();
    assert_eq!(binary.headers()["content-type"], "application/octet-stream");
    assert_eq!(binary.bytes().await.unwrap().as_ref(), &[0u8, 1, 2, 3, 4]);

    let (_, file) = get(&r.server, &r.path("/files/README.md?ref=main"), &r.reporter).await;
    let blob_id = file["blob_id"].as_str().unwrap().to_owned();
    let (status, blob) = get(
        &r.server,
        &r.path(&format!("/blobs/{blob_id}")),
        &r.reporter,
    )
    .await;
    assert_eq!(status, 200);
    insta::assert_json_snapshot!("blob", snap(blob));

    let (status, commits) = get(&r.server, &r.path("/commits?ref_name=feature"), &r.reporter).await;
    assert_eq!(status, 200);
    let titles: Vec<&str> = commits
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["title"].as_str().unwrap())
        .collect();
    assert_eq!(
        titles,
        vec!["Subtract too", "Describe the site", "Initial layout"]
    );
    let (_, touching) = get(
        &r.server,
        &r.path("/commits?ref_name=feature&path=README.md"),
        &r.reporter,
    )
    .await;
    assert_eq!(touching.as_array().unwrap().len(), 2);
    let (_, headers, first) = get_with_headers(
        &r.server,
        &r.path("/commits?ref_name=feature&per_page=1"),
        &r.reporter,
    )
    .await;
    assert_eq!(first[0]["title"], "Subtract too");
    assert_eq!(headers["x-next-page"], "2");
    let (_, none) = get(
        &r.server,
        &r.path("/commits?ref_name=feature&until=2000-01-01"),
        &r.reporter,
    )
    .await;
    assert_eq!(none, json!([]));

    let sha = commits[0]["id"].as_str().unwrap().to_owned();
    let (status, commit) = get(&r.server, &r.path(&format!("/commits/{sha}")), &r.reporter).await;
    assert_eq!(status, 200);
    assert_eq!(
        commit["stats"],
        json!({ "additions": 4, "deletions": 0, "total": 4 })
    );
    insta::assert_json_snapshot!("commit", snap(commit));
    let (status, diff) = get(
        &r.server,
        &r.path(&format!("/commits/{}/diff", &sha[..10])),
        &r.reporter,
    )
    .await;
    assert_eq!(status, 200);
    insta::assert_json_snapshot!("commit_diff", snap(diff));

    let (status, compare) = get(
        &r.server,
        &r.path("/compare?from=main&to=feature"),
        &r.reporter,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(compare["commits"].as_array().unwrap().len(), 1);
    assert_eq!(compare["diffs"].as_array().unwrap().len(), 2);
    assert_eq!(compare["compare_same_ref"], false);

    let (status, branches) = get(&r.server, &r.path("/branches"), &r.reporter).await;
    assert_eq!(status, 200);
    insta::assert_json_snapshot!("branches", snap(branches));
    let (status, tags) = get(&r.server, &r.path("/tags"), &r.reporter).await;
    assert_eq!((status, tags), (200, json!([])));

    let (_, project) = get(&r.server, &format!("/projects/{}", r.project), &r.reporter).await;
    assert_eq!(project["default_branch"], "main");
    assert_eq!(project["empty_repo"], false);
    assert_eq!(
        project["http_url_to_repo"],
        format!("{}/acme/website.git", r.server.base)
    );
}

#[tokio::test]
async fn branch_writes_and_their_refusals() {
    let r = repo().await;
    r.history().await;
    let (status, branch) = post(
        &r.server,
        &r.path("/branches"),
        &r.developer,
        json!({ "branch": "fix", "ref": "main" }),
    )
    .await;
    assert_eq!(status, 201, "{branch}");
    assert_eq!(branch["name"], "fix");
    assert_eq!(branch["can_push"], true);
    let (status, body) = post(
        &r.server,
        &r.path("/branches"),
        &r.developer,
        json!({ "branch": "fix", "ref": "main" }),
    )
    .await;
    assert_eq!(
        (status, body),
        (400, json!({ "message": "Branch already exists" }))
    );
    let (status, body) = post(
        &r.server,
        &r.path("/branches"),
        &r.developer,
        json!({ "branch": "x", "ref": "nope" }),
    )
    .await;
    assert_eq!(
        (status, body),
        (400, json!({ "message": "Invalid reference name: nope" }))
    );
    let (status, body) = post(
        &r.server,
        &r.path("/branches"),
        &r.developer,
        json!({ "branch": "a..b", "ref": "main" }),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = post(
        &r.server,
        &r.path("/branches"),
        &r.reporter,
        json!({ "branch": "r", "ref": "main" }),
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = delete(&r.server, &r.path("/branches/main"), &r.maintainer).await;
    assert_eq!(
        (status, body),
        (405, json!({ "message": "Cannot remove HEAD branch" }))
    );
    let (status, _) = delete(&r.server, &r.path("/branches/fix"), &r.developer).await;
    assert_eq!(status, 204);
    let (status, body) = get(&r.server, &r.path("/branches/fix"), &r.developer).await;
    assert_eq!(
        (status, body),
        (404, json!({ "message": "404 Branch Not Found" }))
    );
    // Four API writes so far (3 commits, a branch created and deleted): each recorded.
    let pushes = r.fx.id("SELECT count(*) FROM repository_pushes", &[]).await;
    assert_eq!(pushes, 5);
}

#[tokio::test]
async fn bad_input_gets_gitlabs_answers_and_never_leaves_the_repository() {
    let r = repo_with(&[("DUO_REPOSITORY_MAX_BLOB_BYTES", "1000")]).await;
    r.history().await;
    let big = "x".repeat(2000);
    let (status, _) = post(
        &r.server,
        &r.path("/files/big.txt"),
        &r.maintainer,
        json!({ "branch": "main", "content": big, "commit_message": "big" }),
    )
    .await;
    assert_eq!(status, 201);
    // A tag with a branch's name makes that name ambiguous.
    let git = GitClient::new();
    let url = clone_url(&r.server.base, "acme/website", Some(&r.maintainer));
    git.ok("", &["clone", "-q", &url, "w"]).await;
    git.ok("w", &["tag", "feature", "main"]).await;
    git.ok("w", &["push", "-q", "origin", "feature"]).await;

    let not_found = |what: &str| json!({ "message": format!("404 {what} Not Found") });
    let table: Vec<(&str, u16, Value)> = vec![
        (
            "/files/..%2F..%2Fetc%2Fpasswd?ref=main",
            400,
            json!({ "message": "path must not contain .." }),
        ),
        (
            "/files/src%2F..%2F..%2Fx?ref=main",
            400,
            json!({ "message": "path must not contain .." }),
        ),
        ("/files/%2Fetc%2Fpasswd?ref=main", 404, not_found("File")),
        (
            "/files/a%00b?ref=main",
            400,
            json!({ "error": "path contains a NUL character" }),
        ),
        (
            "/files/README.md",
            400,
            json!({ "error": "ref is missing" }),
        ),
        ("/files/README.md?ref=nope", 404, not_found("File")),
        ("/files/src?ref=main", 404, not_found("File")),
        ("/files/missing.txt?ref=main", 404, not_found("File")),
        (
            "/files/big.txt?ref=main",
            400,
            json!({ "message": "the file is larger than 1000 bytes" }),
        ),
        (
            "/files/README.md?ref=feature",
            400,
            json!({ "message": "feature is ambiguous: it names a branch and a tag" }),
        ),
        ("/tree?ref=nope", 404, not_found("Tree")),
        (
            "/tree?path=..",
            400,
            json!({ "message": "path must not contain .." }),
        ),
        ("/tree?path=README.md", 404, not_found("Tree")),
        (
            "/blobs/0123456789012345678901234567890123456789",
            404,
            not_found("Blob"),
        ),
        ("/blobs/not-a-sha", 404, not_found("Blob")),
        ("/commits/deadbeef00", 404, not_found("Commit")),
        ("/commits/main~1", 404, not_found("Commit")),
        (
            "/compare?from=main",
            400,
            json!({ "error": "to is missing" }),
        ),
        ("/compare?from=main&to=nope", 404, not_found("Ref")),
    ];
    let mut wrong = Vec::new();
    for (path, status, body) in &table {
        let (got_status, got_body) = get(&r.server, &r.path(path), &r.reporter).await;
        if (got_status, &got_body) != (*status, body) {
            wrong.push(format!("{path}: {got_status} {got_body}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");

    // Writes: existing and missing files, paths into .git, roles.
    let write =
        |content: &str| json!({ "branch": "main", "content": content, "commit_message": "m" });
    let cases: Vec<(&str, &str, &String, u16, Value)> = vec![
        (
            "POST",
            "/files/README.md",
            &r.maintainer,
            400,
            json!({ "message": "A file with this name already exists" }),
        ),
        (
            "PUT",
            "/files/nope.md",
            &r.maintainer,
            400,
            json!({ "message": "A file with this name doesn't exist" }),
        ),
        (
            "POST",
            "/files/.git%2Fconfig",
            &r.maintainer,
            400,
            json!({ "message": "file_path must not name .git" }),
        ),
        (
            "POST",
            "/files/new.md",
            &r.reporter,
            403,
            json!({ "message": "403 Forbidden - You are not allowed to push into this branch" }),
        ),
        (
            "POST",
            "/files/new.md",
            &r.stranger,
            404,
            not_found("Project"),
        ),
    ];
    for (method, path, token, status, body) in cases {
        let (got_status, got_body) = match method {
            "POST" => post(&r.server, &r.path(path), token, write("x")).await,
            _ => put(&r.server, &r.path(path), token, write("x")).await,
        };
        assert_eq!((got_status, &got_body), (status, &body), "{method} {path}");
    }
    let (status, body) = post(
        &r.server,
        &r.path("/files/new.md"),
        &r.maintainer,
        json!({ "content": "x", "commit_message": "m" }),
    )
    .await;
    assert_eq!(
        (status, body),
        (400, json!({ "error": "branch is missing" }))
    );

    // Protected default branch: developers write elsewhere only.
    r.fx.exec(
        "UPDATE projects SET protect_default_branch = true WHERE id = $1",
        &[&r.project],
    )
    .await;
    let (status, _) = post(
        &r.server,
        &r.path("/files/new.md"),
        &r.developer,
        write("x"),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = post(
        &r.server,
        &r.path("/files/new.md"),
        &r.developer,
        json!({ "branch": "topic", "start_branch": "main", "content": "x", "commit_message": "m" }),
    )
    .await;
    assert_eq!(status, 201);
}

#[tokio::test]
async fn racing_commits_on_one_branch_lose_nothing() {
    let r = repo().await;
    r.history().await;
    let mut tasks = Vec::new();
    for n in 0..8 {
        let url = r.server.url(&format!(
            "/api/v4{}",
            r.path(&format!("/files/race-{n}.txt"))
        ));
        let token = r.developer.clone();
        tasks.push(tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&json!({ "branch": "main", "content": format!("{n}\n"), "commit_message": format!("race {n}") }))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let mut won = Vec::new();
    for (n, task) in tasks.into_iter().enumerate() {
        let status = task.await.unwrap();
        assert!(status == 201 || status == 400, "race {n}: {status}");
        if status == 201 {
            won.push(n);
        }
    }
    assert!(!won.is_empty());
    // Every commit that was acknowledged is in the branch's history with its file.
    let (_, tree) = get(&r.server, &r.path("/tree?per_page=100"), &r.developer).await;
    let names: Vec<&str> = tree
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for n in &won {
        assert!(
            names.contains(&format!("race-{n}.txt").as_str()),
            "race {n} lost: {names:?}"
        );
    }
    let (_, commits) = get(&r.server, &r.path("/commits?per_page=100"), &r.developer).await;
    assert_eq!(commits.as_array().unwrap().len(), 2 + won.len());
}
