//! Shared by the `app_*` and `proxy_*` tests: a gateway on 127.0.0.1:0 with a
//! test identity, and a scriptable upstream stub.
#![allow(dead_code)]
#![expect(
    clippy::unwrap_used,
    reason = "test support: failing loudly is the point"
)]

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::{Next, from_fn};
use actix_web::{App, Error, HttpMessage, HttpRequest, HttpResponse, HttpServer, web};
use bytes::Bytes;
use gateway::Config;
use gateway::app::configure_app;
use gateway::app_state::AppState;
use gateway::auth::GatewayUser;
use gateway::observability::request_telemetry;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

/// The test caller's scopes, comma-separated; `*` for a debug user. No
/// header: no identity (as if authentication had not run).
pub const TEST_SCOPES: &str = "x-test-scopes";

/// The model endpoints the test caller's token vouches for (the monolith's
/// `model_endpoints` claim), comma-separated.
pub const TEST_MODEL_ENDPOINTS: &str = "x-test-model-endpoints";

/// What the monolith does for a request it sends: vouch for the endpoint
/// of the model named in its body (empty when it names none).
pub fn vouched_by(body: &serde_json::Value) -> String {
    body["model_metadata"]["endpoint"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Stands in for the authentication middleware: the caller is whoever
/// [`TEST_SCOPES`] and [`TEST_MODEL_ENDPOINTS`] say (`wrap(from_fn(test_identity))`).
pub async fn test_identity(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    if let Some(scopes) = req.headers().get(TEST_SCOPES).and_then(|v| v.to_str().ok()) {
        let mut user = if scopes == "*" {
            GatewayUser::debug()
        } else {
            GatewayUser::with_scopes(
                scopes
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            )
        };
        if let Some(endpoints) = req
            .headers()
            .get(TEST_MODEL_ENDPOINTS)
            .and_then(|v| v.to_str().ok())
        {
            user.model_endpoints = gateway::auth::vouched_endpoints(Some(
                endpoints.split(',').map(str::to_owned).collect(),
            ));
        }
        req.extensions_mut().insert(user);
    }
    next.call(req).await
}

#[derive(Debug, Deserialize)]
struct TypedBody {
    #[allow(dead_code)]
    count: u32,
}

/// A route that takes a typed JSON body, for the app-wide body rules.
async fn typed_json(body: web::Json<TypedBody>) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "count": body.count }))
}

/// Starts the gateway app; returns its base URL.
pub fn spawn_gateway(config: Config) -> String {
    let state = AppState::build(config).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = HttpServer::new(move || {
        App::new()
            .wrap(from_fn(test_identity))
            .wrap(from_fn(request_telemetry))
            .route("/test/typed-json", web::post().to(typed_json))
            .configure(|cfg| configure_app(cfg, &state))
    })
    .workers(1)
    .listen(listener)
    .unwrap()
    .run();
    actix_web::rt::spawn(server);
    format!("http://{addr}")
}

/// A port nothing listens on.
pub fn closed_port_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// A configuration whose model is the bundled local model server at `url`
/// (the gateway's default when no provider is set), plus `extra` settings.
pub fn local_model_config(url: &str, extra: &[(&str, &str)]) -> Config {
    let local = format!("{url}/v1");
    let mut vars = vec![("AIGW_LOCAL_LLM__URL", local.as_str())];
    vars.extend_from_slice(extra);
    Config::for_tests(&vars).unwrap()
}

/// [`local_model_config`] with nothing listening there: no model answers.
pub fn offline_config(extra: &[(&str, &str)]) -> Config {
    local_model_config(&closed_port_url(), extra)
}

/// POSTs `body` as JSON from a caller with `scopes`: the status and the
/// JSON answer.
pub async fn post_json(
    gw: &str,
    path: &str,
    scopes: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(format!("{gw}{path}"))
        .header(TEST_SCOPES, scopes)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[derive(Debug, Clone)]
pub struct Recorded {
    /// Path and query as received.
    pub target: String,
    pub headers: BTreeMap<String, String>,
    pub body: Bytes,
}

/// The upstream stand-in: records every request; answers JSON echoing the
/// body with an extra header the gateway must not pass back; answers with
/// `stub_status` from the body when set; streams in two parts, the second
/// only after [`Upstream::release`], when the body asks for streaming; under
/// `/redirect/<port>/` answers 307 to that port on loopback.
#[derive(Clone)]
pub struct Upstream {
    pub url: String,
    pub recorded: Arc<Mutex<Vec<Recorded>>>,
    gate: Arc<Semaphore>,
}

impl Upstream {
    pub fn requests(&self) -> Vec<Recorded> {
        self.recorded.lock().unwrap().clone()
    }
    pub fn release(&self) {
        self.gate.add_permits(1);
    }
}

type StubState = (Arc<Mutex<Vec<Recorded>>>, Arc<Semaphore>);

async fn upstream_handler(
    req: HttpRequest,
    body: Bytes,
    stub: web::Data<StubState>,
) -> HttpResponse {
    let (recorded, gate) = stub.get_ref().clone();
    let target = match req.query_string() {
        "" => req.path().to_owned(),
        q => format!("{}?{q}", req.path()),
    };
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    recorded.lock().unwrap().push(Recorded {
        target: target.clone(),
        headers,
        body: body.clone(),
    });
    // `/redirect/<port>/...`: a provider that sends its callers elsewhere.
    if let Some(port) = target
        .strip_prefix("/redirect/")
        .and_then(|rest| rest.split('/').next())
    {
        return HttpResponse::TemporaryRedirect()
            .insert_header(("location", format!("http://127.0.0.1:{port}/stolen")))
            .finish();
    }
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let streaming =
        json["stream"] == serde_json::json!(true) || target.contains(":serverStreamingPredict");
    if streaming {
        let stream = async_stream::stream! {
            yield Ok::<_, std::io::Error>(Bytes::from_static(b"data: first\n\n"));
            let _permit = gate.acquire().await;
            yield Ok(Bytes::from_static(b"data: second\n\n"));
        };
        return HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header(("x-upstream-secret", "1"))
            .streaming(stream);
    }
    let status = json["stub_status"].as_u64().unwrap_or(200) as u16;
    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
        .insert_header(("x-upstream-secret", "1"))
        .json(serde_json::json!({ "echo": json, "target": target }))
}

pub fn spawn_upstream() -> Upstream {
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Semaphore::new(0));
    let data = web::Data::new((recorded.clone(), gate.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .default_service(web::to(upstream_handler))
    })
    .workers(1)
    .listen(listener)
    .unwrap()
    .run();
    actix_web::rt::spawn(server);
    Upstream {
        url: format!("http://{addr}"),
        recorded,
        gate,
    }
}
