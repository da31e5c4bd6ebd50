//! HTTP surface. Handlers parse and validate, then hand off to the generation
//! queue or the embedder.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::dev::Server;
use actix_web::{App, HttpResponse, HttpServer, web};
use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::admission::{Admission, AdmitError};
use crate::api::{
    ChatCompletionRequest, EmbeddingInput, EmbeddingsRequest, Usage, VertexPredictRequest,
    parse_json,
};
use crate::chat_template::{ChatMessage, render_chatml};
use crate::config::Config;
use crate::embeddings::{EmbedError, EmbedModel, Embedded, Embedder};
use crate::engine::{EngineError, LlamaEngine, SamplingParams};
use crate::error::ApiError;
use crate::generation::{GenerationEvent, GenerationQueue, GenerationRequest, SubmitError};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Chat(#[from] EngineError),
    #[error(transparent)]
    Embeddings(#[from] EmbedError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub chat: GenerationQueue,
    pub embedder: Arc<dyn EmbedModel>,
    /// Bounds embedding work the way the generation queue bounds chat.
    pub embed_admission: Arc<Admission>,
    /// Set at SIGTERM: `/ready` answers 503 from then on.
    stopping: Arc<AtomicBool>,
}

impl AppState {
    /// Loads both models; the chat engine lives on the generator thread.
    pub fn load(config: Config) -> Result<Self, StartError> {
        let path = config.chat_model_path.clone();
        let (threads, context) = (config.threads, config.context_tokens);
        let chat = GenerationQueue::start(config.queue_capacity, move || {
            LlamaEngine::load(&path, threads, context)
        })?;
        let embedder = Arc::new(Embedder::load(&config.embed_model_dir)?);
        Ok(Self::from_parts(config, chat, embedder))
    }

    /// Builds the app around any chat queue and embedder: the seam for other
    /// engines and for tests with controllable doubles.
    pub fn from_parts(
        config: Config,
        chat: GenerationQueue,
        embedder: Arc<dyn EmbedModel>,
    ) -> Self {
        let embed_admission = Arc::new(Admission::new(
            config.embed_concurrency,
            config.embed_queue_capacity,
        ));
        Self {
            config: Arc::new(config),
            chat,
            embedder,
            embed_admission,
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The process is shutting down: not ready any more (it keeps serving).
    pub fn begin_stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// Binds (port 0 picks a free port) and returns the server with its address.
pub fn bind(state: AppState, addr: SocketAddr) -> Result<(Server, SocketAddr), StartError> {
    let grace = state.config.shutdown_grace.as_secs();
    let data = web::Data::new(state);
    let server = HttpServer::new(move || App::new().app_data(data.clone()).configure(routes))
        .workers(2)
        // A client that closes its side has gone (HTTP clients do not half-close
        // while awaiting an answer). Ending the connection at once drops the
        // handler, which takes a waiting request out of the queue and halts a
        // running generation; by default actix would keep serving nobody.
        .h1_allow_half_closed(false)
        // SIGTERM is handled by the binary (drain first). A stopping server
        // lets requests in flight finish within the grace period; then their
        // connections are dropped, which cancels their generations.
        .disable_signals()
        .shutdown_timeout(grace)
        .bind(addr)
        .map_err(|source| StartError::Bind { addr, source })?;
    let bound = server.addrs().first().copied().unwrap_or(addr);
    Ok((server.run(), bound))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/health", web::get().to(health))
        .route("/ready", web::get().to(ready))
        .route("/metrics", web::get().to(metrics))
        .route("/v1/models", web::get().to(list_models))
        .route("/v1/chat/completions", web::post().to(chat_completions))
        .route("/v1/embeddings", web::post().to(embeddings))
        .route(
            "/v1/projects/{project}/locations/{location}/publishers/google/models/{model_action}",
            web::post().to(vertex_predict),
        )
        .default_service(web::to(not_found));
}

async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound("no such endpoint".to_owned()))
}

async fn health(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "status": "ok",
        "chat_model": state.config.chat_model_id,
        "embedding_model": state.config.embed_model_id,
        "chat_queue": state.chat.stats(),
        "embedding_queue": state.embed_admission.stats(),
    }))
}

/// The readiness probe: models are loaded once the server listens, so only
/// stopping makes it fail.
async fn ready(state: web::Data<AppState>) -> HttpResponse {
    if state.is_stopping() {
        return HttpResponse::ServiceUnavailable().json(json!({ "status": "stopping" }));
    }
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(render_metrics(&state))
}

