//! HTTP surface. Handlers parse and validate, then hand off to the generation
//! queue or the embedder.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actix_web::dev::Server;
use actix_web::{App, HttpResponse, HttpServer, web};
use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::admission::{Admission, AdmitError};
use crate::api::{
    ChatCompletionRequest, EmbeddingInput, EmbeddingsRequest, VertexPredictRequest, parse_json,
};
use crate::bert_gguf::DenseWeights;
use crate::chat;
use crate::chat_template::{ChatTemplate, TemplateError};
use crate::config::{Config, EmbedEngine};
use crate::embeddings::{EmbedError, EmbedModel, Embedded, Embedder};
use crate::engine::{EngineError, LlamaEngine};
use crate::error::ApiError;
use crate::generation::{GenerationQueue, SubmitError};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Chat(#[from] EngineError),
    #[error(transparent)]
    Embeddings(#[from] EmbedError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("cannot read the chat template {path}: {source}")]
    TemplateFile {
        path: String,
        source: std::io::Error,
    },
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
    /// The chat model's prompt template.
    pub template: Arc<ChatTemplate>,
    /// Set at SIGTERM: `/ready` answers 503 from then on.
    stopping: Arc<AtomicBool>,
}

impl AppState {
    /// Loads both models; the chat engine lives on the generator thread.
    pub fn load(config: Config) -> Result<Self, StartError> {
        let path = config.chat_model_path.clone();
        let (threads, context) = (config.threads, config.context_tokens);
        let (prefix_cache, speculation) = (config.prompt_cache, config.speculation);
        let chat = GenerationQueue::start(config.queue_capacity, config.pieces_every, move || {
            Ok(LlamaEngine::load(&path, threads, context)?
                .with_prefix_cache(prefix_cache)
                .with_speculation(speculation))
        })?;
        let embedder = Arc::new(match config.embed_engine {
            EmbedEngine::Fast => Embedder::load(
                &config.embed_model_dir,
                config.embed_threads,
                config
                    .embed_weights
                    .unwrap_or_else(DenseWeights::for_this_cpu),
            )?,
            EmbedEngine::Candle => Embedder::load_candle(&config.embed_model_dir)?,
        });
        Self::from_parts(config, chat, embedder)
    }

    /// Builds the app around any chat queue and embedder: the seam for other
    /// engines and for tests with controllable doubles.
    pub fn from_parts(
        config: Config,
        chat: GenerationQueue,
        embedder: Arc<dyn EmbedModel>,
    ) -> Result<Self, StartError> {
        let override_source =
            match &config.chat_template_path {
                Some(path) => Some(std::fs::read_to_string(path).map_err(|source| {
                    StartError::TemplateFile {
                        path: path.display().to_string(),
                        source,
                    }
                })?),
                None => None,
            };
        let template = ChatTemplate::for_model(chat.model_info(), override_source)?;
        tracing::info!(source = ?template.source(), "chat template loaded");
        let embed_admission = Arc::new(Admission::new(
            config.embed_concurrency,
            config.embed_queue_capacity,
        ));
        Ok(Self {
            config: Arc::new(config),
            chat,
            embedder,
            embed_admission,
            template: Arc::new(template),
            stopping: Arc::new(AtomicBool::new(false)),
        })
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
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .wrap(actix_web::middleware::from_fn(
                duo_telemetry::trace_requests,
            ))
            .configure(routes)
    })
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
        "chat_template": state.template.source(),
        "chat_context_tokens": state.chat.model_info().context_tokens,
        "embedding_model": state.config.embed_model_id,
        // Which build of llama.cpp's CPU code runs here (cpu_variant.rs).
        "cpu_variant": crate::engine::cpu_variant().ok().map(|v| v.name),
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

/// The chat model carries `context_length` (OpenRouter's and vLLM's name
/// for it, as `max_model_len`): the tokens its context holds, prompt and
/// answer together, so a client can size its prompts.
async fn list_models(state: web::Data<AppState>) -> HttpResponse {
    let model = |id: &str| json!({ "id": id, "object": "model", "created": 0, "owned_by": "duo-local-llm" });
    let mut chat = model(&state.config.chat_model_id);
    let context = state.chat.model_info().context_tokens;
    chat["context_length"] = json!(context);
    chat["max_model_len"] = json!(context);
    HttpResponse::Ok().json(json!({
        "object": "list",
        "data": [chat, model(&state.config.embed_model_id)],
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

async fn chat_completions(
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, state.config.max_body_bytes).await?;
    let request: ChatCompletionRequest = parse_json(&body)?;
    let prepared = chat::prepare(&state.config, &state.template, request)?;
    let mut events = state
        .chat
        .submit(prepared.generation.clone())
        .map_err(|e| match e {
            SubmitError::QueueFull => ApiError::QueueFull("chat"),
            SubmitError::Stopped => ApiError::Internal(e.to_string()),
        })?;
    let prompt_tokens = chat::await_start(&mut events).await?;
    let meta = chat::ResponseMeta::new(&state.config.chat_model_id, prompt_tokens);
    if prepared.stream {
        return Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header(("Cache-Control", "no-cache"))
            .streaming(chat::sse_stream(events, meta, prepared)));
    }
    Ok(HttpResponse::Ok().json(chat::complete(events, meta, &prepared).await?))
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
    // A question (a few short inputs) takes the small requests' lane and is
    // never queued behind an index's bulk batches.
    let admission = if crate::admission::is_small(&texts) {
        state.embed_admission.enter_small().await
    } else {
        state.embed_admission.enter().await
    };
    let admitted = admission.map_err(|e| match e {
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
