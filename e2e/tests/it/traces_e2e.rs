//! Traces and logs as an operator sees them: one chat question is one trace
//! from the client's GraphQL request through the queued job and the gateway
//! to the model call, exported over OTLP to a real receiver; and no log of
//! any process (nor the LLM debug log) keeps a secret.

use crate::fixtures::Scratch;
use e2e_tests::{Options, System, free_port};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ISSUE_TEXT: &str = "Users are logged out";

/// One span as the receiver got it.
#[derive(Debug, Clone)]
struct ReceivedSpan {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: HashMap<String, String>,
}

/// An OTLP/HTTP trace receiver (`POST /v1/traces`, protobuf) on loopback.
struct OtlpReceiver {
    url: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    _server: actix_web::dev::ServerHandle,
}

fn text_of(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

impl OtlpReceiver {
    async fn start() -> Self {
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let port = free_port().unwrap();
        let store = spans.clone();
        let server = actix_web::HttpServer::new(move || {
            let store = store.clone();
            actix_web::App::new()
                .app_data(actix_web::web::PayloadConfig::default().limit(16 * 1024 * 1024))
                .route(
                    "/v1/traces",
                    actix_web::web::post().to(move |body: actix_web::web::Bytes| {
                        let store = store.clone();
                        async move {
                            let Ok(request) = ExportTraceServiceRequest::decode(body.as_ref())
                            else {
                                return actix_web::HttpResponse::BadRequest().finish();
                            };
                            let mut received = store.lock().unwrap();
                            for resource_spans in request.resource_spans {
                                let service = resource_spans
                                    .resource
                                    .iter()
                                    .flat_map(|r| &r.attributes)
                                    .find(|kv| kv.key == "service.name")
                                    .map(|kv| text_of(kv.value.as_ref()))
                                    .unwrap_or_default();
                                for scope in resource_spans.scope_spans {
                                    for span in scope.spans {
                                        received.push(ReceivedSpan {
                                            service: service.clone(),
                                            name: span.name.clone(),
                                            trace_id: hex(&span.trace_id),
                                            span_id: hex(&span.span_id),
                                            parent_span_id: hex(&span.parent_span_id),
                                            attributes: span
                                                .attributes
                                                .iter()
                                                .map(|kv| {
                                                    (kv.key.clone(), text_of(kv.value.as_ref()))
                                                })
                                                .collect(),
                                        });
                                    }
                                }
                            }
                            actix_web::HttpResponse::Ok()
                                .content_type("application/x-protobuf")
                                .body(ExportTraceServiceResponse::default().encode_to_vec())
                        }
                    }),
                )
        })
        .workers(1)
        .bind(("127.0.0.1", port))
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            url: format!("http://127.0.0.1:{port}"),
            spans,
            _server: handle,
        }
    }

    fn spans_of(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect()
    }

    /// Waits until the trace holds a span matching `want` (exports are batched).
    async fn wait_for(
        &self,
        trace_id: &str,
        what: &str,
        want: impl Fn(&ReceivedSpan) -> bool,
    ) -> ReceivedSpan {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(span) = self.spans_of(trace_id).into_iter().find(|s| want(s)) {
                return span;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} in trace {trace_id}; received: {:#?}",
                self.spans_of(trace_id)
                    .iter()
                    .map(|s| format!("{} {} ({})", s.service, s.name, s.span_id))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn otel_env(receiver: &OtlpReceiver) -> Vec<(String, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), receiver.url.clone()),
        // Export batches quickly so the test does not wait for the default 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "50".into()),
    ]
}

