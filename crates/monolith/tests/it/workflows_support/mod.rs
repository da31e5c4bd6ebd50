//! What the Duo Workflow tests share: an instance where a developer with a
//! Duo Enterprise seat may run workflows in `acme/app`, a server whose
//! workflow service is a test gRPC server, and small REST helpers.
// Test support panics on failures by design; not every test uses every helper.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fake_service;

use monolith::config::Realm;
use monolith::policy::Actor;
use serde_json::{Value, json};

use crate::rest_support;
use crate::support::{Fx, Server};

pub struct World {
    pub fx: Fx,
    pub server: Server,
    pub group: i64,
    pub project: i64,
    /// Developer with a seat: may run workflows.
    pub dev: Actor,
    pub dev_token: String,
    /// Another developer with a seat.
    pub other: Actor,
    pub other_token: String,
    pub admin: Actor,
    pub admin_token: String,
    pub service: Option<fake_service::FakeService>,
}

pub struct Setup {
    pub fx: Fx,
    pub group: i64,
    pub project: i64,
    pub dev: Actor,
    pub other: Actor,
    pub admin: Actor,
}

/// The database side of the world, before a server starts.
pub async fn setup() -> Setup {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    let project = fx.project(group, "app", "private").await;
    let dev = fx.user("dev").await;
    let other = fx.user("other").await;
    let admin = fx.admin("root").await;
    for user in [dev, other] {
        fx.project_member(project, user, 30).await;
        fx.seat(user, "duo_enterprise", false).await;
    }
    fx.seat(admin, "duo_enterprise", false).await;
    Setup {
        fx,
        group,
        project,
        dev,
        other,
        admin,
    }
}

impl Setup {
    /// Starts the server; with `service`, a fake workflow service it talks to.
    pub async fn start(
        self,
        service: Option<fake_service::FakeService>,
        extra: &[(&str, &str)],
    ) -> World {
        let mut settings: Vec<(&str, String)> =
            extra.iter().map(|(k, v)| (*k, v.to_string())).collect();
        if let Some(s) = &service {
            settings.push(("DUO_WORKFLOW_SERVICE_URL", s.url.clone()));
        } else {
            // Nothing listens there: calls to the service fail fast.
            settings.push(("DUO_WORKFLOW_SERVICE_URL", "http://127.0.0.1:9".into()));
        }
        settings.push(("DUO_WORKFLOW_SERVICE_TIMEOUT_SECS", "5".into()));
        let pairs: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let server = Server::start_with_settings(&self.fx, self.fx.pool.clone(), &pairs).await;
        let dev_token = self.fx.token(self.dev, &["api"]).await;
        let other_token = self.fx.token(self.other, &["api"]).await;
        let admin_token = self.fx.token(self.admin, &["api"]).await;
        World {
            server,
            group: self.group,
            project: self.project,
            dev: self.dev,
            dev_token,
            other: self.other,
            other_token,
            admin: self.admin,
            admin_token,
            fx: self.fx,
            service,
        }
    }
}

pub async fn world() -> World {
    setup().await.start(None, &[]).await
}

impl World {
    /// Creates a workflow in the project as `token`'s owner; returns its id.
    pub async fn workflow(&self, token: &str, extra: Value) -> i64 {
        let mut body = json!({ "project_id": self.project, "goal": "Add a line to README" });
        if let (Some(obj), Some(more)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in more {
                obj.insert(k.clone(), v.clone());
            }
        }
        let (status, created) =
            rest_support::post(&self.server, "/ai/duo_workflows/workflows", token, body).await;
        assert_eq!(status, 201, "{created}");
        created["id"].as_i64().unwrap()
    }

    /// Sets the workflow's status directly (test setup only).
    pub async fn set_status(&self, id: i64, status: i16) {
        self.fx
            .exec(
                "UPDATE duo_workflows_workflows SET status = $2 WHERE id = $1",
                &[&id, &status],
            )
            .await;
    }

    pub async fn status_of(&self, id: i64) -> i16 {
        let c = self.fx.pool.get().await.unwrap();
        c.query_one(
            "SELECT status FROM duo_workflows_workflows WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
    }

    /// An `ai_workflows` token for `user`, minted as direct_access does.
    pub async fn workflow_token(&self, user: Actor) -> String {
        let c = self.fx.pool.get().await.unwrap();
        monolith::identity::oauth::mint(
            &**c,
            user.id,
            monolith::identity::oauth::USER_TOKEN_LIFETIME,
        )
        .await
        .unwrap()
        .token
    }

    /// Posts a checkpoint `{thread_ts, parent_ts, checkpoint, metadata}`.
    pub async fn checkpoint(
        &self,
        token: &str,
        id: i64,
        ts: &str,
        parent: Option<&str>,
    ) -> (u16, Value) {
        rest_support::post(
            &self.server,
            &format!("/ai/duo_workflows/workflows/{id}/checkpoints"),
            token,
            json!({
                "thread_ts": ts,
                "parent_ts": parent,
                "checkpoint": { "v": 1, "id": ts, "ts": "2026-01-01T00:00:00+00:00", "channel_values": { "status": "Execution" } },
                "metadata": { "source": "loop", "step": 1 },
            }),
        )
        .await
    }
}
