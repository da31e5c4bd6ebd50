//! Seeing which tool the agent ran. The monolith stores only the question
//! and the final answer (no steps), so the harness puts a small recording
//! proxy between the monolith and the gateway (`AI_GATEWAY_URL` points at
//! it). Every request is passed on unchanged and every answer streamed back
//! as it arrives; on the way, the `action` events of `POST /v2/chat/agent`
//! (the tool the model chose for the monolith to run) are noted in order,
//! and so are the requests themselves (what the monolith attached to the
//! question, the tool results it sent back).

use std::sync::{Arc, Mutex, PoisonError};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use anyhow::Context;
use contracts::{AgentEvent, AgentRequest};
use futures::StreamExt;

/// One tool call the agent asked the monolith to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    pub tool: String,
    pub input: String,
}

#[derive(Default)]
struct Shared {
    /// The gateway's base URL; set once the system is up.
    upstream: Mutex<String>,
    actions: Mutex<Vec<Action>>,
    /// The bodies of `POST /v2/chat/agent`, in the order they arrived.
    requests: Mutex<Vec<AgentRequest>>,
}

/// The running proxy.
pub struct GatewayRecorder {
    shared: Arc<Shared>,
    url: String,
    handle: actix_web::dev::ServerHandle,
}

impl GatewayRecorder {
    /// Starts on a free loopback port; requests fail with 502 until
    /// [`GatewayRecorder::set_upstream`] is called.
    pub fn start() -> anyhow::Result<Self> {
        let shared = Arc::new(Shared::default());
        let data = web::Data::from(shared.clone());
        let client = web::Data::new(
            reqwest::Client::builder()
                .build()
                .context("the proxy's client")?,
        );
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(client.clone())
                .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
                .default_service(web::to(forward))
        })
        .workers(1)
        .shutdown_timeout(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .context("binding the gateway proxy")?;
        let addr = server
            .addrs()
            .first()
            .copied()
            .context("the gateway proxy bound no address")?;
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Ok(Self {
            shared,
            url: format!("http://{addr}"),
            handle,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn set_upstream(&self, gateway_url: &str) {
        *lock(&self.shared.upstream) = gateway_url.trim_end_matches('/').to_owned();
    }

    /// How many actions were seen so far (a mark to read later ones from).
    pub fn mark(&self) -> usize {
        lock(&self.shared.actions).len()
    }

    /// The actions seen since `mark`, oldest first.
    pub fn since(&self, mark: usize) -> Vec<Action> {
        lock(&self.shared.actions)
            .get(mark..)
            .map(<[Action]>::to_vec)
            .unwrap_or_default()
    }

    /// How many agent requests were seen so far (a mark to read later ones from).
    pub fn request_mark(&self) -> usize {
        lock(&self.shared.requests).len()
    }

    /// The agent requests seen since `mark`, oldest first.
    pub fn requests_since(&self, mark: usize) -> Vec<AgentRequest> {
        lock(&self.shared.requests)
            .get(mark..)
            .map(<[AgentRequest]>::to_vec)
            .unwrap_or_default()
    }

    pub async fn stop(self) {
        self.handle.stop(false).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Headers that belong to one hop, not to the request.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "host"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "content-length"
            | "accept-encoding"
            | "upgrade"
            | "te"
            | "trailer"
    )
}

/// Notes the actions among complete NDJSON lines of `pending`, keeping the
/// unfinished last line for the next piece.
fn take_actions(pending: &mut Vec<u8>, shared: &Shared) {
    while let Some(end) = pending.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = pending.drain(..=end).collect();
        let Ok(text) = std::str::from_utf8(&line) else {
            continue;
        };
        if let Ok(AgentEvent::Action {
            tool, tool_input, ..
        }) = serde_json::from_str::<AgentEvent>(text.trim())
        {
            lock(&shared.actions).push(Action {
                tool,
                input: tool_input,
            });
        }
    }
}

async fn forward(
    request: HttpRequest,
    body: web::Bytes,
    shared: web::Data<Shared>,
    client: web::Data<reqwest::Client>,
) -> HttpResponse {
    let upstream = lock(&shared.upstream).clone();
    if upstream.is_empty() {
        return HttpResponse::BadGateway().body("the gateway is not known yet");
    }
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let Ok(method) = reqwest::Method::from_bytes(request.method().as_str().as_bytes()) else {
        return HttpResponse::MethodNotAllowed().finish();
    };
    let watch = path.starts_with("/v2/chat/agent");
    if watch && let Ok(request) = serde_json::from_slice::<AgentRequest>(&body) {
        lock(&shared.requests).push(request);
    }
    let mut outgoing = client.request(method, format!("{upstream}{path}"));
    for (name, value) in request.headers() {
        if !hop_by_hop(name.as_str()) {
            outgoing = outgoing.header(name.as_str(), value.as_bytes());
        }
    }
    let answer = match outgoing.body(body).send().await {
        Ok(answer) => answer,
        Err(e) => return HttpResponse::BadGateway().body(format!("the gateway: {e}")),
    };
    let status = actix_web::http::StatusCode::from_u16(answer.status().as_u16())
        .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY);
    let mut response = HttpResponse::build(status);
    for (name, value) in answer.headers() {
        if !hop_by_hop(name.as_str()) {
            response.insert_header((name.as_str(), value.as_bytes()));
        }
    }
    let shared = shared.into_inner();
    let mut pending = Vec::new();
    let stream = answer.bytes_stream().map(move |piece| {
        if watch && let Ok(bytes) = &piece {
            pending.extend_from_slice(bytes);
            take_actions(&mut pending, &shared);
        }
        piece.map_err(std::io::Error::other)
    });
    response.streaming(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_read_from_whole_lines_across_pieces() {
        let shared = Shared::default();
        let action = AgentEvent::Action {
            tool: "issue_reader".into(),
            tool_input: "acme/platform/api#1".into(),
            thought: "t".into(),
        }
        .to_ndjson_line();
        let delta = AgentEvent::delta("hi").to_ndjson_line();
        let all = format!("{delta}{action}");
        let (a, b) = all.as_bytes().split_at(delta.len() + 7);
        let mut pending = Vec::new();
        pending.extend_from_slice(a);
        take_actions(&mut pending, &shared);
        assert!(lock(&shared.actions).is_empty());
        pending.extend_from_slice(b);
        take_actions(&mut pending, &shared);
        assert_eq!(
            *lock(&shared.actions),
            vec![Action {
                tool: "issue_reader".into(),
                input: "acme/platform/api#1".into()
            }]
        );
        assert!(pending.is_empty());
    }
}
