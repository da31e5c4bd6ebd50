//! Git over smart HTTP against a running monolith, with the real `git` client:
//! who may clone and push (every role and visibility, anonymous, blocked, bad
//! tokens, wrong scopes), what a push records and enqueues, and branch
//! protection.

use base64::Engine as _;
use monolith::policy::{Actor, access};

use crate::git_support::{GitClient, clone_url, write};
use crate::support::{Fx, Server};

struct World {
    fx: Fx,
    server: Server,
    tokens: std::collections::HashMap<&'static str, String>,
}

impl World {
    async fn new() -> World {
        let fx = Fx::new().await;
        let server = Server::start(&fx).await;
        let acme = fx.group(None, "acme", "public", "ultimate").await;
        fx.project(acme, "pub", "public").await;
        fx.project(acme, "int", "internal").await;
        let private = fx.project(acme, "priv", "private").await;
        let mut tokens = std::collections::HashMap::new();
        let both = ["read_repository", "write_repository"];
        let admin = fx.admin("root").await;
        tokens.insert("admin", fx.token(admin, &both).await);
        let maintainer = fx.user("maintainer").await;
        fx.group_member(acme, maintainer, access::MAINTAINER).await;
        tokens.insert("maintainer", fx.token(maintainer, &both).await);
        let members: [(&'static str, i32); 3] = [
            ("developer", access::DEVELOPER),
            ("reporter", access::REPORTER),
            ("guest", access::GUEST),
        ];
        let mut developer = None;
        for (name, level) in members {
            let user = fx.user(name).await;
            fx.project_member(private, user, level).await;
            tokens.insert(name, fx.token(user, &both).await);
            if name == "developer" {
                developer = Some(user);
            }
        }
        let developer: Actor = developer.unwrap();
        tokens.insert("dev_api", fx.token(developer, &["api"]).await);
        tokens.insert("dev_read_api", fx.token(developer, &["read_api"]).await);
        tokens.insert(
            "dev_read_repo",
            fx.token(developer, &["read_repository"]).await,
        );
        let expired = fx.token(developer, &both).await;
        fx.exec(
            "UPDATE personal_access_tokens SET expires_at = current_date - 1 WHERE token_digest = $1",
            &[&monolith::identity::tokens::digest(&expired)],
        )
        .await;
        tokens.insert("dev_expired", expired);
        let revoked = fx.token(developer, &both).await;
        fx.exec(
            "UPDATE personal_access_tokens SET revoked = true WHERE token_digest = $1",
            &[&monolith::identity::tokens::digest(&revoked)],
        )
        .await;
        tokens.insert("dev_revoked", revoked);
        let stranger = fx.user("stranger").await;
        tokens.insert("stranger", fx.token(stranger, &both).await);
        let blocked = fx.user("blocked").await;
        fx.project_member(private, blocked, access::DEVELOPER).await;
        tokens.insert("blocked", fx.token(blocked, &both).await);
        fx.exec(
            "UPDATE users SET state = 'blocked' WHERE id = $1",
            &[&blocked.id],
        )
        .await;
        World { fx, server, tokens }
    }

    fn token(&self, who: &str) -> Option<&str> {
        (who != "anonymous").then(|| self.tokens[who].as_str())
    }

    fn url(&self, who: &str, project: &str) -> String {
        clone_url(
            &self.server.base,
            &format!("acme/{project}"),
            self.token(who),
        )
    }

    async fn count(&self, sql: &str) -> i64 {
        self.fx.id(sql, &[]).await
    }
}

/// The status of `info/refs` for one caller, project and service.
async fn advertisement_status(world: &World, who: &str, project: &str, service: &str) -> u16 {
    let url = world
        .server
        .url(&format!("/acme/{project}.git/info/refs?service={service}"));
    let mut req = reqwest::Client::new().get(url);
    if let Some(token) = world.token(who) {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{who}:{token}"));
        req = req.header("Authorization", format!("Basic {basic}"));
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    if status == 401 {
        assert_eq!(
            res.headers().get("www-authenticate").unwrap(),
            "Basic realm=\"GitLab\"",
            "a 401 must ask git for credentials"
        );
    }
    status
}

#[tokio::test]
async fn every_role_and_visibility_gets_the_policys_answer() {
    let world = World::new().await;
    const UP: &str = "git-upload-pack";
    const RECEIVE: &str = "git-receive-pack";
    let table: &[(&str, &str, &str, u16)] = &[
        // Anonymous: public code only; everything else asks for credentials,
        // a project that does not exist included (no existence leak).
        ("anonymous", "pub", UP, 200),
        ("anonymous", "int", UP, 401),
        ("anonymous", "priv", UP, 401),
        ("anonymous", "nothing", UP, 401),
        ("anonymous", "pub", RECEIVE, 401),
        // Signed in without membership: public and internal code.
        ("stranger", "pub", UP, 200),
        ("stranger", "int", UP, 200),
        ("stranger", "priv", UP, 404),
        ("stranger", "nothing", UP, 404),
        ("stranger", "pub", RECEIVE, 403),
        // Members of the private project by role.
        ("guest", "priv", UP, 403),
        ("reporter", "priv", UP, 200),
        ("reporter", "priv", RECEIVE, 403),
        ("developer", "priv", UP, 200),
        ("developer", "priv", RECEIVE, 200),
        ("maintainer", "priv", RECEIVE, 200),
        ("admin", "priv", RECEIVE, 200),
        // Refused tokens and users.
        ("blocked", "priv", UP, 403),
        ("blocked", "pub", UP, 403),
        ("dev_expired", "priv", UP, 401),
        ("dev_revoked", "priv", UP, 401),
        ("dev_read_api", "priv", UP, 403),
        ("dev_read_repo", "priv", UP, 200),
        ("dev_read_repo", "priv", RECEIVE, 403),
        ("dev_api", "priv", RECEIVE, 200),
    ];
    let mut wrong = Vec::new();
    for (who, project, service, expected) in table {
        let got = advertisement_status(&world, who, project, service).await;
        if got != *expected {
            wrong.push(format!(
                "{who} {project} {service}: {got}, expected {expected}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[tokio::test]
async fn clone_push_and_fetch_with_git_record_each_push_once() {
    let world = World::new().await;
    let git = GitClient::new();
    git.repo_with(
        "work",
        &[
            ("README.md", "# Private\n"),
            ("src/lib.rs", "pub fn a() {}\n"),
        ],
    )
    .await;
    let dev = world.url("developer", "priv");
    git.ok("work", &["push", "-q", &dev, "main"]).await;
    git.ok("work", &["checkout", "-q", "-b", "feature"]).await;
    write(
        &git.path("work/src/lib.rs"),
        "pub fn a() {}\npub fn b() {}\n",
    );
    git.ok("work", &["commit", "-qam", "Add b"]).await;
    git.ok("work", &["push", "-q", &dev, "feature"]).await;

    // A reporter clones both branches and sees the files.
    git.ok("", &["clone", "-q", &world.url("reporter", "priv"), "copy"])
        .await;
    assert_eq!(
        std::fs::read_to_string(git.path("copy/README.md")).unwrap(),
        "# Private\n"
    );
    let branches = git.ok("copy", &["branch", "-r"]).await;
    assert!(branches.contains("origin/feature"), "{branches}");

    // New work on main reaches the reporter's fetch.
    git.ok("work", &["checkout", "-q", "main"]).await;
    write(&git.path("work/NEWS"), "news\n");
    git.ok("work", &["add", "NEWS"]).await;
    git.ok("work", &["commit", "-qm", "News"]).await;
    git.ok("work", &["push", "-q", &dev, "main"]).await;
    git.ok("copy", &["fetch", "-q", "origin"]).await;
    let log = git.ok("copy", &["log", "--format=%s", "origin/main"]).await;
    assert_eq!(log.lines().next(), Some("News"));

    // The reporter may not push; a stranger and an anonymous caller may not
    // even see it, and git says so.
    write(&git.path("copy/x"), "x\n");
    git.ok("copy", &["add", "x"]).await;
    git.ok("copy", &["commit", "-qm", "x"]).await;
    let refused = git
        .run("copy", &["push", "-q", "origin", "HEAD:main"])
        .await;
    assert!(!refused.ok);
    assert!(refused.stderr.contains("403"), "{}", refused.stderr);
    let hidden = git
        .run("", &["clone", "-q", &world.url("stranger", "priv"), "s"])
        .await;
    assert!(!hidden.ok);
    assert!(hidden.stderr.contains("not found"), "{}", hidden.stderr);
    let anonymous = git
        .run("", &["clone", "-q", &world.url("anonymous", "priv"), "a"])
        .await;
    assert!(!anonymous.ok);
    assert!(
        anonymous.stderr.contains("Authentication failed")
            || anonymous.stderr.contains("could not read Username"),
        "{}",
        anonymous.stderr
    );

    // Three accepted pushes, one ref each; the refused one left nothing.
    let pushes = world
        .fx
        .pool
        .get()
        .await
        .unwrap()
        .query(
            "SELECT ref, before_sha, after_sha, u.username FROM repository_pushes p
             JOIN users u ON u.id = p.pusher_id ORDER BY p.id",
            &[],
        )
        .await
        .unwrap();
    let summary: Vec<(String, bool, String)> = pushes
        .iter()
        .map(|r| {
            (
                r.get::<_, String>(0),
                r.get::<_, String>(1).chars().all(|c| c == '0'),
                r.get::<_, String>(3),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("refs/heads/main".into(), true, "developer".into()),
            ("refs/heads/feature".into(), true, "developer".into()),
            ("refs/heads/main".into(), false, "developer".into()),
        ]
    );
    let head = git.ok("work", &["rev-parse", "main"]).await;
    assert_eq!(pushes[2].get::<_, String>(2), head.trim());
    // No worker ran: the three pushes left one pending job for the project.
    assert_eq!(
        world
            .count("SELECT count(*) FROM background_jobs WHERE kind = 'repository_pushed' AND state = 'pending'")
            .await,
        1
    );
}

#[tokio::test]
async fn a_protected_default_branch_takes_a_maintainer() {
    let world = World::new().await;
    world
        .fx
        .exec(
            "UPDATE projects SET protect_default_branch = true WHERE path = 'priv'",
            &[],
        )
        .await;
    let git = GitClient::new();
    git.repo_with("work", &[("a.txt", "a\n")]).await;
    let refused = git
        .run(
            "work",
            &["push", "-q", &world.url("developer", "priv"), "main"],
        )
        .await;
    assert!(!refused.ok);
    assert!(
        refused
            .stderr
            .contains("You are not allowed to push code to protected branches"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        world.count("SELECT count(*) FROM repository_pushes").await,
        0
    );
    assert_eq!(
        world
            .count("SELECT count(*) FROM background_jobs WHERE kind = 'repository_pushed'")
            .await,
        0
    );
    git.ok(
        "work",
        &["push", "-q", &world.url("developer", "priv"), "main:topic"],
    )
    .await;
    git.ok(
        "work",
        &["push", "-q", &world.url("maintainer", "priv"), "main"],
    )
    .await;
    let refs: Vec<String> = world
        .fx
        .pool
        .get()
        .await
        .unwrap()
        .query("SELECT ref FROM repository_pushes ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(refs, vec!["refs/heads/topic", "refs/heads/main"]);
}

#[tokio::test]
async fn a_burst_of_pushes_leaves_one_pending_job() {
    let world = World::new().await;
    let git = GitClient::new();
    git.repo_with("work", &[("n", "0\n")]).await;
    let dev = world.url("developer", "priv");
    for n in 1..=5 {
        write(&git.path("work/n"), &format!("{n}\n"));
        git.ok("work", &["commit", "-qam", &format!("n = {n}")])
            .await;
        git.ok("work", &["push", "-q", &dev, "main"]).await;
    }
    assert_eq!(
        world.count("SELECT count(*) FROM repository_pushes").await,
        5
    );
    assert_eq!(
        world
            .count("SELECT count(*) FROM background_jobs WHERE kind = 'repository_pushed'")
            .await,
        1
    );
}

#[tokio::test]
async fn deleting_a_project_removes_its_repository_and_renaming_keeps_history() {
    let world = World::new().await;
    let git = GitClient::new();
    git.repo_with("work", &[("a.txt", "a\n")]).await;
    git.ok(
        "work",
        &["push", "-q", &world.url("maintainer", "priv"), "main"],
    )
    .await;
    let project: i64 = world
        .fx
        .id("SELECT id FROM projects WHERE path = 'priv'", &[])
        .await;
    let on_disk = world
        .server
        .repositories
        .join(monolith::repositories::Repositories::relative_path(project));
    assert!(on_disk.join("HEAD").exists());

    // An owner renames the project: the new URL clones the same history.
    let admin = world.tokens["admin"].clone();
    let api_token = world
        .fx
        .token(
            Actor::user(
                world
                    .fx
                    .id("SELECT id FROM users WHERE username = 'root'", &[])
                    .await,
                true,
            ),
            &["api"],
        )
        .await;
    let client = reqwest::Client::new();
    let renamed = client
        .put(world.server.url(&format!("/api/v4/projects/{project}")))
        .bearer_auth(&api_token)
        .json(&serde_json::json!({ "path": "renamed" }))
        .send()
        .await
        .unwrap();
    assert_eq!(renamed.status(), 200);
    let body: serde_json::Value = renamed.json().await.unwrap();
    assert!(
        body["http_url_to_repo"]
            .as_str()
            .unwrap()
            .ends_with("/acme/renamed.git"),
        "{body}"
    );
    assert_eq!(body["empty_repo"], false);
    git.ok(
        "",
        &[
            "clone",
            "-q",
            &clone_url(&world.server.base, "acme/renamed", Some(&admin)),
            "again",
        ],
    )
    .await;
    assert_eq!(
        git.ok("again", &["log", "--format=%s"]).await.trim(),
        "First commit"
    );

    let deleted = client
        .delete(world.server.url(&format!("/api/v4/projects/{project}")))
        .bearer_auth(&api_token)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 202);
    assert!(
        !on_disk.exists(),
        "the repository directory must go with the project"
    );
}
