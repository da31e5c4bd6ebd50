//! GraphQL over WebSocket (`graphql-transport-ws`, and the legacy `graphql-ws`
//! that older clients pick with `Sec-WebSocket-Protocol: graphql-ws`).
//!
//! juniper runs the protocol; this module sits between the socket and juniper so
//! that every `subscribe` (`start` in the legacy protocol) document passes the
//! same checks as an HTTP document before juniper sees it: size, depth and
//! complexity with fragments expanded (anonymous limits, the strictest, since a
//! socket's user is known only after `connection_init`), and no NUL characters.
//! A refused document gets the protocol's `error` message for its id; the
//! socket stays open for the others.

use std::pin::pin;
use std::sync::Arc;

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};
use futures::{SinkExt as _, StreamExt as _, future};
use juniper::DefaultScalarValue;
use juniper_graphql_ws::{ArcSchema, Init, graphql_transport_ws, graphql_ws};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Schema;
use super::limits::{self, Caller, LimitError};

/// Largest single frame a client may send; a subscription document with its
/// variables is a few kilobytes.
const MAX_FRAME_BYTES: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Protocol {
    TransportWs,
    LegacyWs,
}

impl Protocol {
    fn of(req: &HttpRequest) -> Self {
        let legacy = req
            .headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|p| p.trim() == "graphql-ws"));
        if legacy {
            Protocol::LegacyWs
        } else {
            Protocol::TransportWs
        }
    }

    fn name(self) -> &'static str {
        match self {
            Protocol::TransportWs => "graphql-transport-ws",
            Protocol::LegacyWs => "graphql-ws",
        }
    }

    /// The operation-starting message type of the protocol.
    fn start_type(self) -> &'static str {
        match self {
            Protocol::TransportWs => "subscribe",
            Protocol::LegacyWs => "start",
        }
    }

    fn error_frame(self, id: &str, error: &LimitError) -> String {
        let payload = json!({ "message": error.message, "extensions": { "code": error.code } });
        match self {
            Protocol::TransportWs => json!({ "type": "error", "id": id, "payload": [payload] }),
            Protocol::LegacyWs => json!({ "type": "error", "id": id, "payload": payload }),
        }
        .to_string()
    }
}

/// What a client frame is, once checked.
enum Checked {
    /// Hand it to juniper.
    Forward(actix_ws::Message),
    /// Refuse this operation with an error frame, keep the socket.
    Refuse(String),
}

/// Checks an operation-starting frame's document; every other frame passes.
fn check_frame(protocol: Protocol, message: actix_ws::Message) -> Checked {
    let bytes = match &message {
        actix_ws::Message::Text(text) => text.as_bytes(),
        actix_ws::Message::Binary(bytes) => bytes.as_ref(),
        _ => return Checked::Forward(message),
    };
    let Ok(value) = serde_json::from_slice::<Value>(bytes) else {
        // juniper answers malformed frames as its protocol says (close 4400).
        return Checked::Forward(message);
    };
    if value.get("type").and_then(Value::as_str) != Some(protocol.start_type()) {
        return Checked::Forward(message);
    }
    let id = value.get("id").and_then(Value::as_str).unwrap_or_default();
    let refuse = |error: LimitError| Checked::Refuse(protocol.error_frame(id, &error));
    if bytes.len() > MAX_FRAME_BYTES {
        return refuse(LimitError {
            code: "QUERY_TOO_LARGE",
            message: format!("Message is too large (maximum is {MAX_FRAME_BYTES} bytes)"),
        });
    }
    let payload = value.get("payload").cloned().unwrap_or(Value::Null);
    if limits::json_has_nul(&payload) {
        return refuse(LimitError {
            code: "GRAPHQL_VALIDATION_FAILED",
            message: "Invalid input: NUL characters are not allowed".to_owned(),
        });
    }
    let query = payload
        .get("query")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let operation = payload.get("operationName").and_then(Value::as_str);
    match limits::check_document(Caller::Anonymous, query, operation) {
        Ok(_) => Checked::Forward(message),
        Err(error) => refuse(error),
    }
}

/// A client frame in the form juniper's connections take.
struct Frame(actix_ws::Message);

#[derive(Debug, thiserror::Error)]
enum FrameError {
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
    #[error("unexpected message from the client")]
    Unexpected,
}

impl TryFrom<Frame> for graphql_transport_ws::Input<DefaultScalarValue> {
    type Error = FrameError;

    fn try_from(frame: Frame) -> Result<Self, Self::Error> {
        match frame.0 {
            actix_ws::Message::Text(text) => {
                Ok(Self::Message(serde_json::from_slice(text.as_bytes())?))
            }
            actix_ws::Message::Binary(bytes) => Ok(Self::Message(serde_json::from_slice(&bytes)?)),
            actix_ws::Message::Close(_) => Ok(Self::Close),
            _ => Err(FrameError::Unexpected),
        }
    }
}

impl TryFrom<Frame> for graphql_ws::ClientMessage<DefaultScalarValue> {
    type Error = FrameError;

