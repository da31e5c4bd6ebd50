//! Streamed response bodies written with as few socket writes as their
//! timing allows.

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

/// At most this many ready pieces go out in one write.
const MAX_PIECES_PER_WRITE: usize = 64;

/// Joins the pieces that are ready together into one body chunk: a piece is
/// never held back waiting for another (a model's tokens still go out as
/// they come), but pieces that arrived together (a provider's read holding
/// several events) leave in one write instead of one each. An error ends the
/// body after the pieces before it.
pub fn coalesce_ready<S, E>(pieces: S) -> impl Stream<Item = Result<Bytes, E>>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    pieces
        .ready_chunks(MAX_PIECES_PER_WRITE)
        .flat_map(|batch| futures::stream::iter(join(batch)))
}

/// One chunk of the batch's leading pieces, then the first error if any.
fn join<E>(batch: Vec<Result<Bytes, E>>) -> Vec<Result<Bytes, E>> {
    if batch.len() == 1 {
        return batch;
    }
    let mut joined = BytesMut::new();
    let mut out = Vec::with_capacity(2);
    for piece in batch {
        match piece {
            Ok(bytes) => joined.extend_from_slice(&bytes),
            Err(e) => {
                if !joined.is_empty() {
                    out.push(Ok(joined.split().freeze()));
                }
                out.push(Err(e));
                return out;
            }
        }
    }
    out.push(Ok(joined.freeze()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;

    #[tokio::test]
    async fn ready_pieces_leave_together_and_later_ones_are_not_waited_for() {
        let (tx, rx) = mpsc::unbounded::<Result<Bytes, String>>();
        let mut body = Box::pin(coalesce_ready(rx));
        tx.unbounded_send(Ok(Bytes::from_static(b"a"))).unwrap();
        tx.unbounded_send(Ok(Bytes::from_static(b"b"))).unwrap();
        tx.unbounded_send(Ok(Bytes::from_static(b"c"))).unwrap();
        assert_eq!(
            body.next().await.unwrap().unwrap(),
            Bytes::from_static(b"abc")
        );
        // Nothing ready: the body waits; the next piece goes out alone.
        assert!(futures::poll!(body.next()).is_pending());
        tx.unbounded_send(Ok(Bytes::from_static(b"d"))).unwrap();
        assert_eq!(
            body.next().await.unwrap().unwrap(),
            Bytes::from_static(b"d")
        );
        // An error ends the body after what came before it.
        tx.unbounded_send(Ok(Bytes::from_static(b"e"))).unwrap();
        tx.unbounded_send(Err("boom".into())).unwrap();
        drop(tx);
        assert_eq!(
            body.next().await.unwrap().unwrap(),
            Bytes::from_static(b"e")
        );
        assert_eq!(body.next().await.unwrap().unwrap_err(), "boom");
        assert!(body.next().await.is_none());
    }
}