/// Prometheus text: the queues, generations in flight and tokens processed.
pub fn render_metrics(state: &AppState) -> String {
    let chat = state.chat.stats();
    let tokens = state.chat.token_totals();
    let embeddings = state.embed_admission.stats();
    let families: [(&str, &str, &str, f64); 11] = [
        (
            "duo_local_llm_chat_queue_waiting",
            "gauge",
            "Chat requests waiting for the generator.",
            chat.waiting as f64,
        ),
        (
            "duo_local_llm_chat_queue_capacity",
            "gauge",
            "Chat requests that may wait (DUO_LOCAL_LLM_QUEUE).",
            chat.capacity as f64,
        ),
        (
            "duo_local_llm_generations_in_flight",
            "gauge",
            "Generations running now.",
            f64::from(u8::from(chat.running)),
        ),
        (
            "duo_local_llm_generations_total",
            "counter",
            "Generations run to their end (finished, stopped or cancelled).",
            chat.completed as f64,
        ),
        (
            "duo_local_llm_generations_skipped_total",
            "counter",
            "Queued chat requests dropped unrun because their client left.",
            chat.skipped as f64,
        ),
        (
            "duo_local_llm_prompt_tokens_total",
            "counter",
            "Prompt tokens processed by generations.",
            tokens.prompt as f64,
        ),
        (
            "duo_local_llm_completion_tokens_total",
            "counter",
            "Tokens generated.",
            tokens.completion as f64,
        ),
        (
            "duo_local_llm_embedding_requests_running",
            "gauge",
            "Embedding requests computing now.",
            embeddings.running as f64,
        ),
        (
            "duo_local_llm_embedding_queue_waiting",
            "gauge",
            "Embedding requests waiting for a slot.",
            embeddings.waiting as f64,
        ),
        (
            "duo_local_llm_embedding_queue_capacity",
            "gauge",
            "Embedding requests that may wait (DUO_LOCAL_LLM_EMBED_QUEUE).",
            embeddings.capacity as f64,
        ),
        (
            "duo_local_llm_stopping",
            "gauge",
            "1 once the server has begun stopping.",
            f64::from(u8::from(state.is_stopping())),
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, value) in families {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        ));
    }
    out
}

async fn list_models(state: web::Data<AppState>) -> HttpResponse {
    let model = |id: &str| json!({ "id": id, "object": "model", "created": 0, "owned_by": "duo-local-llm" });
    HttpResponse::Ok().json(json!({
        "object": "list",
        "data": [model(&state.config.chat_model_id), model(&state.config.embed_model_id)],
    }))
}

/// Reads the body up to the configured limit, so oversize is a clean 413.
async fn read_body(mut payload: web::Payload, limit: usize) -> Result<Bytes, ApiError> {
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::BadRequest(format!("could not read the request body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(format!(
                "request body exceeds {limit} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn validated_generation(
    state: &AppState,
    request: ChatCompletionRequest,
) -> Result<GenerationRequest, ApiError> {
    if request.model != state.config.chat_model_id {
        return Err(ApiError::ModelNotFound(format!(
            "model {:?} does not exist; this server serves {:?}",
            request.model, state.config.chat_model_id
        )));
    }
    if request.messages.is_empty() {
        return Err(ApiError::BadRequest(
            "messages must not be empty".to_owned(),
        ));
    }
    let mut messages = Vec::with_capacity(request.messages.len());
    for message in &request.messages {
        if !matches!(
            message.role.as_str(),
            "system" | "developer" | "user" | "assistant" | "tool"
        ) {
            return Err(ApiError::Unprocessable(format!(
                "unknown message role {:?}",
                message.role
            )));
        }
        let role = if message.role == "developer" {
            "system"
        } else {
            message.role.as_str()
        };
        messages.push(ChatMessage {
            role: role.to_owned(),
            content: message.text()?,
        });
    }
    let temperature = request.temperature.unwrap_or(0.7);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::Unprocessable(
            "temperature must be between 0 and 2".to_owned(),
        ));
    }
    let top_p = request.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::Unprocessable(
            "top_p must be in (0, 1]".to_owned(),
        ));
    }
    let max_tokens = request
        .max_completion_tokens
        .or(request.max_tokens)
        .unwrap_or(512);
    if max_tokens == 0 {
        return Err(ApiError::Unprocessable(
            "max_tokens must be at least 1".to_owned(),
        ));
    }
    let stop = request.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ApiError::Unprocessable(
            "at most 4 stop sequences are allowed".to_owned(),
        ));
    }
    Ok(GenerationRequest {
        prompt: render_chatml(&messages),
        params: SamplingParams {
            temperature,
            top_p,
            max_tokens,
            seed: pick_seed(request.seed),
        },
        stop,
    })
}

