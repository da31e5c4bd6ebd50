//! The executor's side of one `ExecuteWorkflow` stream: actions out, replies
//! in, matched by request id.
//!
//! Every action gets a fresh UUID and waits for the reply carrying it;
//! checkpoint notifications are fire-and-forget. Replies with an unknown id
//! are dropped; replies with no id go to the oldest pending action of the same
//! kind (HTTP or plain text), as legacy clients send them. Heartbeats are
//! ignored; `stopWorkflow` and a hang-up are reported to the run.

use contracts::duo_workflow::{
    Action, ActionResponse, ClientEvent, Message, NewCheckpoint, action, action_response,
    client_event,
};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Status, Streaming};

/// The largest action the service sends (GitLab's gRPC message limit).
pub const MAX_ACTION_BYTES: usize = 4 * 1024 * 1024;

/// Stop reasons that leave the monolith's status alone so the session can be
/// resumed (an infrastructure restart, not the user).
pub const INFRA_STOP_REASONS: [&str; 2] = ["WORKHORSE_SERVER_SHUTDOWN", "SERVER_SHUTDOWN"];

/// What the executor has said about the run as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamSignal {
    Open,
    /// `stopWorkflow` with its reason.
    Stop(String),
    /// The executor closed its side or the connection broke.
    HungUp,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LinkError {
    #[error("the executor disconnected")]
    HungUp,
    #[error("the action is {0} bytes, more than the 4 MiB a message may carry")]
    TooLarge(usize),
    #[error("the executor did not answer within {0:?}")]
    Timeout(Duration),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplyKind {
    Http,
    PlainText,
}

struct Pending {
    id: String,
    kind: ReplyKind,
    reply: oneshot::Sender<ActionResponse>,
}

#[derive(Default)]
struct PendingReplies {
    waiting: VecDeque<Pending>,
}

impl PendingReplies {
    fn take(&mut self, response: &ActionResponse) -> Option<Pending> {
        let position = if response.request_id.is_empty() {
            let kind = match response.response_type {
                Some(action_response::ResponseType::HttpResponse(_)) => ReplyKind::Http,
                _ => ReplyKind::PlainText,
            };
            self.waiting.iter().position(|p| p.kind == kind)
        } else {
            self.waiting
                .iter()
                .position(|p| p.id == response.request_id)
        };
        position.and_then(|at| self.waiting.remove(at))
    }
}

/// Sends actions and awaits their replies. Cheap to clone.
#[derive(Clone)]
pub struct ExecutorLink {
    outbound: mpsc::Sender<Result<Action, Status>>,
    pending: Arc<Mutex<PendingReplies>>,
    signal: watch::Receiver<StreamSignal>,
    action_timeout: Duration,
}

impl ExecutorLink {
    /// A link over `outbound`, with the reader task that feeds it from
    /// `inbound` (events after the start request).
    pub fn start(
        outbound: mpsc::Sender<Result<Action, Status>>,
        inbound: Streaming<ClientEvent>,
        action_timeout: Duration,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let pending = Arc::new(Mutex::new(PendingReplies::default()));
        let (signal_tx, signal) = watch::channel(StreamSignal::Open);
        let reader = tokio::spawn(read_events(inbound, pending.clone(), signal_tx));
        (
            Self {
                outbound,
                pending,
                signal,
                action_timeout,
            },
            reader,
        )
    }

    /// The current stream signal.
    pub fn signal(&self) -> StreamSignal {
        self.signal.borrow().clone()
    }

    /// Resolves when the executor stops the run or hangs up.
    pub async fn interrupted(&self) -> StreamSignal {
        let mut signal = self.signal.clone();
        match signal.wait_for(|s| *s != StreamSignal::Open).await {
            Ok(value) => value.clone(),
            Err(_) => StreamSignal::HungUp,
        }
    }

    fn check_size(action: &Action) -> Result<(), LinkError> {
        let size = action.encoded_len();
        if size > MAX_ACTION_BYTES {
            return Err(LinkError::TooLarge(size));
        }
        Ok(())
    }

    /// Sends one action and waits for its reply.
    pub async fn call(&self, kind: action::Action) -> Result<ActionResponse, LinkError> {
        if self.signal() == StreamSignal::HungUp {
            return Err(LinkError::HungUp);
        }
        let id = uuid::Uuid::new_v4().to_string();
        let reply_kind = match kind {
            action::Action::RunHttpRequest(_) => ReplyKind::Http,
            _ => ReplyKind::PlainText,
        };
        let action = Action {
            request_id: id.clone(),
            action: Some(kind),
        };
        Self::check_size(&action)?;
        let (tx, rx) = oneshot::channel();
        self.lock().waiting.push_back(Pending {
            id: id.clone(),
            kind: reply_kind,
            reply: tx,
        });
        if self.outbound.send(Ok(action)).await.is_err() {
            self.forget(&id);
            return Err(LinkError::HungUp);
        }
        let mut signal = self.signal.clone();
        let hung_up = async move {
            let _ = signal.wait_for(|s| *s == StreamSignal::HungUp).await;
        };
        let outcome = tokio::select! {
            reply = rx => reply.map_err(|_| LinkError::HungUp),
            () = hung_up => Err(LinkError::HungUp),
            () = tokio::time::sleep(self.action_timeout) => Err(LinkError::Timeout(self.action_timeout)),
        };
        if outcome.is_err() {
            self.forget(&id);
        }
        outcome
    }

    /// Sends a checkpoint notification; nothing waits for a reply.
    pub async fn notify(&self, checkpoint: NewCheckpoint) -> Result<(), LinkError> {
        let action = Action {
            request_id: uuid::Uuid::new_v4().to_string(),
            action: Some(action::Action::NewCheckpoint(checkpoint)),
        };
        Self::check_size(&action)?;
        self.outbound
            .send(Ok(action))
            .await
            .map_err(|_| LinkError::HungUp)
    }

    /// Ends the stream with an error status.
    pub async fn fail(&self, status: Status) {
        let _ = self.outbound.send(Err(status)).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PendingReplies> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn forget(&self, id: &str) {
        self.lock().waiting.retain(|p| p.id != id);
    }
}

async fn read_events(
    mut inbound: Streaming<ClientEvent>,
    pending: Arc<Mutex<PendingReplies>>,
    signal: watch::Sender<StreamSignal>,
) {
    loop {
        let event = match inbound.message().await {
            Ok(Some(event)) => event,
            Ok(None) | Err(_) => {
                signal.send_replace(StreamSignal::HungUp);
                return;
            }
        };
        match event.response {
            Some(client_event::Response::ActionResponse(response)) => {
                let waiting = pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take(&response);
                match waiting {
                    Some(waiting) => {
                        let _ = waiting.reply.send(response);
                    }
                    None => tracing::debug!(
                        request_id = %response.request_id,
                        "dropping a reply to no pending action"
                    ),
                }
            }
            Some(client_event::Response::StopWorkflow(stop)) => {
                signal.send_if_modified(|current| {
                    if *current == StreamSignal::Open {
                        *current = StreamSignal::Stop(stop.reason.clone());
                        true
                    } else {
                        false
                    }
                });
            }
            Some(client_event::Response::Heartbeat(_)) | None => {}
            Some(client_event::Response::StartRequest(_)) => {
                tracing::debug!("ignoring a second start request on a running stream");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use contracts::duo_workflow::{HttpResponse, PlainTextResponse};

    fn pending(id: &str, kind: ReplyKind) -> (Pending, oneshot::Receiver<ActionResponse>) {
        let (tx, rx) = oneshot::channel();
        (
            Pending {
                id: id.into(),
                kind,
                reply: tx,
            },
            rx,
        )
    }

    #[test]
    fn replies_without_an_id_go_to_the_oldest_of_their_kind() {
        let mut replies = PendingReplies::default();
        let (a, _ra) = pending("a", ReplyKind::PlainText);
        let (b, _rb) = pending("b", ReplyKind::Http);
        let (c, _rc) = pending("c", ReplyKind::Http);
        replies.waiting.extend([a, b, c]);
        let http = ActionResponse {
            request_id: String::new(),
            response_type: Some(action_response::ResponseType::HttpResponse(
                HttpResponse::default(),
            )),
        };
        assert_eq!(replies.take(&http).map(|p| p.id), Some("b".to_owned()));
        let unknown = ActionResponse {
            request_id: "zzz".into(),
            response_type: Some(action_response::ResponseType::PlainTextResponse(
                PlainTextResponse::default(),
            )),
        };
        assert!(replies.take(&unknown).is_none());
        assert_eq!(replies.waiting.len(), 2);
    }
}
