//! One LISTEN connection whose notifications arrive on a channel; the channel closes
//! when the connection drops, so callers notice and reconnect.

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls, Notification};

pub(crate) async fn listen(
    url: &str,
    channels: &[&str],
) -> Result<(Client, mpsc::UnboundedReceiver<Notification>), tokio_postgres::Error> {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "LISTEN connection failed");
                    break;
                }
            }
        }
    });
    let sql: String = channels
        .iter()
        .map(|c| format!("LISTEN \"{c}\";"))
        .collect();
    client.batch_execute(&sql).await?;
    Ok((client, rx))
}