#[tokio::test]
async fn one_question_is_one_trace_from_the_client_to_the_model_and_back() {
    let receiver = OtlpReceiver::start().await;
    let system = System::start_with(Options {
        gateway_env: otel_env(&receiver),
        monolith_env: otel_env(&receiver),
        // Its job is part of the trace too.
        categorize_questions: true,
        ..Options::default()
    })
    .await
    .unwrap();
    system.fake.push_text(
        "Thought: I need the issue.\nAction: issue_reader\nAction Input: Summarise acme/platform/api#1",
    );
    system
        .fake
        .set_default_text("Thought: I have it.\nFinal Answer: Old sessions break the login.");
    let alice = system.token("alice").unwrap();

    // The client's own trace: every span of the answer must belong to it.
    let trace_id = format!("{:032x}", rand_u128());
    let client_span = "00f067aa0ba902b7";
    let response: serde_json::Value = system
        .http
        .post(format!("{}/api/graphql", system.web_url))
        .bearer_auth(&alice)
        .header("traceparent", format!("00-{trace_id}-{client_span}-01"))
        .json(&json!({
            "query": "mutation($input: AiActionInput!) { aiAction(input: $input) { requestId errors } }",
            "variables": { "input": { "chat": { "content": "Summarise acme/platform/api#1" } } },
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let request_id = response["data"]["aiAction"]["requestId"]
        .as_str()
        .unwrap_or_else(|| panic!("{response}"))
        .to_owned();
    let answer = system.answer(&alice, &request_id).await.unwrap();
    assert_eq!(
        answer["content"], "Old sessions break the login.",
        "{answer}"
    );

    // The GraphQL request continues the client's span.
    let graphql = receiver
        .wait_for(&trace_id, "GraphQL request span", |s| {
            s.service == "duo-monolith-web" && s.name == "POST /api/graphql"
        })
        .await;
    assert_eq!(graphql.parent_span_id, client_span);
    // The queued job runs in the worker as a child of that request.
    let job = receiver
        .wait_for(&trace_id, "job span", |s| {
            s.service == "duo-monolith-worker" && s.name.starts_with("job ")
        })
        .await;
    let job_ancestor_is_graphql = {
        let spans = receiver.spans_of(&trace_id);
        let mut parent = job.parent_span_id.clone();
        let mut found = false;
        for _ in 0..10 {
            if parent == graphql.span_id {
                found = true;
                break;
            }
            match spans.iter().find(|s| s.span_id == parent) {
                Some(span) => parent = span.parent_span_id.clone(),
                None => break,
            }
        }
        found
    };
    assert!(
        job_ancestor_is_graphql,
        "the job does not descend from the request: {job:?}"
    );
    // Agent steps and the tool, with its resource type and no content.
    let step = receiver
        .wait_for(&trace_id, "agent step", |s| s.name == "agent.step")
        .await;
    assert_eq!(step.service, "duo-monolith-worker");
    let tool = receiver
        .wait_for(&trace_id, "tool span", |s| {
            s.name == "execute_tool issue_reader"
        })
        .await;
    assert_eq!(tool.attributes["gen_ai.tool.name"], "issue_reader");
    assert_eq!(tool.attributes["duo.resource_type"], "issue");
    // The gateway continues the worker's call and makes the model call.
    let agent_call = receiver
        .wait_for(&trace_id, "gateway request span", |s| {
            s.service == "duo-gateway" && s.name == "POST /v2/chat/agent"
        })
        .await;
    assert_eq!(
        receiver
            .spans_of(&trace_id)
            .iter()
            .find(|s| s.span_id == agent_call.parent_span_id)
            .map(|s| s.name.as_str()),
        Some("agent.step"),
        "the gateway call is not a child of the agent step"
    );
    // The model call runs while the answer streams, still in the request's span.
    let model = receiver
        .wait_for(&trace_id, "model call span under /v2/chat/agent", |s| {
            s.service == "duo-gateway"
                && s.name.starts_with("chat ")
                && s.parent_span_id == agent_call.span_id
        })
        .await;
    assert!(!model.attributes["gen_ai.request.model"].is_empty());
    assert!(
        model.attributes.contains_key("duo.time_to_first_token_ms"),
        "{model:?}"
    );
    assert!(
        model.attributes.contains_key("gen_ai.usage.output_tokens"),
        "{model:?}"
    );
    // The provider got the model span as its parent.
    let traceparents: Vec<String> = system
        .fake
        .requests()
        .iter()
        .filter_map(|r| {
            r.headers
                .iter()
                .find(|(name, _)| name == "traceparent")
                .map(|(_, v)| v.clone())
        })
        .collect();
    assert!(
        traceparents.iter().any(|tp| tp.contains(&trace_id)),
        "no provider call carried the trace: {traceparents:?}"
    );
    // The trace as a tree, for people reading the test's output (and the docs).
    println!("{}", tree(&receiver.spans_of(&trace_id), client_span));
    // Content stays out of spans unless the operator opts in.
    for span in receiver.spans_of(&trace_id) {
        for value in span.attributes.values() {
            assert!(!value.contains(ISSUE_TEXT), "content exported on {span:?}");
        }
    }
}

/// The spans under `root`, indented by depth, with their service.
fn tree(spans: &[ReceivedSpan], root: &str) -> String {
    fn walk(spans: &[ReceivedSpan], parent: &str, depth: usize, out: &mut String) {
        for span in spans.iter().filter(|s| s.parent_span_id == parent) {
            let keys = [
                "gen_ai.tool.name",
                "duo.resource_type",
                "gen_ai.request.model",
                "duo.time_to_first_token_ms",
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.output_tokens",
                "duo.agent.next",
                "http.response.status_code",
            ];
            let attributes: Vec<String> = keys
                .iter()
                .filter_map(|k| span.attributes.get(*k).map(|v| format!("{k}={v}")))
                .collect();
            out.push_str(&format!(
                "{}{} [{}] {}\n",
                "  ".repeat(depth),
                span.name,
                span.service,
                attributes.join(" ")
            ));
            walk(spans, &span.span_id, depth + 1, out);
        }
    }
    let mut out = String::new();
    walk(spans, root, 0, &mut out);
    out
}

fn rand_u128() -> u128 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(1);
    nanos ^ (u128::from(std::process::id()) << 64) | 1
}

#[tokio::test]
async fn no_log_keeps_a_secret_and_the_llm_debug_log_has_every_model_call() {
    let scratch = Scratch::new("llm-debug");
    let llm_log = scratch.path().join("log/llm_debug.log");
    let api_key = "sk-ant-e2e-SEEDEDSECRETKEY0123";
    let system = System::start_with(Options {
        gateway_env: vec![
            ("ANTHROPIC_API_KEY".into(), api_key.into()),
            ("LLM_DEBUG".into(), "1".into()),
            ("LLM_DEBUG_LOG".into(), llm_log.display().to_string()),
            ("AIGW_LOGGING__LEVEL".into(), "trace".into()),
        ],
        monolith_env: vec![("RUST_LOG".into(), "debug".into())],
        ..Options::default()
    })
    .await
    .unwrap();
    system
        .fake
        .set_default_text("Thought: easy.\nFinal Answer: Noted.");
    let alice = system.token("alice").unwrap();
    let password = system.password("alice").unwrap();
    // A user pastes secrets into a question: they reach the model (that is
    // the user's choice) but must not be written to any log.
    let question = format!(
        "My token is {alice} and our key is {api_key}; password: {password} - is that safe?"
    );
    let answer = system
        .ask_and_wait(&alice, json!({ "content": question }))
        .await
        .unwrap();
    assert_eq!(answer["content"], "Noted.", "{answer}");
    assert!(
        system.provider_bodies().iter().any(|b| b.contains(&alice)),
        "the question did not reach the model, so this test proves nothing"
    );

    // The debug log: one request and one response record per model call,
    // with the request id and the prompt (redacted).
    let debug = std::fs::read_to_string(&llm_log).unwrap();
    let records: Vec<serde_json::Value> = debug
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let requests: Vec<_> = records.iter().filter(|r| r["kind"] == "request").collect();
    let responses: Vec<_> = records.iter().filter(|r| r["kind"] == "response").collect();
    assert!(!requests.is_empty(), "{debug}");
    assert_eq!(requests.len(), responses.len(), "{debug}");
    assert!(
        requests[0]["request_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{debug}"
    );
    assert!(
        requests[0]["prompt"]
            .as_str()
            .unwrap()
            .contains("is that safe?")
    );
    assert!(
        responses
            .iter()
            .any(|r| r["answer"].as_str().unwrap().contains("Noted."))
    );

    let mut logs = vec![
        ("llm debug log", debug),
        ("gateway", system.gateway.log_tail(usize::MAX)),
        ("web", system.web.log_tail(usize::MAX)),
    ];
    if let Some(worker) = &system.worker {
        logs.push(("worker", worker.log_tail(usize::MAX)));
    }
    for (name, text) in &logs {
        for secret in [alice.as_str(), api_key, password.as_str()] {
            assert!(!text.contains(secret), "the {name} log keeps a secret");
        }
    }
}
