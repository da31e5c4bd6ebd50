//! `duo-monolith seed`: a small, realistic demo instance. Running it again changes
//! nothing but the printed tokens (each run revokes the previous seed tokens and
//! prints fresh ones, because only digests are stored).

use crate::queries::Queries;
use deadpool_postgres::Pool;
use serde::Serialize;

use crate::db::DbError;
use crate::identity::tokens::{self, TokenError};
use crate::repositories::{Repositories, RepositoryError};

mod repositories;

#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("setting a password failed: {0}")]
    Password(String),
    #[error("rendering the report failed: {0}")]
    Render(#[from] serde_json::Error),
    #[error("seeding a repository failed: {0}")]
    Repository(#[from] RepositoryError),
    #[error("recording the seeded commits failed: {0}")]
    Queue(#[from] job_queue::QueueError),
}

impl From<tokio_postgres::Error> for SeedError {
    fn from(e: tokio_postgres::Error) -> Self {
        SeedError::Db(DbError::Query(e))
    }
}

impl From<deadpool_postgres::PoolError> for SeedError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        SeedError::Db(DbError::Checkout(e))
    }
}

#[derive(Debug, Serialize)]
pub struct SeededUser {
    pub username: String,
    pub token: String,
    /// Password for the web pages.
    pub password: String,
    pub admin: bool,
    pub duo_seat: Option<&'static str>,
    pub note: &'static str,
}

#[derive(Debug, Serialize)]
pub struct SeedReport {
    pub users: Vec<SeededUser>,
}

impl SeedReport {
    pub fn to_json(&self) -> Result<String, SeedError> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    pub fn to_text(&self) -> String {
        let mut out =
            String::from("Demo instance ready. Users (web password, personal access token):\n");
        for u in &self.users {
            let seat = u.duo_seat.unwrap_or("no Duo seat");
            out.push_str(&format!(
                "  {:<8} {}  {}  ({seat}; {})\n",
                u.username, u.password, u.token, u.note
            ));
        }
        out
    }
}

struct DemoUser {
    username: &'static str,
    name: &'static str,
    admin: bool,
    seat: Option<&'static str>,
    note: &'static str,
}

const USERS: &[DemoUser] = &[
    DemoUser {
        username: "root",
        name: "Administrator",
        admin: true,
        seat: Some("duo_enterprise"),
        note: "instance admin",
    },
    DemoUser {
        username: "alice",
        name: "Alice Owner",
        admin: false,
        seat: Some("duo_enterprise"),
        note: "owner of group acme",
    },
    DemoUser {
        username: "bob",
        name: "Bob Developer",
        admin: false,
        seat: Some("duo_pro"),
        note: "developer in acme/platform",
    },
    DemoUser {
        username: "carol",
        name: "Carol Guest",
        admin: false,
        seat: None,
        note: "guest in acme, no seat: chat is refused (M3004)",
    },
    DemoUser {
        username: "dave",
        name: "Dave Outsider",
        admin: false,
        seat: Some("duo_pro"),
        note: "no memberships; sees public projects only",
    },
];

async fn upsert_user(db: &impl Queries, u: &DemoUser) -> Result<i64, SeedError> {
    let row = db
        .query_one(
            "INSERT INTO users (username, name, email, admin) VALUES ($1, $2, $3, $4)
             ON CONFLICT (username) DO UPDATE SET name = EXCLUDED.name, admin = EXCLUDED.admin, state = 'active'
             RETURNING id",
            &[&u.username, &u.name, &format!("{}@example.com", u.username), &u.admin],
        )
        .await?;
    Ok(row.get(0))
}

#[allow(clippy::too_many_arguments)]
async fn upsert_group(
    db: &impl Queries,
    parent: Option<i64>,
    path: &str,
    name: &str,
    visibility: &str,
    plan: &str,
    experiments: bool,
) -> Result<i64, SeedError> {
    let existing = db
        .query_opt(
            "SELECT id FROM groups WHERE coalesce(parent_id, 0) = coalesce($1::bigint, 0) AND path = $2",
            &[&parent, &path],
        )
        .await?;
    if let Some(row) = existing {
        return Ok(row.get(0));
    }
    let row = db
        .query_one(
            "INSERT INTO groups (parent_id, path, name, visibility, plan, experiment_and_beta_features)
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
            &[&parent, &path, &name, &visibility, &plan, &experiments],
        )
        .await?;
    Ok(row.get(0))
}