/// The client's seed keeps sampling reproducible; without one each request
/// draws its own, so identical requests at temperature > 0 can differ, as
/// OpenAI's do. (Greedy decoding ignores the seed.)
fn pick_seed(requested: Option<u32>) -> u32 {
    requested.unwrap_or_else(|| {
        let bytes = uuid::Uuid::new_v4().into_bytes();
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    })
}

fn engine_error(err: EngineError) -> ApiError {
    match err {
        EngineError::PromptTooLong { .. } => ApiError::PayloadTooLarge(err.to_string()),
        EngineError::EmptyPrompt => ApiError::BadRequest(err.to_string()),
        other => ApiError::Internal(other.to_string()),
    }
}

/// Waits until the generator has taken the prompt, so prompt errors still get a status code.
async fn await_start(events: &mut UnboundedReceiver<GenerationEvent>) -> Result<usize, ApiError> {
    match events.recv().await {
        Some(GenerationEvent::Started { prompt_tokens }) => Ok(prompt_tokens),
        Some(GenerationEvent::Failed(err)) => Err(engine_error(err)),
        Some(_) | None => Err(ApiError::Internal(
            "generator ended without starting".to_owned(),
        )),
    }
}

async fn chat_completions(
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, state.config.max_body_bytes).await?;
    let request: ChatCompletionRequest = parse_json(&body)?;
    let stream = request.stream;
    let include_usage = request
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    let generation = validated_generation(&state, request)?;
    let mut events = state.chat.submit(generation).map_err(|e| match e {
        SubmitError::QueueFull => ApiError::QueueFull("chat"),
        SubmitError::Stopped => ApiError::Internal(e.to_string()),
    })?;
    let prompt_tokens = await_start(&mut events).await?;
    let id = format!("chatcmpl-{}", uuid::Uuid::new_v4().simple());
    let model = state.config.chat_model_id.clone();
    let created = unix_now();
    if stream {
        return Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header(("Cache-Control", "no-cache"))
            .streaming(sse_stream(
                events,
                SseMeta {
                    id,
                    model,
                    created,
                    prompt_tokens,
                    include_usage,
                },
            )));
    }
    let mut content = String::new();
    loop {
        match events.recv().await {
            Some(GenerationEvent::Delta(text)) => content.push_str(&text),
            Some(GenerationEvent::Finished {
                reason,
                completion_tokens,
            }) => {
                let usage = Usage {
                    prompt_tokens,
                    completion_tokens,
                    total_tokens: prompt_tokens + completion_tokens,
                };
                return Ok(HttpResponse::Ok().json(json!({
                    "id": id,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [{
                        "index": 0,
                        "message": { "role": "assistant", "content": content },
                        "finish_reason": reason.as_str(),
                    }],
                    "usage": usage,
                })));
            }
            Some(GenerationEvent::Failed(err)) => return Err(engine_error(err)),
            Some(GenerationEvent::Started { .. }) => {}
            None => {
                return Err(ApiError::Internal(
                    "generator stopped mid-answer".to_owned(),
                ));
            }
        }
    }
}

struct SseMeta {
    id: String,
    model: String,
    created: u64,
    prompt_tokens: usize,
    include_usage: bool,
}

