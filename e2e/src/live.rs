//! `aiCompletionResponse` subscriptions over a real WebSocket
//! (`graphql-transport-ws`), as a browser tab holds them.

use crate::{HarnessError, Result};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const SUBSCRIPTION: &str = "subscription aiCompletionResponse($userId: UserID, $clientSubscriptionId: String, $aiAction: AiAction) {
  aiCompletionResponse(userId: $userId, aiAction: $aiAction, clientSubscriptionId: $clientSubscriptionId) {
    id requestId content errors role type chunkId extras { sources }
  }
}";

/// What a subscription listens to.
#[derive(Debug, Clone)]
pub enum Topic {
    /// Streamed chunks (and the final message) of requests sent with this
    /// `clientSubscriptionId`.
    Client(String),
    /// Every full message of the user's chat (`aiAction: CHAT`).
    UserChat,
}

/// One open subscription.
pub struct Subscription {
    socket: Socket,
}

impl Subscription {
    /// Connects to `web_url`'s `/api/graphql`, authenticates with `token` in
    /// `connection_init`, and subscribes for `user_gid` to `topic`.
    pub async fn open(web_url: &str, token: &str, user_gid: &str, topic: Topic) -> Result<Self> {
        let ws_url = format!("{}/api/graphql", web_url.replacen("http://", "ws://", 1));
        let mut request = ws_url
            .into_client_request()
            .map_err(|e| HarnessError::Failed(format!("websocket request: {e}")))?;
        request.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            http_value("graphql-transport-ws")?,
        );
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .map_err(|e| HarnessError::Failed(format!("websocket connect: {e}")))?;
        let mut subscription = Self { socket };
        subscription
            .send(json!({
                "type": "connection_init",
                "payload": { "Authorization": format!("Bearer {token}") },
            }))
            .await?;
        let ack = subscription.next_frame(Duration::from_secs(10)).await?;
        if ack["type"] != "connection_ack" {
            return Err(HarnessError::Failed(format!("no connection_ack: {ack}")));
        }
        let variables = match topic {
            Topic::Client(id) => {
                json!({ "userId": user_gid, "aiAction": "CHAT", "clientSubscriptionId": id })
            }
            Topic::UserChat => json!({ "userId": user_gid, "aiAction": "CHAT" }),
        };
        subscription
            .send(json!({
                "id": "1",
                "type": "subscribe",
                "payload": { "query": SUBSCRIPTION, "variables": variables },
            }))
            .await?;
        Ok(subscription)
    }

    async fn send(&mut self, message: Value) -> Result<()> {
        self.socket
            .send(Message::text(message.to_string()))
            .await
            .map_err(|e| HarnessError::Failed(format!("websocket send: {e}")))
    }

    /// The next protocol message other than keep-alives.
    async fn next_frame(&mut self, within: Duration) -> Result<Value> {
        let deadline = Instant::now() + within;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .map_err(|_| HarnessError::Failed(format!("no message within {within:?}")))?;
            match frame {
                Some(Ok(Message::Text(text))) => {
                    let value: Value = serde_json::from_str(text.as_str())?;
                    if matches!(value["type"].as_str(), Some("ping" | "pong" | "ka")) {
                        if value["type"] == "ping" {
                            self.send(json!({ "type": "pong" })).await?;
                        }
                        continue;
                    }
                    return Ok(value);
                }
                Some(Ok(Message::Close(reason))) => {
                    return Err(HarnessError::Failed(format!("socket closed: {reason:?}")));
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(HarnessError::Failed(format!("socket: {e}"))),
                None => return Err(HarnessError::Failed("socket closed".into())),
            }
        }
    }

    /// Waits for the server to close the socket; returns the close code.
    pub async fn closed(&mut self, within: Duration) -> Result<Option<u16>> {
        let deadline = Instant::now() + within;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .map_err(|_| HarnessError::Failed(format!("not closed within {within:?}")))?;
            match frame {
                Some(Ok(Message::Close(reason))) => return Ok(reason.map(|r| u16::from(r.code))),
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return Ok(None),
            }
        }
    }

    /// The next `AiMessage` delivered on this subscription.
    pub async fn next_message(&mut self, within: Duration) -> Result<Value> {
        let frame = self.next_frame(within).await?;
        if frame["type"] != "next" {
            return Err(HarnessError::Failed(format!("unexpected frame: {frame}")));
        }
        Ok(frame["payload"]["data"]["aiCompletionResponse"].clone())
    }

    /// Messages until the assistant's full answer (no `chunkId`) to
    /// `request_id`; returns the chunks of that request in arrival order and
    /// the answer. Messages of other requests are skipped.
    pub async fn collect_answer(
        &mut self,
        request_id: &str,
        within: Duration,
    ) -> Result<(Vec<Value>, Value)> {
        let deadline = Instant::now() + within;
        let mut chunks = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let message = self.next_message(left).await?;
            if message["requestId"] != request_id || message["role"] != "ASSISTANT" {
                continue;
            }
            if message["chunkId"].is_null() {
                return Ok((chunks, message));
            }
            chunks.push(message);
        }
    }
}

fn http_value(text: &str) -> Result<tokio_tungstenite::tungstenite::http::HeaderValue> {
    text.parse()
        .map_err(|e| HarnessError::Failed(format!("header value {text:?}: {e}")))
}
