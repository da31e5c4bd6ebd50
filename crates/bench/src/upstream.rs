//! A minimal model provider on loopback: OpenAI-compatible chat completions
//! (streamed) and Vertex AI predict / serverStreamingPredict. It answers at
//! once, so everything the bench measures beyond it is gateway time.
//!
//! To be replaced by the `fake-provider` crate once it has a library API.

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use bytes::Bytes;
use std::net::TcpListener;

const CHAT_CHUNKS: &[&str] = &[
    "data: {\"id\":\"b\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Thought: done\\nFinal Answer: \"}}]}\n\n",
    "data: {\"id\":\"b\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"It prints hello.\"}}]}\n\n",
    "data: {\"id\":\"b\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
];

async fn chat_completions() -> HttpResponse {
    let chunks = futures::stream::iter(
        CHAT_CHUNKS
            .iter()
            .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c.as_bytes()))),
    );
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(chunks)
}

async fn models() -> HttpResponse {
    HttpResponse::Ok()
        .json(serde_json::json!({"object": "list", "data": [{"id": "smollm2", "object": "model"}]}))
}

async fn vertex(req: HttpRequest) -> HttpResponse {
    if req.path().ends_with(":serverStreamingPredict") {
        let chunks = futures::stream::iter((0..3).map(|i| {
            Ok::<_, std::io::Error>(Bytes::from(format!(
                "data: {{\"outputs\":[{{\"structVal\":{{\"content\":{{\"stringVal\":[\"part {i}\"]}}}}}}]}}\n\n"
            )))
        }));
        return HttpResponse::Ok()
            .content_type("text/event-stream")
            .streaming(chunks);
    }
    HttpResponse::Ok().json(serde_json::json!({
        "predictions": [{"embeddings": {"values": [0.1, 0.2, 0.3, 0.4], "statistics": {"token_count": 4}}}]
    }))
}

/// Serves on its own thread and actix system; returns the base URL.
pub fn spawn() -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    let server = HttpServer::new(|| {
        App::new()
            .route("/v1/chat/completions", web::post().to(chat_completions))
            .route("/v1/models", web::get().to(models))
            .default_service(web::post().to(vertex))
    })
    .workers(1)
    .listen(listener)?
    .run();
    std::thread::spawn(move || actix_web::rt::System::new().block_on(server));
    Ok(url)
}