async fn upsert_project(
    db: &impl Queries,
    group: i64,
    path: &str,
    name: &str,
    visibility: &str,
) -> Result<i64, SeedError> {
    let row = db
        .query_one(
            "INSERT INTO projects (group_id, path, name, visibility, description) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (group_id, path) DO UPDATE SET name = EXCLUDED.name RETURNING id",
            &[&group, &path, &name, &visibility, &format!("Demo project {name}")],
        )
        .await?;
    Ok(row.get(0))
}

async fn member(
    db: &impl Queries,
    table: &str,
    source: i64,
    user: i64,
    level: i32,
) -> Result<(), SeedError> {
    let sql = if table == "group" {
        "INSERT INTO group_members (group_id, user_id, access_level) VALUES ($1, $2, $3)
         ON CONFLICT (group_id, user_id) DO UPDATE SET access_level = EXCLUDED.access_level"
    } else {
        "INSERT INTO project_members (project_id, user_id, access_level) VALUES ($1, $2, $3)
         ON CONFLICT (project_id, user_id) DO UPDATE SET access_level = EXCLUDED.access_level"
    };
    db.execute(sql, &[&source, &user, &level]).await?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn issue(
    db: &impl Queries,
    project: i64,
    iid: i32,
    title: &str,
    description: &str,
    author: i64,
    confidential: bool,
    labels: &[&str],
) -> Result<i64, SeedError> {
    let labels: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
    let row = db
        .query_one(
            "INSERT INTO issues (project_id, iid, title, description, author_id, confidential, labels)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (project_id, iid) DO UPDATE SET title = EXCLUDED.title RETURNING id",
            &[&project, &iid, &title, &description, &author, &confidential, &labels],
        )
        .await?;
    Ok(row.get(0))
}

/// Loads the demo data and returns fresh tokens for every demo user.
pub async fn run(pool: &Pool, repos: &Repositories) -> Result<SeedReport, SeedError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute(
        "UPDATE instance_settings SET instance_tier = 'ultimate', duo_features_enabled = true",
        &[],
    )
    .await?;

    let mut ids = Vec::new();
    for u in USERS {
        ids.push(upsert_user(&tx, u).await?);
    }
    let (root, alice, bob, carol) = (ids[0], ids[1], ids[2], ids[3]);

    let acme = upsert_group(&tx, None, "acme", "Acme", "private", "ultimate", true).await?;
    let platform = upsert_group(
        &tx,
        Some(acme),
        "platform",
        "Platform",
        "private",
        "free",
        false,
    )
    .await?;
    let hobby = upsert_group(&tx, None, "hobby", "Hobby", "public", "free", false).await?;
    member(&tx, "group", acme, alice, 50).await?;
    member(&tx, "group", platform, bob, 30).await?;
    member(&tx, "group", acme, carol, 10).await?;
    member(&tx, "group", hobby, root, 50).await?;
    // The Duo service account that workflows the product runs act as, on
    // behalf of their user (a developer where the demo projects live).
    let duo: i64 = tx
        .query_one(
            "INSERT INTO users (username, name, email, service_account)
             VALUES ('duo-developer', 'GitLab Duo', 'duo-developer@noreply.localhost', true)
             ON CONFLICT (username) DO UPDATE SET service_account = true, state = 'active'
             RETURNING id",
            &[],
        )
        .await?
        .get(0);
    member(&tx, "group", acme, duo, 30).await?;
    member(&tx, "group", hobby, duo, 30).await?;
    tx.execute(
        "UPDATE instance_settings SET duo_workflow_service_account_id = $1",
        &[&duo],
    )
    .await?;

    let api = upsert_project(&tx, platform, "api", "API", "private").await?;
    let website = upsert_project(&tx, acme, "website", "Website", "public").await?;
    let notes_app = upsert_project(&tx, hobby, "notes", "Notes", "public").await?;

    let login = issue(&tx, api, 1, "Login fails with expired sessions", "Users with a session older than 30 days get a 500 on login.\n\nSteps:\n1. Sign in\n2. Wait\n3. Reload", bob, false, &["bug", "auth"]).await?;
    issue(
        &tx,
        api,
        2,
        "Security: token leak in debug logs",
        "The request logger prints the Authorization header at DEBUG level.",
        alice,
        true,
        &["security"],
    )
    .await?;
    issue(
        &tx,
        website,
        1,
        "Update the pricing page",
        "The pricing table still shows last year's plans.",
        alice,
        false,
        &["content"],
    )
    .await?;
    issue(
        &tx,
        notes_app,
        1,
        "Add dark mode",
        "Follow the system preference.",
        root,
        false,
        &["feature"],
    )
    .await?;
    tx.execute(
        "INSERT INTO issue_assignees (issue_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        &[&login, &bob],
    )
    .await?;

    tx.execute(
        "INSERT INTO epics (group_id, iid, title, description, author_id) VALUES ($1, 1, 'Single sign-on', 'Support SAML and OIDC sign-in for every product.', $2)
         ON CONFLICT (group_id, iid) DO NOTHING",
        &[&acme, &alice],
    )
    .await?;
    // The code, then the merge request between its two branches.
    for (project, update) in repositories::seed(repos, api, website, notes_app).await? {
        crate::repositories::pushes::record(&tx, project, None, &[update]).await?;
    }
    tx.execute(
        "INSERT INTO merge_requests (project_id, iid, title, description, author_id, source_branch, diff)
         VALUES ($1, 1, 'Refresh expired sessions instead of failing', 'Fixes #1 by refreshing the session on login.', $2, 'fix-session-refresh',
                 E'--- a/src/session.rs\\n+++ b/src/session.rs\\n@@ -10,3 +10,6 @@\\n-    return Err(Expired);\\n+    if session.expired() {\\n+        return session.refresh();\\n+    }\\n')
         ON CONFLICT (project_id, iid) DO NOTHING",
        &[&api, &bob],
    )
    .await?;
    let has_pipeline = tx
        .query_opt(
            "SELECT 1 FROM ci_pipelines WHERE project_id = $1 LIMIT 1",
            &[&api],
        )
        .await?
        .is_some();
    if !has_pipeline {
        let pipeline: i64 = tx
            .query_one(
                "INSERT INTO ci_pipelines (project_id, ref, sha, status) VALUES ($1, 'main', 'a1b2c3d4', 'failed') RETURNING id",
                &[&api],
            )
            .await?
            .get(0);
        tx.execute(
            "INSERT INTO ci_builds (project_id, pipeline_id, name, stage, status, log, finished_at) VALUES
             ($1, $2, 'build', 'build', 'success', 'Compiling api v0.1.0\nFinished release', now()),
             ($1, $2, 'rspec', 'test', 'failed', E'Running tests\\n  1) Session#refresh refreshes an expired session\\n     Failure/Error: expected 200, got 500\\nERROR: Job failed: exit code 1', now())",
            &[&api, &pipeline],
        )
        .await?;
    }
    let has_note = tx
        .query_opt(
            "SELECT 1 FROM notes WHERE noteable_type = 'Issue' AND noteable_id = $1 LIMIT 1",
            &[&login],
        )
        .await?
        .is_some();
    if !has_note {
        tx.execute(
            "INSERT INTO notes (noteable_type, noteable_id, author_id, body) VALUES
             ('Issue', $1, $2, 'I can reproduce this on staging.'),
             ('Issue', $1, $3, 'Root cause is in the session middleware.')",
            &[&login, &alice, &bob],
        )
        .await?;
    }

    // Self-managed style purchases (instance-wide); on GitLab.com they belong to acme.
    let mut report = SeedReport { users: Vec::new() };
    for (u, id) in USERS.iter().zip(&ids) {
        if let Some(add_on) = u.seat {
            let purchase: i64 = match tx
                .query_opt("SELECT id FROM add_on_purchases WHERE add_on = $1 ORDER BY id LIMIT 1", &[&add_on])
                .await?
            {
                Some(r) => r.get(0),
                None => tx
                    .query_one(
                        "INSERT INTO add_on_purchases (add_on, quantity, expires_on) VALUES ($1, 50, current_date + 365) RETURNING id",
                        &[&add_on],
                    )
                    .await?
                    .get(0),
            };
            tx.execute(
                "INSERT INTO add_on_seat_assignments (purchase_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&purchase, id],
            )
            .await?;
        }
        tx.execute(
            "UPDATE personal_access_tokens SET revoked = true WHERE user_id = $1 AND name = 'seed'",
            &[id],
        )
        .await?;
        let scopes = vec!["api".to_string(), "ai_features".to_string()];
        let token = tokens::create(&tx, *id, "seed", &scopes, None).await?;
        // A fresh password each run, like the tokens: a demo instance never has
        // a password anyone could guess from the source.
        let password = format!("duo-{}", crate::identity::sessions::random_secret(6));
        let hashed = crate::identity::passwords::hash(&password)
            .map_err(|e| SeedError::Password(e.to_string()))?;
        tx.execute(
            "UPDATE users SET encrypted_password = $2 WHERE id = $1",
            &[id, &hashed],
        )
        .await?;
        crate::identity::sessions::destroy_all_for_user(&tx, *id).await?;
        report.users.push(SeededUser {
            username: u.username.to_string(),
            token: token.token,
            password,
            admin: u.admin,
            duo_seat: u.seat,
            note: u.note,
        });
    }
    tx.commit().await?;
    Ok(report)
}