/// Dropping this stream (actix does when the client disconnects) drops the
/// event receiver, which halts generation at the next token.
fn sse_stream(
    mut events: UnboundedReceiver<GenerationEvent>,
    meta: SseMeta,
) -> impl futures::Stream<Item = Result<Bytes, actix_web::Error>> {
    let frame = |payload: Value| Bytes::from(format!("data: {payload}\n\n"));
    let chunk = move |choices: Value, usage: Option<Usage>| {
        let mut payload = json!({
            "id": meta.id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": meta.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            payload["usage"] = json!(usage);
        }
        frame(payload)
    };
    let choice = |delta: Value, finish: Option<&str>| json!([{ "index": 0, "delta": delta, "finish_reason": finish }]);
    let (prompt_tokens, include_usage) = (meta.prompt_tokens, meta.include_usage);
    async_stream::stream! {
        yield Ok(chunk(choice(json!({ "role": "assistant", "content": "" }), None), None));
        while let Some(event) = events.recv().await {
            match event {
                GenerationEvent::Delta(text) => {
                    yield Ok(chunk(choice(json!({ "content": text }), None), None));
                }
                GenerationEvent::Finished { reason, completion_tokens } => {
                    yield Ok(chunk(choice(json!({}), Some(reason.as_str())), None));
                    if include_usage {
                        let usage = Usage {
                            prompt_tokens,
                            completion_tokens,
                            total_tokens: prompt_tokens + completion_tokens,
                        };
                        yield Ok(chunk(json!([]), Some(usage)));
                    }
                    break;
                }
                GenerationEvent::Failed(err) => {
                    tracing::error!(error = %err, "generation failed mid-stream");
                    yield Ok(frame(ApiError::Internal(err.to_string()).body()));
                    break;
                }
                GenerationEvent::Started { .. } => {}
            }
        }
        yield Ok(Bytes::from_static(b"data: [DONE]\n\n"));
    }
}

fn check_inputs(state: &AppState, texts: &[String]) -> Result<(), ApiError> {
    if texts.is_empty() {
        return Err(ApiError::BadRequest("input must not be empty".to_owned()));
    }
    if texts.len() > state.config.max_embedding_inputs {
        return Err(ApiError::PayloadTooLarge(format!(
            "at most {} inputs per request",
            state.config.max_embedding_inputs
        )));
    }
    if texts.iter().any(|t| t.is_empty()) {
        return Err(ApiError::BadRequest(
            "input strings must not be empty".to_owned(),
        ));
    }
    Ok(())
}

/// Waits for an embedding slot (or is refused at once when too many wait),
/// then runs tokenisation and the model on the blocking pool. The slot moves
/// into the blocking call, so it stays taken until the CPU work really ends,
/// even if the client has gone.
async fn embed(state: &AppState, texts: Vec<String>) -> Result<Embedded, ApiError> {
    let admitted = state.embed_admission.enter().await.map_err(|e| match e {
        AdmitError::Full => ApiError::QueueFull("embeddings"),
        AdmitError::Closed => ApiError::Internal(e.to_string()),
    })?;
    let embedder = state.embedder.clone();
    web::block(move || {
        let result = embedder.embed(&texts);
        drop(admitted);
        result
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?
    .map_err(|e| ApiError::Internal(e.to_string()))
}

async fn embeddings(
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, state.config.max_body_bytes).await?;
    let request: EmbeddingsRequest = parse_json(&body)?;
    if request.model != state.config.embed_model_id {
        return Err(ApiError::ModelNotFound(format!(
            "model {:?} does not exist; this server embeds with {:?}",
            request.model, state.config.embed_model_id
        )));
    }
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::Unprocessable(format!(
                "unknown encoding_format {other:?}"
            )));
        }
    };
    let texts = match request.input {
        EmbeddingInput::One(text) => vec![text],
        EmbeddingInput::Many(texts) => texts,
        EmbeddingInput::Tokens(_) => {
            return Err(ApiError::Unprocessable(
                "input must be a string or an array of strings".to_owned(),
            ));
        }
    };
    check_inputs(&state, &texts)?;
    let embedded = embed(&state, texts).await?;
    let tokens = embedded.total_tokens();
    let data: Vec<Value> = embedded
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "data": data,
        "model": state.config.embed_model_id,
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    })))
}

/// Any model name is served by the one embedder: the gateway's Vertex proxy
/// forwards whatever model the client asked for.
async fn vertex_predict(
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (_project, _location, model_action) = path.into_inner();
    if !model_action.ends_with(":predict") {
        return Err(ApiError::NotFound(format!(
            "unsupported model action {model_action:?}"
        )));
    }
    let body = read_body(payload, state.config.max_body_bytes).await?;
    let request: VertexPredictRequest = parse_json(&body)?;
    let texts: Vec<String> = request.instances.into_iter().map(|i| i.content).collect();
    check_inputs(&state, &texts)?;
    let characters: usize = texts.iter().map(|t| t.chars().count()).sum();
    // Token counts come from the embedder's own tokenisation, on the blocking pool.
    let embedded = embed(&state, texts).await?;
    let predictions: Vec<Value> = embedded
        .vectors
        .into_iter()
        .zip(embedded.token_counts)
        .zip(embedded.truncated)
        .map(|((values, count), truncated)| {
            json!({ "embeddings": { "values": values, "statistics": { "token_count": count, "truncated": truncated } } })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "predictions": predictions,
        "metadata": { "billableCharacterCount": characters },
    })))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_given_seed_is_kept_and_a_missing_one_is_drawn_per_request() {
        assert_eq!(pick_seed(Some(7)), 7);
        assert_eq!(pick_seed(Some(0x5eed)), 0x5eed);
        let drawn: HashSet<u32> = (0..8).map(|_| pick_seed(None)).collect();
        // Eight draws from 2^32 values all colliding would mean a fixed seed.
        assert!(drawn.len() > 1, "{drawn:?}");
    }
}
