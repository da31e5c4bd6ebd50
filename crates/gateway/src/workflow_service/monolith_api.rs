//! The client for the monolith's REST API (`/api/v4`), reached only through
//! the executor (`runHTTPRequest`, with the user's token): the workflow
//! record, status events and checkpoints, and the agents' GitLab tools.

use super::link::{ExecutorLink, LinkError};
use contracts::duo_workflow::{RunHttpRequest, action, action_response};
use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;

/// GitLab calls that answer 5xx are tried this many more times.
const RETRIES: u32 = 3;
const MAX_BACKOFF: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MonolithApiError {
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The executor could not make the request.
    #[error("HTTP action error: {0}")]
    Action(String),
    #[error("GitLab answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("unreadable GitLab answer: {0}")]
    Decode(String),
}

impl MonolithApiError {
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The monolith's own message, for errors shown to callers.
    pub fn message(&self) -> String {
        match self {
            Self::Status { body, .. } => serde_json::from_str::<Value>(body)
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| body.clone()),
            other => other.to_string(),
        }
    }
}

/// An HTTP answer relayed by the executor.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpReply {
    pub status: u16,
    pub body: String,
}

/// `GET /api/v4/ai/duo_workflows/workflows/:id`, the fields the service reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WorkflowRecord {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub project_id: Option<i64>,
    #[serde(default)]
    pub namespace_id: Option<i64>,
    #[serde(default)]
    pub agent_privileges: Vec<i64>,
    #[serde(default)]
    pub pre_approved_agent_privileges: Vec<i64>,
    #[serde(default)]
    pub workflow_definition: Option<String>,
    #[serde(default)]
    pub goal: Option<String>,
    /// Whether the workflow may use tools of MCP servers (the monolith's
    /// instance and group switches).
    #[serde(default)]
    pub mcp_enabled: bool,
}

/// One stored checkpoint as `GET …/checkpoints` lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct StoredCheckpoint {
    pub thread_ts: String,
    #[serde(default)]
    pub parent_ts: Option<String>,
    #[serde(default)]
    pub checkpoint: Value,
}

pub fn workflow_path(id: &str) -> String {
    format!("/api/v4/ai/duo_workflows/workflows/{id}")
}

/// The run lock the monolith gave this run (`POST …/run_lock`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RunLock {
    pub run_id: String,
    pub ttl_seconds: u64,
}

/// The monolith's REST API through one executor link.
#[derive(Clone)]
pub struct MonolithApi {
    link: ExecutorLink,
    retry_base: Duration,
    /// The run lock's id once taken, sent with every write so the monolith
    /// can refuse a run that lost the workflow to another (a zombie).
    run_id: std::sync::Arc<std::sync::OnceLock<String>>,
}

impl MonolithApi {
    pub fn new(link: ExecutorLink, retry_base: Duration) -> Self {
        Self {
            link,
            retry_base,
            run_id: std::sync::Arc::default(),
        }
    }

    /// `path` with this run's `run_id`, once it has one.
    fn as_this_run(&self, path: String) -> String {
        match self.run_id.get() {
            Some(run) => format!("{path}?run_id={run}"),
            None => path,
        }
    }