    fn try_from(frame: Frame) -> Result<Self, Self::Error> {
        match frame.0 {
            actix_ws::Message::Text(text) => Ok(serde_json::from_slice(text.as_bytes())?),
            actix_ws::Message::Binary(bytes) => Ok(serde_json::from_slice(&bytes)?),
            actix_ws::Message::Close(_) => Ok(Self::ConnectionTerminate),
            _ => Err(FrameError::Unexpected),
        }
    }
}

/// An outgoing frame: text to send, or the close that ends the socket.
enum Outgoing {
    Text(String),
    Close(u16, String),
    /// juniper finished: close normally.
    End,
}

/// Upgrades the request and serves the protocol the client asked for.
pub(crate) async fn serve<I>(
    req: HttpRequest,
    payload: web::Payload,
    schema: Arc<Schema>,
    init: I,
    lifecycle: crate::lifecycle::Lifecycle,
) -> Result<HttpResponse, actix_web::Error>
where
    I: Init<DefaultScalarValue, super::GqlContext> + Send,
{
    let protocol = Protocol::of(&req);
    let (mut response, mut ws_tx, ws_rx) = actix_ws::handle(&req, payload)?;
    let ws_rx = ws_rx.max_frame_size(MAX_FRAME_BYTES * 2);
    let (refusals_tx, refusals_rx) = mpsc::unbounded_channel::<Outgoing>();
    // Frames juniper should see; refusals go straight to the client.
    let incoming = ws_rx.filter_map(move |item| {
        let out = match item {
            Ok(message) => match check_frame(protocol, message) {
                Checked::Forward(message) => Some(Ok(Frame(message))),
                Checked::Refuse(text) => {
                    let _ = refusals_tx.send(Outgoing::Text(text));
                    None
                }
            },
            // A protocol error ends the input; juniper then ends the output.
            Err(e) => Some(Err(e)),
        };
        future::ready(out)
    });
    let refusals = tokio_stream::wrappers::UnboundedReceiverStream::new(refusals_rx);

    match protocol {
        Protocol::TransportWs => {
            let (sink, stream) =
                graphql_transport_ws::Connection::new(ArcSchema(schema), init).split();
            let answers = stream.map(|output| match output {
                graphql_transport_ws::Output::Message(m) => {
                    Outgoing::Text(serde_json::to_string(&m).unwrap_or_default())
                }
                graphql_transport_ws::Output::Close { code, message } => {
                    Outgoing::Close(code, message)
                }
            });
            let answers = answers.chain(futures::stream::once(future::ready(Outgoing::End)));
            let outgoing = futures::stream::select(answers, refusals);
            actix_web::rt::spawn(async move {
                let input = incoming.forward(sink.sink_map_err(|e| match e {}));
                let output = pin!(send_all(&mut ws_tx, outgoing, lifecycle));
                let _ = future::select(pin!(input), output).await;
            });
        }
        Protocol::LegacyWs => {
            let (sink, stream) = graphql_ws::Connection::new(ArcSchema(schema), init).split();
            let answers =
                stream.map(|m| Outgoing::Text(serde_json::to_string(&m).unwrap_or_default()));
            let answers = answers.chain(futures::stream::once(future::ready(Outgoing::End)));
            let outgoing = futures::stream::select(answers, refusals);
            actix_web::rt::spawn(async move {
                let input = incoming.forward(sink.sink_map_err(|e| match e {}));
                let output = pin!(send_all(&mut ws_tx, outgoing, lifecycle));
                let _ = future::select(pin!(input), output).await;
            });
        }
    }
    response.headers_mut().insert(
        HeaderName::from_static("sec-websocket-protocol"),
        HeaderValue::from_static(protocol.name()),
    );
    Ok(response)
}

/// Close code telling the client the server is restarting: reconnect (to
/// another replica) and subscribe again.
const SERVICE_RESTART: u16 = 1012;

async fn send_all(
    ws_tx: &mut actix_ws::Session,
    outgoing: impl futures::Stream<Item = Outgoing>,
    lifecycle: crate::lifecycle::Lifecycle,
) {
    let mut outgoing = pin!(outgoing);
    let mut stopping = pin!(lifecycle.stopped());
    loop {
        let frame = tokio::select! {
            frame = outgoing.next() => frame,
            () = &mut stopping => Some(Outgoing::Close(
                SERVICE_RESTART,
                "Server restarting: reconnect".to_owned(),
            )),
        };
        let Some(frame) = frame else { break };
        match frame {
            Outgoing::Text(text) => {
                if ws_tx.text(text).await.is_err() {
                    return;
                }
            }
            Outgoing::Close(code, message) => {
                let _ = ws_tx
                    .clone()
                    .close(Some(actix_ws::CloseReason {
                        code: code.into(),
                        description: Some(message),
                    }))
                    .await;
                return;
            }
            Outgoing::End => break,
        }
    }
    let _ = ws_tx
        .clone()
        .close(Some((actix_ws::CloseCode::Normal, "Normal Closure").into()))
        .await;
}
