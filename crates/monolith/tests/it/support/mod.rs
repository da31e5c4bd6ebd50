//! Shared fixtures: a fresh, migrated database per test (cloned from a template by
//! `devdb`) and small builders for users, groups, projects and resources.
// Test support panics on setup failures by design; not every test binary uses every helper.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod chaos_proxy;

use std::sync::Arc;

use deadpool_postgres::Pool;
use monolith::config::Realm;
use monolith::policy::add_ons::AddOnCatalogue;
use monolith::policy::{Actor, Policy};

pub struct Fx {
    pub pool: Pool,
    pub db: devdb::TestDb,
}

impl Fx {
    pub async fn new() -> Fx {
        let key = monolith::db::migrations_fingerprint();
        let db = devdb::TestDb::new(&key, |url: String| async move {
            let pool = monolith::db::pool_for_url(&url, 1)?;
            monolith::db::migrate(&pool).await.map(|_| ())
        })
        .await
        .expect("test database");
        let pool = db.pool(8).expect("pool");
        Fx { pool, db }
    }

    pub fn policy(&self) -> Policy {
        Policy::new(Arc::new(AddOnCatalogue::built_in().unwrap()))
    }

    pub async fn exec(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) {
        let c = self.pool.get().await.unwrap();
        c.execute(sql, params).await.unwrap();
    }

    pub async fn id(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> i64 {
        let c = self.pool.get().await.unwrap();
        c.query_one(sql, params).await.unwrap().get(0)
    }

    pub async fn instance(&self, realm: Realm, tier: &str, duo_enabled: bool) {
        self.exec(
            "UPDATE instance_settings SET realm = $1, instance_tier = $2, duo_features_enabled = $3",
            &[&realm.as_str(), &tier, &duo_enabled],
        )
        .await;
    }

    pub async fn user(&self, username: &str) -> Actor {
        self.user_with(username, false).await
    }

    pub async fn admin(&self, username: &str) -> Actor {
        self.user_with(username, true).await
    }

    async fn user_with(&self, username: &str, admin: bool) -> Actor {
        let id = self
            .id(
                "INSERT INTO users (username, name, email, admin) VALUES ($1, $1, $1 || '@example.com', $2) RETURNING id",
                &[&username, &admin],
            )
            .await;
        Actor::user(id, admin)
    }

    pub async fn group(
        &self,
        parent: Option<i64>,
        path: &str,
        visibility: &str,
        plan: &str,
    ) -> i64 {
        self.id(
            "INSERT INTO groups (parent_id, path, name, visibility, plan) VALUES ($1, $2, $2, $3, $4) RETURNING id",
            &[&parent, &path, &visibility, &plan],
        )
        .await
    }

    pub async fn group_flag(&self, group: i64, column: &str, value: bool) {
        let sql = match column {
            "duo_features_enabled" => "UPDATE groups SET duo_features_enabled = $2 WHERE id = $1",
            "experiment_and_beta_features" => {
                "UPDATE groups SET experiment_and_beta_features = $2 WHERE id = $1"
            }
            other => panic!("unknown group flag {other}"),
        };
        self.exec(sql, &[&group, &value]).await;
    }

    pub async fn project(&self, group: i64, path: &str, visibility: &str) -> i64 {
        self.id(
            "INSERT INTO projects (group_id, path, name, visibility) VALUES ($1, $2, $2, $3) RETURNING id",
            &[&group, &path, &visibility],
        )
        .await
    }

    pub async fn project_duo(&self, project: i64, enabled: bool) {
        self.exec(
            "UPDATE projects SET duo_features_enabled = $2 WHERE id = $1",
            &[&project, &enabled],
        )
        .await;
    }

    pub async fn group_member(&self, group: i64, user: Actor, level: i32) {
        self.exec(
            "INSERT INTO group_members (group_id, user_id, access_level) VALUES ($1, $2, $3)",
            &[&group, &user.id, &level],
        )
        .await;
    }

    pub async fn project_member(&self, project: i64, user: Actor, level: i32) {
        self.exec(
            "INSERT INTO project_members (project_id, user_id, access_level) VALUES ($1, $2, $3)",
            &[&project, &user.id, &level],
        )
        .await;
    }

    pub async fn issue(&self, project: i64, author: Actor, confidential: bool) -> i64 {
        self.id(
            "INSERT INTO issues (project_id, iid, title, author_id, confidential)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM issues WHERE project_id = $1), 'An issue', $2, $3)
             RETURNING id",
            &[&project, &author.id, &confidential],
        )
        .await
    }

    pub async fn assign(&self, issue: i64, user: Actor) {
        self.exec(
            "INSERT INTO issue_assignees (issue_id, user_id) VALUES ($1, $2)",
            &[&issue, &user.id],
        )
        .await;
    }

    pub async fn epic(&self, group: i64, author: Actor, confidential: bool) -> i64 {
        self.id(
            "INSERT INTO epics (group_id, iid, title, author_id, confidential)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM epics WHERE group_id = $1), 'An epic', $2, $3)
             RETURNING id",
            &[&group, &author.id, &confidential],
        )
        .await
    }

    pub async fn merge_request(&self, project: i64, author: Actor) -> i64 {
        self.id(
            "INSERT INTO merge_requests (project_id, iid, title, author_id, source_branch)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM merge_requests WHERE project_id = $1), 'An MR', $2, 'feature')
             RETURNING id",
            &[&project, &author.id],
        )
        .await
    }

    pub async fn build(&self, project: i64) -> i64 {
        let pipeline = self
            .id(
                "INSERT INTO ci_pipelines (project_id, ref, sha, status) VALUES ($1, 'main', 'abc', 'failed') RETURNING id",
                &[&project],
            )
            .await;
        self.id(
            "INSERT INTO ci_builds (project_id, pipeline_id, name, stage, status, log)
             VALUES ($1, $2, 'test', 'test', 'failed', 'boom') RETURNING id",
            &[&project, &pipeline],
        )
        .await
    }

    pub async fn note(
        &self,
        noteable_type: &str,
        noteable_id: i64,
        author: Actor,
        internal: bool,
    ) -> i64 {
        self.id(
            "INSERT INTO notes (noteable_type, noteable_id, author_id, body, internal) VALUES ($1, $2, $3, 'a note', $4)
             RETURNING id",
            &[&noteable_type, &noteable_id, &author.id, &internal],
        )
        .await
    }

    /// Assigns the user a seat of `add_on` (`duo_pro` / `duo_enterprise`), valid
    /// today unless `expired`.
    pub async fn seat(&self, user: Actor, add_on: &str, expired: bool) {
        let expires = if expired { -1 } else { 30 };
        let purchase = self
            .id(
                "INSERT INTO add_on_purchases (add_on, quantity, started_on, expires_on)
                 VALUES ($1, 10, current_date - 60, current_date + $2::int) RETURNING id",
                &[&add_on, &expires],
            )
            .await;
        self.exec(
            "INSERT INTO add_on_seat_assignments (purchase_id, user_id) VALUES ($1, $2)",
            &[&purchase, &user.id],
        )
        .await;
    }
}

/// A `web` role serving on 127.0.0.1:0 against this fixture's database.
pub struct Server {
    pub base: String,
    handle: actix_web::dev::ServerHandle,
    /// The server's lifecycle: tests begin its stop through it.
    pub lifecycle: monolith::lifecycle::Lifecycle,
    /// Where this server keeps the projects' repositories (removed on drop).
    pub repositories: std::path::PathBuf,
    /// The server's shared state (its live-message hub, for readiness waits).
    pub state: monolith::app_state::AppState,
}

impl Server {
    pub async fn start(fx: &Fx) -> Server {
        Self::start_with_pool(fx, fx.pool.clone()).await
    }

