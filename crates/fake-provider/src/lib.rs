//! A scriptable stand-in for model providers, speaking their real wire
//! protocols over real HTTP on loopback:
//!
//! - Anthropic Messages: `POST /v1/messages` (SSE or JSON), `GET /v1/models`;
//! - OpenAI chat completions: `POST /v1/chat/completions` (SSE or JSON),
//!   `GET /v1/models`, `POST /v1/embeddings` (model `fake-bow…`: bag-of-words
//!   vectors that make retrieval meaningful; `fake-max-batch-N`: more than N
//!   inputs is "too long"; failing while [`FakeProvider::set_embeddings_failing`]);
//! - Vertex AI: `POST /v1/projects/{p}/locations/{l}/publishers/google/models/{m}:predict`
//!   and `:serverStreamingPredict`.
//!
//! Tests queue answers ([`FakeProvider::push_text`], [`FakeProvider::push`]),
//! hold a streamed answer open until they release it ([`Scripted::Held`],
//! [`FakeProvider::release`]), read what was sent
//! ([`FakeProvider::requests`]), and pick failure modes by model name
//! (`fake-slow-first-token`, `fake-error-mid-stream`, `fake-overloaded`,
//! `fake-500`, `fake-malformed`, `fake-hang`).

mod anthropic;
mod openai;
mod script;
mod vertex;

pub use script::{Failure, Scripted, ToolCall};

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpRequest, HttpServer, web};
use bytes::Bytes;
use futures::Stream;
use script::{ModelMode, Plan};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Semaphore, watch};

/// How many requests are kept for [`FakeProvider::requests`]; older ones are
/// dropped so a benchmark run does not grow memory without bound.
const RECORDED_REQUESTS_LIMIT: usize = 10_000;

/// A request as the fake provider received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query, e.g. `/v1/messages`.
    pub path: String,
    /// Header names are lower case.
    pub headers: Vec<(String, String)>,
    /// The JSON body, or `Null` when there was none or it was not JSON.
    pub body: serde_json::Value,
}

impl RecordedRequest {
    /// The first value of a header (name in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Start-up options.
#[derive(Debug, Clone)]
pub struct FakeProviderOptions {
    /// Where to listen; port 0 picks a free one.
    pub addr: SocketAddr,
    /// Actix worker threads.
    pub workers: usize,
}

impl Default for FakeProviderOptions {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            workers: 1,
        }
    }
}

struct Script {
    queue: VecDeque<Scripted>,
    /// When no answer is queued: the first rule whose needle occurs in the
    /// request body answers, else `default_text`.
    rules: Vec<(String, String)>,
    default_text: String,
    chunk_size: usize,
    wire_split: Option<usize>,
    slow_first_token: Duration,
    record: bool,
    requests: VecDeque<RecordedRequest>,
    /// Embedding calls answer 500 while set (a failing embedder).
    embeddings_failing: bool,
}

pub(crate) struct State {
    script: Mutex<Script>,
    /// Flips to true when the server stops, ending hanging responses.
    shutdown: watch::Receiver<bool>,
    /// One permit per [`FakeProvider::release`]; each held answer takes one.
    releases: Arc<Semaphore>,
    /// Embedding calls being answered right now.
    embeddings_in_flight: watch::Sender<usize>,
    /// The most embedding calls answered at once since the last reset.
    embeddings_peak: AtomicUsize,
    /// While true, embedding calls wait for [`FakeProvider::release_embedding`].
    embeddings_held: watch::Sender<bool>,
    embedding_releases: Arc<Semaphore>,
}

/// Counts an embedding call out again however its answer ends.
pub(crate) struct EmbeddingInFlight<'a>(&'a State);

