//! Pub/sub over PostgreSQL NOTIFY: every process that runs a [`Subscriber`] receives
//! every message published on any connection, in publish order.
//!
//! Messages travel on the NOTIFY channel [`PUBSUB_CHANNEL`] as
//! `{"topic": .., "payload": ..}`; when that exceeds [`MAX_INLINE_BYTES`] the payload
//! is stored in `pubsub_messages` and the notification carries `{"topic", "id"}`.
//! One message for several topics ([`publish_to`]) is one notification that
//! names the others in `"also"`: every NOTIFY is signalled to and read by every
//! listening process, so one instead of two halves that work.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{broadcast, oneshot};
use tokio_postgres::GenericClient;

use crate::QueueError;

/// The NOTIFY channel of the bus.
pub const PUBSUB_CHANNEL: &str = "duo_pubsub";
/// NOTIFY payloads must stay under 8000 bytes; larger ones go by id.
pub const MAX_INLINE_BYTES: usize = 7500;
/// Stored large payloads are deleted after this long.
pub const STORED_MESSAGE_TTL: Duration = Duration::from_secs(600);

#[derive(Serialize)]
struct Envelope<'a, P: Serialize + ?Sized = Value> {
    topic: &'a str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    also: &'a [&'a str],
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a P>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<i64>,
}

/// The NOTIFY text that carries `payload` on `topic` by itself, or `None`
/// when it is too large and must go through [`publish`] (stored by id).
/// Callers with their own prepared statements send it with
/// `SELECT pg_notify(PUBSUB_CHANNEL, text)`.
pub fn inline_notification<P: Serialize + ?Sized>(
    topic: &str,
    payload: &P,
) -> Result<Option<String>, QueueError> {
    inline_notification_to(topic, &[], payload)
}

/// [`inline_notification`] for `topic` and the topics in `also` at once. The
/// payload is written straight into the text (a typed message needs no JSON
/// value built first).
pub fn inline_notification_to<P: Serialize + ?Sized>(
    topic: &str,
    also: &[&str],
    payload: &P,
) -> Result<Option<String>, QueueError> {
    let text = serde_json::to_string(&Envelope {
        topic,
        also,
        payload: Some(payload),
        id: None,
    })?;
    Ok((text.len() <= MAX_INLINE_BYTES).then_some(text))
}

/// Publishes `payload` on `topic`. Inside a transaction, delivery happens at commit.
pub async fn publish<C: GenericClient>(
    client: &C,
    topic: &str,
    payload: &Value,
) -> Result<(), QueueError> {
    publish_to(client, topic, &[], payload).await
}

/// Publishes `payload` on `topic` and on every topic in `also`, in one
/// notification (and one stored row when it is large).
pub async fn publish_to<C: GenericClient>(
    client: &C,
    topic: &str,
    also: &[&str],
    payload: &Value,
) -> Result<(), QueueError> {
    let text = if let Some(inline) = inline_notification_to(topic, also, payload)? {
        inline
    } else {
        let row = client
            .query_one(
                "INSERT INTO pubsub_messages (topic, payload) VALUES ($1, $2) RETURNING id",
                &[&topic, payload],
            )
            .await?;
        let id: i64 = row.get(0);
        // Occasional clean-up keeps the table small without a separate job.
        if id % 64 == 0 {
            client
                .execute(
                    "DELETE FROM pubsub_messages WHERE created_at < now() - $1 * interval '1 second'",
                    &[&STORED_MESSAGE_TTL.as_secs_f64()],
                )
                .await?;
        }
        serde_json::to_string(&Envelope::<Value> {
            topic,
            also,
            payload: None,
            id: Some(id),
        })?
    };
    client
        .execute("SELECT pg_notify($1, $2)", &[&PUBSUB_CHANNEL, &text])
        .await?;
    Ok(())
}

/// Abandoned topics are cleaned up from this many topics on.
const MIN_PRUNE_AT: usize = 64;

type Topics = Arc<Mutex<HashMap<String, broadcast::Sender<Value>>>>;

/// Listens on one connection (reconnecting when it drops) and fans messages out to
/// in-process receivers per topic. Dropping it stops the listener.
pub struct Subscriber {
    topics: Topics,
    capacity: usize,
    prune_at: AtomicUsize,
    _stop: oneshot::Sender<()>,
}