    /// A server whose requests use `pool` (e.g. one reaching the database
    /// through a [`chaos_proxy::ChaosProxy`]).
    pub async fn start_with_pool(fx: &Fx, pool: Pool) -> Server {
        Self::start_with_settings(fx, pool, &[]).await
    }

    /// A server with extra configuration variables.
    pub async fn start_with_settings(fx: &Fx, pool: Pool, settings: &[(&str, &str)]) -> Server {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let url = fx.db.url().to_string();
        // Project ids restart in every test database: each server gets its own
        // repositories directory.
        let repositories = std::env::temp_dir().join(format!(
            "duo-test-repositories-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        let repositories_dir = repositories.display().to_string();
        let config = monolith::config::Config::from_lookup(|k| match k {
            "DATABASE_URL" => Some(url.clone()),
            "DUO_WEB_ADDR" => Some(addr.to_string()),
            "DUO_SIGNING_KEY_DIR" => Some(test_key_dir()),
            "DUO_REPOSITORIES_DIR"
                if !settings.iter().any(|(k, _)| *k == "DUO_REPOSITORIES_DIR") =>
            {
                Some(repositories_dir.clone())
            }
            other => settings
                .iter()
                .find(|(k, _)| *k == other)
                .map(|(_, v)| (*v).to_owned()),
        })
        .unwrap();
        let state =
            monolith::app_state::AppState::new(pool, config, AddOnCatalogue::built_in().unwrap())
                .unwrap();
        let lifecycle = state.lifecycle.clone();
        let shared = state.clone();
        let server = monolith::server::serve(state, listener).unwrap();
        let handle = server.handle();
        tokio::spawn(server);
        Server {
            base: format!("http://{addr}"),
            handle,
            lifecycle,
            repositories,
            state: shared,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.repositories);
        let handle = self.handle.clone();
        // Stopping is asynchronous; the runtime may already be gone at drop time.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { handle.stop(false).await });
        }
    }
}

impl Fx {
    pub async fn token(&self, user: Actor, scopes: &[&str]) -> String {
        let c = self.pool.get().await.unwrap();
        let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
        monolith::identity::tokens::create(&**c, user.id, "test", &scopes, None)
            .await
            .unwrap()
            .token
    }
}

/// One key directory per test process, so RSA keys are generated once.
pub fn test_key_dir() -> String {
    std::env::temp_dir()
        .join(format!("duo-monolith-test-keys-{}", std::process::id()))
        .display()
        .to_string()
}