    /// Takes the workflow's run lock (over from `orphaned`, a lock this
    /// service's previous run of it could not give back): `None` from a
    /// monolith without run locks (404), a 409 error while another run holds
    /// the workflow.
    pub async fn take_run_lock(
        &self,
        id: &str,
        orphaned: Option<&RunLock>,
    ) -> Result<Option<RunLock>, MonolithApiError> {
        let path = match orphaned {
            Some(lock) => format!("{}/run_lock?takeover={}", workflow_path(id), lock.run_id),
            None => format!("{}/run_lock", workflow_path(id)),
        };
        match self.json::<RunLock>("POST", &path, None).await {
            Ok(lock) => {
                let _ = self.run_id.set(lock.run_id.clone());
                Ok(Some(lock))
            }
            Err(err) if err.status() == Some(404) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Extends the lock; `false` once the run lost it.
    pub async fn renew_run_lock(&self, id: &str, lock: &RunLock) -> Result<bool, MonolithApiError> {
        let path = format!("{}/run_lock/{}", workflow_path(id), lock.run_id);
        match self.request("PUT", &path, None).await?.status {
            200..=299 => Ok(true),
            409 => Ok(false),
            status => Err(MonolithApiError::Status {
                status,
                body: String::new(),
            }),
        }
    }

    pub async fn release_run_lock(&self, id: &str, lock: &RunLock) -> Result<(), MonolithApiError> {
        let path = format!("{}/run_lock/{}", workflow_path(id), lock.run_id);
        self.request("DELETE", &path, None).await?;
        Ok(())
    }

    /// One request with an optional JSON body (as text); 5xx answers are
    /// retried with exponential back-off.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<HttpReply, MonolithApiError> {
        let mut backoff = self.retry_base;
        let mut attempt = 0;
        loop {
            let reply = self.request_once(method, path, body).await?;
            if reply.status < 500 || attempt >= RETRIES {
                return Ok(reply);
            }
            attempt += 1;
            tracing::debug!(
                status = reply.status,
                attempt,
                path,
                "retrying a GitLab call"
            );
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn request_once(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<HttpReply, MonolithApiError> {
        let response = self
            .link
            .call(action::Action::RunHttpRequest(RunHttpRequest {
                method: method.to_owned(),
                path: path.to_owned(),
                body: body.map(str::to_owned),
            }))
            .await?;
        match response.response_type {
            Some(action_response::ResponseType::HttpResponse(http)) => {
                if !http.error.is_empty() {
                    return Err(MonolithApiError::Action(http.error));
                }
                Ok(HttpReply {
                    status: u16::try_from(http.status_code).unwrap_or(0),
                    body: http.body,
                })
            }
            Some(action_response::ResponseType::PlainTextResponse(text))
                if !text.error.is_empty() =>
            {
                Err(MonolithApiError::Action(text.error))
            }
            _ => Err(MonolithApiError::Action(
                "the executor did not answer with an HTTP response".to_owned(),
            )),
        }
    }

    /// A request whose answer must be 2xx JSON.
    pub async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<T, MonolithApiError> {
        let reply = self.request(method, path, body).await?;
        if !(200..300).contains(&reply.status) {
            return Err(MonolithApiError::Status {
                status: reply.status,
                body: reply.body,
            });
        }
        serde_json::from_str(&reply.body).map_err(|e| MonolithApiError::Decode(e.to_string()))
    }

    pub async fn workflow(&self, id: &str) -> Result<WorkflowRecord, MonolithApiError> {
        self.json("GET", &workflow_path(id), None).await
    }

    /// `PATCH {"status_event": event}`.
    pub async fn status_event(&self, id: &str, event: &str) -> Result<(), MonolithApiError> {
        let _: Value = self
            .json(
                "PATCH",
                &self.as_this_run(workflow_path(id)),
                Some(&serde_json::json!({ "status_event": event }).to_string()),
            )
            .await?;
        Ok(())
    }

    /// Posts a checkpoint body (JSON text, [`super::state::CheckpointPost`]).
    pub async fn save_checkpoint(&self, id: &str, body: &str) -> Result<(), MonolithApiError> {
        let _: Value = self
            .json(
                "POST",
                &self.as_this_run(format!("{}/checkpoints", workflow_path(id))),
                Some(body),
            )
            .await?;
        Ok(())
    }

    /// The newest checkpoint, if any.
    pub async fn latest_checkpoint(
        &self,
        id: &str,
    ) -> Result<Option<StoredCheckpoint>, MonolithApiError> {
        let list: Vec<StoredCheckpoint> = self
            .json(
                "GET",
                &format!("{}/checkpoints?per_page=1", workflow_path(id)),
                None,
            )
            .await?;
        Ok(list.into_iter().next())
    }
}
