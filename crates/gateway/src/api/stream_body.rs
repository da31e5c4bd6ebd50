//! Streamed response bodies written with as few socket writes as their
//! timing allows.

use std::task::Poll;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

pub use crate::providers::upstream::Pacing;

/// At most this many ready pieces go out in one write.
const MAX_PIECES_PER_WRITE: usize = 64;
/// At most this many bytes go out in one write.
const MAX_BYTES_PER_WRITE: usize = 64 * 1024;
/// Turns of the scheduler given to the tasks feeding the body before what
/// was gathered leaves: a piece can need several hand-offs (the provider's
/// connection task, its body, our decoder), and the end of a body one more.
const IDLE_TURNS: u32 = 4;

/// Turns of the scheduler to give a body's feeders after a piece.
fn idle_turns_of(pacing: Pacing) -> u32 {
    match pacing {
        Pacing::OtherTasks => IDLE_TURNS,
        Pacing::SameTask => 0,
    }
}

/// What follows a gathered chunk.
enum After<E> {
    More,
    End,
    Failed(E),
}

/// Joins the pieces that are ready together into one body chunk: a piece is
/// never held back waiting for another (a model's tokens still go out as
/// they come), but pieces that arrived together (a provider's read holding
/// several events) leave in one write instead of one each. An error ends the
/// body after the pieces before it.
///
/// "Ready" includes what the task feeding us can hand over in one turn of
/// the scheduler: an upstream body from hyper arrives one frame per wake-up
/// of its connection task even when one socket read held them all, so after
/// each piece this yields a few times ([`IDLE_TURNS`], each a microsecond or
/// so) before deciding nothing more is there
/// (measured: a streamed Anthropic answer read in one `recvfrom` left the
/// gateway in 21 `sendto`s, one per event). On a busy worker a turn lasts
/// as long as the other ready tasks take, so a chunk may wait up to four
/// of those turns, and carries more when it leaves.
pub fn coalesce_ready<S, E>(pieces: S, pacing: Pacing) -> impl Stream<Item = Result<Bytes, E>>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    async_stream::stream! {
        let mut pieces = std::pin::pin!(pieces);
        while let Some(first) = pieces.next().await {
            let first = match first {
                Ok(bytes) => bytes,
                Err(err) => {
                    yield Err(err);
                    return;
                }
            };
            let mut joined: Option<BytesMut> = None;
            let mut len = first.len();
            let mut count = 1;
            let mut idle_turns = 0;
            let mut after = After::More;
            while count < MAX_PIECES_PER_WRITE && len < MAX_BYTES_PER_WRITE {
                // Polled with this task's own waker: a piece that comes
                // later wakes the body as usual.
                let next = futures::future::poll_fn(|cx| {
                    Poll::Ready(pieces.as_mut().poll_next(cx))
                })
                .await;
                match next {
                    Poll::Ready(Some(Ok(bytes))) => {
                        let buffer = joined.get_or_insert_with(|| BytesMut::from(&first[..]));
                        buffer.extend_from_slice(&bytes);
                        len += bytes.len();
                        count += 1;
                        idle_turns = 0;
                    }
                    Poll::Ready(Some(Err(err))) => {
                        after = After::Failed(err);
                        break;
                    }
                    Poll::Ready(None) => {
                        after = After::End;
                        break;
                    }
                    Poll::Pending if idle_turns < idle_turns_of(pacing) => {
                        tokio::task::yield_now().await;
                        idle_turns += 1;
                    }
                    Poll::Pending => break,
                }
            }
            yield Ok(joined.map_or(first, BytesMut::freeze));
            match after {
                After::More => {}
                After::End => return,
                After::Failed(err) => {
                    yield Err(err);
                    return;
                }
            }
        }
    }
}

/// [`coalesce_ready`]'s body with its first chunk already awaited, for a
/// handler to return: the response head then leaves in the same write as
/// that chunk instead of alone before it (a head alone is one more packet
/// for the client to wake up for, and tells a streaming client nothing).
pub async fn first_chunk_ready<S, E>(
    pieces: S,
    pacing: Pacing,
) -> impl Stream<Item = Result<Bytes, E>>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    let mut body = Box::pin(coalesce_ready(pieces, pacing));
    let first = body.next().await;
    futures::stream::iter(first).chain(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;

    #[tokio::test]
    async fn ready_pieces_leave_together_and_later_ones_are_not_waited_for() {
        let (tx, rx) = mpsc::unbounded::<Result<Bytes, String>>();
        let mut body = Box::pin(coalesce_ready(rx, Pacing::OtherTasks));
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

    /// The shape of a hyper body: one frame handed over per turn of the
    /// task that feeds it, however many its last read held.
    #[tokio::test]
    async fn pieces_handed_over_one_per_turn_still_leave_together() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, String>>(1);
        let (go_on, resume) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            for piece in ["event: a\n\n", "event: b\n\n", "event: c\n\n"] {
                let _ = tx.send(Ok(Bytes::from_static(piece.as_bytes()))).await;
                tokio::task::yield_now().await;
            }
            // Later text (the model still writing) is not waited for.
            let _ = resume.await;
            let _ = tx.send(Ok(Bytes::from_static(b"event: d\n\n"))).await;
        });
        let mut body = Box::pin(coalesce_ready(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            Pacing::OtherTasks,
        ));
        assert_eq!(
            body.next().await.unwrap().unwrap(),
            Bytes::from_static(b"event: a\n\nevent: b\n\nevent: c\n\n")
        );
        assert!(futures::poll!(body.next()).is_pending());
        go_on.send(()).unwrap();
        assert_eq!(
            body.next().await.unwrap().unwrap(),
            Bytes::from_static(b"event: d\n\n")
        );
        assert!(body.next().await.is_none());
    }
}