impl Drop for EmbeddingInFlight<'_> {
    fn drop(&mut self) {
        self.0
            .embeddings_in_flight
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl State {
    fn lock(&self) -> MutexGuard<'_, Script> {
        // A panic while holding the lock cannot leave the script inconsistent
        // in a way that matters to a test double, so recover from poisoning.
        self.script.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an embedding call in (until the guard drops) and, while calls
    /// are held, waits for its release.
    pub(crate) async fn embedding_started(&self) -> EmbeddingInFlight<'_> {
        let mut now = 0;
        self.embeddings_in_flight.send_modify(|n| {
            *n += 1;
            now = *n;
        });
        self.embeddings_peak.fetch_max(now, Ordering::SeqCst);
        let guard = EmbeddingInFlight(self);
        let mut held = self.embeddings_held.subscribe();
        if *held.borrow_and_update() {
            let mut shutdown = self.shutdown.clone();
            tokio::select! {
                permit = self.embedding_releases.acquire() => {
                    if let Ok(permit) = permit {
                        permit.forget();
                    }
                }
                _ = held.wait_for(|on| !*on) => {}
                _ = shutdown.wait_for(|stopped| *stopped) => {}
            }
        }
        guard
    }

    pub(crate) fn embeddings_failing(&self) -> bool {
        self.lock().embeddings_failing
    }

    pub(crate) fn record(&self, req: &HttpRequest, body: &[u8]) -> serde_json::Value {
        let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let mut script = self.lock();
        if script.record {
            if script.requests.len() >= RECORDED_REQUESTS_LIMIT {
                script.requests.pop_front();
            }
            script.requests.push_back(RecordedRequest {
                method: req.method().to_string(),
                path: req
                    .uri()
                    .path_and_query()
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
                headers: req
                    .headers()
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_owned(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect(),
                body: json.clone(),
            });
        }
        json
    }

    /// Decides what a model request gets: a failure chosen by model name, or
    /// the next scripted answer, or the default answer.
    pub(crate) fn plan(&self, model: &str, body: &serde_json::Value) -> Plan {
        let mode = ModelMode::from_model(model);
        let fail = |f| Plan::Fail(f);
        match mode {
            Some(ModelMode::Overloaded) => return fail(Failure::Overloaded),
            Some(ModelMode::ServerError) => return fail(Failure::ServerError),
            Some(ModelMode::Malformed) => return fail(Failure::Malformed),
            Some(ModelMode::Hang) => return fail(Failure::Hang),
            Some(ModelMode::ErrorMidStream) => {
                return fail(Failure::ErrorMidStream {
                    text: "partial answer ".to_owned(),
                });
            }
            Some(ModelMode::SlowFirstToken) | None => {}
        }
        let mut script = self.lock();
        let mut held = None;
        let pieces = match script.queue.pop_front() {
            Some(Scripted::Fail(failure)) => return Plan::Fail(failure),
            Some(Scripted::ToolCalls { text, calls }) => return Plan::Tools { text, calls },
            Some(Scripted::Chunks(pieces)) => pieces,
            Some(Scripted::Held { before, after }) => {
                held = Some(after);
                before
            }
            Some(Scripted::Text(text)) => script::split_text(&text, script.chunk_size),
            None => {
                let text = if script.rules.is_empty() {
                    &script.default_text
                } else {
                    let body = body.to_string();
                    script
                        .rules
                        .iter()
                        .find(|(needle, _)| body.contains(needle.as_str()))
                        .map_or(&script.default_text, |(_, text)| text)
                };
                script::split_text(text, script.chunk_size)
            }
        };
        Plan::Answer {
            pieces,
            first_byte_delay: (mode == Some(ModelMode::SlowFirstToken))
                .then_some(script.slow_first_token),
            held,
        }
    }

    /// Splits events into raw pieces of `wire_split` bytes when set (to
    /// exercise clients' parsers).
    fn wire_pieces(&self, events: Vec<Bytes>) -> Vec<Bytes> {
        match self.lock().wire_split {
            None => events,
            Some(n) => {
                let all: Vec<u8> = events.iter().flat_map(|b| b.iter().copied()).collect();
                all.chunks(n.max(1)).map(Bytes::copy_from_slice).collect()
            }
        }
    }

    /// An SSE body, split on the wire as configured.
    pub(crate) fn sse_body(
        &self,
        events: Vec<Bytes>,
    ) -> impl Stream<Item = Result<Bytes, actix_web::Error>> + use<> {
        futures::stream::iter(self.wire_pieces(events).into_iter().map(Ok))
    }

    /// An SSE body sending `before`, then, once released, `after`
    /// (`after: None` sends everything at once). A server stopping while the
    /// body is held ends it there, as a cut connection.
    pub(crate) fn held_sse_body(
        &self,
        before: Vec<Bytes>,
        after: Option<Vec<Bytes>>,
    ) -> impl Stream<Item = Result<Bytes, actix_web::Error>> + use<> {
        let before = self.wire_pieces(before);
        let after = after.map(|events| self.wire_pieces(events));
        let releases = self.releases.clone();
        let mut shutdown = self.shutdown.clone();
        async_stream::stream! {
            for piece in before {
                yield Ok(piece);
            }
            let Some(after) = after else { return };
            let released = tokio::select! {
                permit = releases.acquire() => {
                    // The permit is spent: one release lets one answer go on.
                    permit.map(|p| p.forget()).is_ok()
                }
                _ = shutdown.wait_for(|stopped| *stopped) => false,
            };
            if released {
                for piece in after {
                    yield Ok(piece);
                }
            }
        }
    }

    /// A body that sends nothing until the server stops.
    pub(crate) fn hanging_body(
        &self,
    ) -> impl Stream<Item = Result<Bytes, actix_web::Error>> + use<> {
        let mut shutdown = self.shutdown.clone();
        async_stream::stream! {
            let _ = shutdown.wait_for(|stopped| *stopped).await;
            if false {
                yield Ok(Bytes::new());
            }
        }
    }

    pub(crate) async fn wait_until_shutdown(&self) {
        let mut shutdown = self.shutdown.clone();
        let _ = shutdown.wait_for(|stopped| *stopped).await;
    }
}

/// A running fake provider. Stops when dropped.
pub struct FakeProvider {
    addr: SocketAddr,
    state: Arc<State>,
    handle: ServerHandle,
    shutdown: watch::Sender<bool>,
}

impl FakeProvider {
    /// Starts on 127.0.0.1 with a free port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(FakeProviderOptions::default()).await
    }

    pub async fn start_with(options: FakeProviderOptions) -> std::io::Result<Self> {
        let (shutdown, shutdown_rx) = watch::channel(false);
        let state = Arc::new(State {
            script: Mutex::new(Script {
                queue: VecDeque::new(),
                rules: Vec::new(),
                default_text: "Hello from the fake provider.".to_owned(),
                chunk_size: 16,
                wire_split: None,
                slow_first_token: Duration::from_secs(2),
                record: true,
                requests: VecDeque::new(),
                embeddings_failing: false,
            }),
            shutdown: shutdown_rx,
            releases: Arc::new(Semaphore::new(0)),
            embeddings_in_flight: watch::Sender::new(0),
            embeddings_peak: AtomicUsize::new(0),
            embeddings_held: watch::Sender::new(false),
            embedding_releases: Arc::new(Semaphore::new(0)),
        });
        let data = web::Data::from(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(32 * 1024 * 1024))
                .route("/v1/messages", web::post().to(anthropic::messages))
                .route(
                    "/v1/chat/completions",
                    web::post().to(openai::chat_completions),
                )
                .route("/v1/models", web::get().to(openai::models))
                .route("/v1/embeddings", web::post().to(openai::embeddings))
                .route(
                    "/v1/projects/{project}/locations/{location}/publishers/google/models/{model_action}",
                    web::post().to(vertex::model_action),
                )
        })
        .workers(options.workers.max(1))
        .shutdown_timeout(1)
        .disable_signals()
        .bind(options.addr)?;
        let addr = server
            .addrs()
            .first()
            .copied()
            .ok_or_else(|| std::io::Error::other("the server bound no address"))?;
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Ok(Self {
            addr,
            state,
            handle,
            shutdown,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`: the Anthropic base URL and the Vertex endpoint.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:<port>/v1`: the OpenAI-compatible base URL.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues a text answer for the next model request.
    pub fn push_text(&self, text: impl Into<String>) {
        self.push(Scripted::Text(text.into()));
    }

    /// Lets one held answer ([`Scripted::Held`]) go on; a release before
    /// the answer is held is kept for it.
    pub fn release(&self) {
        self.state.releases.add_permits(1);
    }

    /// Queues a turn calling tools for the next model request.
    pub fn push_tool_calls(&self, text: impl Into<String>, calls: Vec<ToolCall>) {
        self.push(Scripted::ToolCalls {
            text: text.into(),
            calls,
        });
    }

    /// Queues a failure for the next model request ("fail once, then succeed").
    pub fn push_failure(&self, failure: Failure) {
        self.push(Scripted::Fail(failure));
    }

    pub fn push(&self, scripted: Scripted) {
        self.state.lock().queue.push_back(scripted);
    }

    /// Answers `text` (when nothing is queued) to requests whose body
    /// contains `needle`; concurrent conversations can so be scripted by what
    /// they have already seen. Earlier rules win.
    pub fn reply_when(&self, needle: impl Into<String>, text: impl Into<String>) {
        self.state.lock().rules.push((needle.into(), text.into()));
    }

    /// The answer given when the queue is empty and no rule matches.
    pub fn set_default_text(&self, text: impl Into<String>) {
        self.state.lock().default_text = text.into();
    }

    /// The size in bytes of each streamed text delta (default 16).
    pub fn set_chunk_size(&self, bytes: usize) {
        self.state.lock().chunk_size = bytes.max(1);
    }

    /// Splits every streamed body into raw pieces of this many bytes, cutting
    /// through events, lines and UTF-8 sequences. `None` sends whole events.
    pub fn set_wire_split(&self, bytes: Option<usize>) {
        self.state.lock().wire_split = bytes;
    }

    /// The delay before the first byte for `fake-slow-first-token*` models (default 2 s).
    pub fn set_slow_first_token_delay(&self, delay: Duration) {
        self.state.lock().slow_first_token = delay;
    }

    /// Makes every embedding call fail with 500 (`true`) or work again.
    pub fn set_embeddings_failing(&self, failing: bool) {
        self.state.lock().embeddings_failing = failing;
    }

    /// Holds every embedding call (`true`) until [`Self::release_embedding`]
    /// lets it answer, or answers at once again (`false`, releasing all).
    pub fn hold_embeddings(&self, on: bool) {
        self.state.embeddings_held.send_replace(on);
    }

    /// Lets one held embedding call answer; a release before a call is held
    /// is kept for it.
    pub fn release_embedding(&self) {
        self.state.embedding_releases.add_permits(1);
    }

    /// The number of embedding calls being answered now, to wait on.
    pub fn embeddings_in_flight(&self) -> watch::Receiver<usize> {
        self.state.embeddings_in_flight.subscribe()
    }

    /// The most embedding calls answered at once since the last [`Self::reset`].
    pub fn embeddings_peak(&self) -> usize {
        self.state.embeddings_peak.load(Ordering::SeqCst)
    }

    /// Turns request recording off (benchmarks) or on (the default).
    pub fn set_recording(&self, on: bool) {
        self.state.lock().record = on;
    }

    /// Requests received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.lock().requests.iter().cloned().collect()
    }

    /// Forgets recorded requests and queued answers.
    pub fn reset(&self) {
        let mut script = self.state.lock();
        script.requests.clear();
        script.queue.clear();
        script.rules.clear();
        self.state.embeddings_peak.store(0, Ordering::SeqCst);
    }

    /// Stops the server, ending hanging responses, and waits for it.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        self.handle.stop(false).await;
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        // The stop command is sent immediately; awaiting it only waits for completion.
        drop(self.handle.stop(false));
    }
}

/// Formats one server-sent event.
pub(crate) fn sse_event(event: Option<&str>, data: &serde_json::Value) -> Bytes {
    let mut out = String::new();
    if let Some(name) = event {
        out.push_str("event: ");
        out.push_str(name);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
    Bytes::from(out)
}

/// Reads `stop` / `stop_sequences`: a string or a list of strings.
pub(crate) fn stop_list(value: Option<&serde_json::Value>) -> Vec<String> {
    match value {
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}