impl Subscriber {
    /// Connects and returns once LISTEN is active (messages published after this
    /// returns are delivered). `capacity` bounds each topic's broadcast buffer.
    pub async fn connect(database_url: &str, capacity: usize) -> Result<Self, QueueError> {
        let topics: Topics = Arc::default();
        let (client, notifications) =
            crate::listener::listen(database_url, &[PUBSUB_CHANNEL]).await?;
        let (stop_tx, stop_rx) = oneshot::channel();
        tokio::spawn(run(
            database_url.to_owned(),
            topics.clone(),
            client,
            notifications,
            stop_rx,
        ));
        Ok(Self {
            topics,
            capacity,
            prune_at: AtomicUsize::new(MIN_PRUNE_AT),
            _stop: stop_tx,
        })
    }

    /// A receiver of every message published on `topic` from now on.
    pub fn subscribe(&self, topic: &str) -> broadcast::Receiver<Value> {
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        // Topics are often single-use (one per chat request): forget those nobody
        // listens to any more once the map has doubled since the last clean-up.
        if topics.len() >= self.prune_at.load(Ordering::Relaxed) {
            topics.retain(|_, sender| sender.receiver_count() > 0);
            self.prune_at
                .store((topics.len() * 2).max(MIN_PRUNE_AT), Ordering::Relaxed);
        }
        topics
            .entry(topic.to_owned())
            .or_insert_with(|| broadcast::channel(self.capacity).0)
            .subscribe()
    }

    /// How many topics this subscriber currently tracks (including abandoned ones
    /// not yet cleaned up).
    pub fn topic_count(&self) -> usize {
        self.topics.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// How many in-process receivers `topic` has now (readiness probes in tests).
    pub fn receiver_count(&self, topic: &str) -> usize {
        let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        topics
            .get(topic)
            .map_or(0, broadcast::Sender::receiver_count)
    }
}

async fn run(
    url: String,
    topics: Topics,
    mut client: tokio_postgres::Client,
    mut notifications: tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stop => return,
            next = notifications.recv() => match next {
                Some(n) => deliver(&client, &topics, n.payload()).await,
                None => {
                    // Connection lost: reconnect with a capped backoff.
                    let mut delay = Duration::from_millis(50);
                    loop {
                        tokio::select! {
                            _ = &mut stop => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                        match crate::listener::listen(&url, &[PUBSUB_CHANNEL]).await {
                            Ok((c, n)) => {
                                client = c;
                                notifications = n;
                                tracing::info!("pub/sub listener reconnected");
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "pub/sub reconnect failed");
                                delay = (delay * 2).min(Duration::from_secs(5));
                            }
                        }
                    }
                }
            },
        }
    }
}

/// An [`Envelope`] as it arrives, its payload left unparsed: every process
/// receives every message, and most are for topics nobody here listens to.
#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(borrow)]
    topic: std::borrow::Cow<'a, str>,
    /// More topics the same payload is for (absent: none).
    #[serde(default, borrow)]
    also: Vec<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    payload: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    id: Option<i64>,
}

async fn deliver(client: &tokio_postgres::Client, topics: &Topics, text: &str) {
    let envelope: Incoming = match serde_json::from_str(text) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring malformed pub/sub notification");
            return;
        }
    };
    let senders: Vec<broadcast::Sender<Value>> = {
        let topics = topics.lock().unwrap_or_else(|p| p.into_inner());
        let mut named: Vec<&str> = Vec::with_capacity(1 + envelope.also.len());
        for topic in std::iter::once(&envelope.topic).chain(&envelope.also) {
            // A topic named twice still gets the message once.
            if !named.contains(&topic.as_ref()) {
                named.push(topic.as_ref());
            }
        }
        named
            .into_iter()
            .filter_map(|topic| topics.get(topic).cloned())
            .collect()
    };
    if senders.is_empty() {
        return;
    }
    let payload: Value = match (envelope.payload, envelope.id) {
        (Some(raw), _) => match serde_json::from_str(raw.get()) {
            Ok(payload) => payload,
            Err(e) => {
                tracing::warn!(error = %e, "ignoring malformed pub/sub payload");
                return;
            }
        },
        (None, Some(id)) => {
            match client
                .query_opt("SELECT payload FROM pubsub_messages WHERE id = $1", &[&id])
                .await
            {
                Ok(Some(row)) => row.get(0),
                Ok(None) => {
                    tracing::warn!(id, "stored pub/sub message already gone");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, id, "reading stored pub/sub message failed");
                    return;
                }
            }
        }
        (None, None) => return,
    };
    // No receivers is fine: nobody on this replica listens to that topic.
    if let Some((last, others)) = senders.split_last() {
        for sender in others {
            let _ = sender.send(payload.clone());
        }
        let _ = last.send(payload);
    }
}
