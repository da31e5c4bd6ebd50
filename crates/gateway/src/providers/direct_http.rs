//! HTTP/1.1 to plain-`http` provider endpoints, with each connection driven
//! by the task that reads its answer.
//!
//! Why not reqwest for these: its connections run as tasks of their own, and
//! hyper hands a response body over one frame per run of that task. A
//! streamed answer whose events all arrived in one socket read still needed
//! one scheduler turn (an `epoll_wait`) per event before the gateway could
//! relay them together — about 40 µs of the ~60 µs the gateway spent on a
//! streamed Anthropic answer (see `docs/performance.md`). Here the body's
//! reader polls the connection itself, so every event already read is
//! decoded in the same turn, and a body that says "pending" means the
//! socket has nothing more.
//!
//! Only for configured endpoints over plain `http` (the bundled local model,
//! self-hosted servers, the fake provider): `https` endpoints keep reqwest
//! (its TLS, HTTP/2), and endpoints a request names keep reqwest with the
//! egress policy's resolver. Redirects are never followed: a redirect is an
//! answer relayed as it is, never a second place our credentials go.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use http::header::{ACCEPT, HOST, HeaderValue};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Full;
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use url::Url;

type Io = TokioIo<TcpStream>;
type Driver = Connection<Io, Full<Bytes>>;

/// Why a call through [`DirectHttp`] failed. Messages never carry request
/// headers (API keys travel in them).
#[derive(Debug, thiserror::Error)]
pub enum DirectHttpError {
    #[error("not a plain http URL with a host")]
    Unsupported,
    #[error("connection failed: {0}")]
    Connect(std::io::Error),
    #[error("timed out")]
    Timeout,
    #[error("request failed: {0}")]
    Request(hyper::Error),
    #[error("reading the response failed: {0}")]
    Body(hyper::Error),
    #[error("the connection closed before the answer was complete")]
    Closed,
}

impl DirectHttpError {
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout)
    }

    pub fn is_connect(&self) -> bool {
        matches!(self, Self::Connect(_))
    }
}

/// Timeouts and pool limits.
#[derive(Debug, Clone, Copy)]
pub struct DirectHttpSettings {
    pub connect_timeout: Duration,
    /// From sending the request to the answer's head, and then between two
    /// reads of its body; `None`: no limit (the caller has its own deadlines).
    pub read_timeout: Option<Duration>,
    /// Idle connections kept per endpoint.
    pub max_idle_per_origin: usize,
    /// An idle connection older than this is closed instead of reused.
    pub idle_timeout: Duration,
}

impl Default for DirectHttpSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            read_timeout: None,
            max_idle_per_origin: 256,
            idle_timeout: Duration::from_secs(90),
        }
    }
}

/// The client: a pool of idle HTTP/1.1 connections per host and port. Cheap
/// to clone (clones share the pool). Like reqwest's pools, one per server
/// worker thread: a connection's socket belongs to the runtime that opened it.
#[derive(Clone)]
pub struct DirectHttp {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DirectHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectHttp")
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

struct Shared {
    settings: DirectHttpSettings,
    // Keys are our own configured endpoints: the fast hash is enough.
    idle: Mutex<HashMap<Origin, Vec<Pooled>, foldhash::fast::RandomState>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Origin {
    host: String,
    port: u16,
}

/// An open connection: the request side and the connection's state machine,
/// which only moves when whoever holds it polls it.
struct Pooled {
    sender: SendRequest<Full<Bytes>>,
    driver: Driver,
    idle_since: Instant,
}

/// An answer's status, headers and body.
pub struct DirectResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: DirectBody,
}

impl DirectHttp {
    pub fn new(settings: DirectHttpSettings) -> Self {
        Self {
            shared: Arc::new(Shared {
                settings,
                idle: Mutex::new(HashMap::default()),
            }),
        }
    }

    /// Whether this client takes calls to `url`: plain `http` with a host,
    /// and no user name or password in it (reqwest turns those into an
    /// `Authorization` header; such URLs stay with it).
    pub fn serves(url: &Url) -> bool {
        url.scheme() == "http"
            && url.host_str().is_some_and(|host| !host.is_empty())
            && url.username().is_empty()
            && url.password().is_none()
    }

    /// POSTs `body` with `headers` to `url` and waits for the answer's head.
    /// A request that a reused connection closed under before sending it is
    /// sent once more on a new connection; one that may have reached the
    /// server never is (a model call is not idempotent: it costs).
    pub async fn post(
        &self,
        url: &Url,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<DirectResponse, DirectHttpError> {
        // On the heap: the exchange holds a connection's buffers (~4 KB),
        // and the futures awaiting a model call are moved whole at each
        // hand-over (a `memcpy` of all they hold inline).
        Box::pin(self.post_inline(url, headers, body)).await
    }

    async fn post_inline(
        &self,
        url: &Url,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<DirectResponse, DirectHttpError> {
        let origin = Origin::of(url)?;
        let request = || build_request(url, &origin, &headers, body.clone());
        if let Some(connection) = self.checkout(&origin) {
            match self.exchange(origin.clone(), connection, request()?).await {
                Err(Failure::NotSent) => {}
                Err(Failure::Failed(err)) => return Err(err),
                Ok(response) => return Ok(response),
            }
        }
        let connection = self.connect(&origin).await?;
        let request = request()?;
        match self.exchange(origin, connection, request).await {
            Ok(response) => Ok(response),
            Err(Failure::NotSent) => Err(DirectHttpError::Closed),
            Err(Failure::Failed(err)) => Err(err),
        }
    }

    /// The most recently used idle connection that is still open.
    fn checkout(&self, origin: &Origin) -> Option<Pooled> {
        loop {
            let mut pooled = {
                let mut idle = self.shared.idle.lock().ok()?;
                idle.get_mut(origin)?.pop()?
            };
            if pooled.idle_since.elapsed() > self.shared.settings.idle_timeout {
                continue;
            }
            // One poll reads what the server sent while the connection was
            // idle: a close ends the connection here instead of failing the
            // request later.
            let mut cx = Context::from_waker(Waker::noop());
            if Pin::new(&mut pooled.driver).poll(&mut cx).is_ready() || pooled.sender.is_closed() {
                continue;
            }
            return Some(pooled);
        }
    }

    /// Idle connections in the pool, for tests that check one came back.
    #[cfg(test)]
    pub(crate) fn idle_connections(&self) -> usize {
        self.shared
            .idle
            .lock()
            .map(|idle| idle.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    fn checkin(&self, origin: Origin, sender: SendRequest<Full<Bytes>>, driver: Driver) {
        if sender.is_closed() {
            return;
        }
        let Ok(mut idle) = self.shared.idle.lock() else {
            return;
        };
        let kept = idle.entry(origin).or_default();
        if kept.len() < self.shared.settings.max_idle_per_origin {
            kept.push(Pooled {
                sender,
                driver,
                idle_since: Instant::now(),
            });
        }
    }

    async fn connect(&self, origin: &Origin) -> Result<Pooled, DirectHttpError> {
        let connecting = async {
            let stream = TcpStream::connect((origin.host.as_str(), origin.port))
                .await
                .map_err(DirectHttpError::Connect)?;
            stream.set_nodelay(true).map_err(DirectHttpError::Connect)?;
            let (sender, driver) = http1::Builder::new()
                .handshake(TokioIo::new(stream))
                .await
                .map_err(DirectHttpError::Request)?;
            Ok(Pooled {
                sender,
                driver,
                idle_since: Instant::now(),
            })
        };
        tokio::time::timeout(self.shared.settings.connect_timeout, connecting)
            .await
            .map_err(|_| DirectHttpError::Timeout)?
    }

    /// Sends one request on `connection`, driving the connection while
    /// waiting for the answer's head.
    async fn exchange(
        &self,
        origin: Origin,
        connection: Pooled,
        request: Request<Full<Bytes>>,
    ) -> Result<DirectResponse, Failure> {
        let Pooled {
            mut sender, driver, ..
        } = connection;
        let mut driver = Some(driver);
        let waiting = async {
            poll_fn(|cx| {
                if let Poll::Ready(ready) = sender.poll_ready(cx) {
                    return Poll::Ready(ready.map_err(|_| Failure::NotSent));
                }
                if drive(&mut driver, cx).is_ready() {
                    return Poll::Ready(Err(Failure::NotSent));
                }
                Poll::Pending
            })
            .await?;
            let mut answer = std::pin::pin!(sender.send_request(request));
            poll_fn(|cx| {
                loop {
                    if let Poll::Ready(answer) = answer.as_mut().poll(cx) {
                        return Poll::Ready(answer.map_err(|err| {
                            if err.is_canceled() {
                                Failure::NotSent
                            } else {
                                Failure::Failed(DirectHttpError::Request(err))
                            }
                        }));
                    }
                    // A connection that ended has failed the request: the
                    // answer's future says how on its next poll.
                    if driver.is_none() || drive(&mut driver, cx).is_pending() {
                        return Poll::Pending;
                    }
                }
            })
            .await
        };
        let response = match self.shared.settings.read_timeout {
            Some(limit) => tokio::time::timeout(limit, waiting)
                .await
                .map_err(|_| Failure::Failed(DirectHttpError::Timeout))??,
            None => waiting.await?,
        };
        let (parts, body) = response.into_parts();
        Ok(DirectResponse {
            status: parts.status,
            headers: parts.headers,
            body: DirectBody(Box::new(BodyState {
                body,
                driver,
                sender: Some(sender),
                origin: Some(origin),
                client: self.clone(),
                read_timeout: self.shared.settings.read_timeout,
                timer: None,
                last_read: Instant::now(),
                finished: false,
            })),
        })
    }
}

/// Why one exchange failed: before the request could leave (safe to send
/// again elsewhere) or after.
enum Failure {
    NotSent,
    Failed(DirectHttpError),
}

/// Polls the connection once; `Ready` (and the driver gone) when it ended.
fn drive(driver: &mut Option<Driver>, cx: &mut Context<'_>) -> Poll<()> {
    let Some(running) = driver.as_mut() else {
        return Poll::Ready(());
    };
    match Pin::new(running).poll(cx) {
        Poll::Pending => Poll::Pending,
        Poll::Ready(_) => {
            *driver = None;
            Poll::Ready(())
        }
    }
}

impl Origin {
    fn of(url: &Url) -> Result<Self, DirectHttpError> {
        if !DirectHttp::serves(url) {
            return Err(DirectHttpError::Unsupported);
        }
        // The host as the URL already spells it (no address formatted per
        // call); brackets are URL syntax, not part of an IPv6 address.
        let Some(host) = url.host_str() else {
            return Err(DirectHttpError::Unsupported);
        };
        let host = host
            .strip_prefix('[')
            .and_then(|inner| inner.strip_suffix(']'))
            .unwrap_or(host)
            .to_owned();
        Ok(Self {
            host,
            port: url.port_or_known_default().unwrap_or(80),
        })
    }
}

fn build_request(
    url: &Url,
    origin: &Origin,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, DirectHttpError> {
    // The origin-form target: the path and query as the URL holds them.
    let target = &url[url::Position::BeforePath..url::Position::AfterQuery];
    let mut request = Request::post(target)
        .body(Full::new(body))
        .map_err(|_| DirectHttpError::Unsupported)?;
    let sent = request.headers_mut();
    sent.reserve(headers.len() + 2);
    for (name, value) in headers {
        sent.append(name, value.clone());
    }
    // As reqwest sends them: the authority as the URL wrote it (port only
    // when not the default) and an accept-anything default.
    let authority = match url.port() {
        Some(port) => format!("{}:{port}", url.host_str().unwrap_or(&origin.host)),
        None => url.host_str().unwrap_or(&origin.host).to_owned(),
    };
    sent.insert(
        HOST,
        HeaderValue::from_str(&authority).map_err(|_| DirectHttpError::Unsupported)?,
    );
    sent.entry(ACCEPT)
        .or_insert(HeaderValue::from_static("*/*"));
    Ok(request)
}

/// An answer's body as a stream of chunks. Reading it drives its
/// connection; read to the end, the connection goes back to the pool, and
/// dropped before that, it is closed (unread bytes would be left on it).
/// Its state lives on the heap, so the streams holding it stay small.
pub struct DirectBody(Box<BodyState>);

struct BodyState {
    body: Incoming,
    driver: Option<Driver>,
    sender: Option<SendRequest<Full<Bytes>>>,
    origin: Option<Origin>,
    client: DirectHttp,
    read_timeout: Option<Duration>,
    timer: Option<Pin<Box<Sleep>>>,
    last_read: Instant,
    finished: bool,
}

impl DirectBody {
    /// The whole body.
    pub async fn bytes(mut self) -> Result<Bytes, DirectHttpError> {
        use futures::StreamExt;
        // A body of one chunk (the usual one) is handed over uncopied.
        let Some(first) = self.next().await.transpose()? else {
            return Ok(Bytes::new());
        };
        let Some(second) = self.next().await.transpose()? else {
            return Ok(first);
        };
        let mut whole = bytes::BytesMut::from(&first[..]);
        whole.extend_from_slice(&second);
        while let Some(chunk) = self.next().await {
            whole.extend_from_slice(&chunk?);
        }
        Ok(whole.freeze())
    }
}

impl Stream for DirectBody {
    type Item = Result<Bytes, DirectHttpError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut *self.0).poll_next(cx)
    }
}

impl BodyState {
    fn fail(&mut self) {
        self.finished = true;
        self.driver = None;
        self.sender = None;
    }

    fn finish(&mut self) {
        self.finished = true;
        if let (Some(origin), Some(sender), Some(driver)) =
            (self.origin.take(), self.sender.take(), self.driver.take())
        {
            self.client.checkin(origin, sender, driver);
        }
    }

    /// `Ready` when the time between reads ran out.
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(limit) = self.read_timeout else {
            return Poll::Pending;
        };
        let due = self.last_read + limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if timer.deadline() != due {
            timer.as_mut().reset(due);
        }
        timer.as_mut().poll(cx)
    }
}

/// A body dropped before its end keeps its connection only when the rest of
/// it is already read: a protocol's closing event usually arrives in the
/// same read as the body's end, and the reader stops at the event.
const DRAIN_MAX_FRAMES: usize = 16;

impl Drop for BodyState {
    fn drop(&mut self) {
        if self.finished || self.driver.is_none() {
            return;
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut driven = false;
        let mut frames = 0;
        while frames < DRAIN_MAX_FRAMES {
            match Pin::new(&mut self.body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(_))) => {
                    frames += 1;
                    driven = false;
                }
                Poll::Ready(None) => {
                    self.finish();
                    return;
                }
                Poll::Ready(Some(Err(_))) => return,
                Poll::Pending if driven || self.driver.is_none() => return,
                Poll::Pending => driven = drive(&mut self.driver, &mut cx).is_pending(),
            }
        }
    }
}

impl Stream for BodyState {
    type Item = Result<Bytes, DirectHttpError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.finished {
            return Poll::Ready(None);
        }
        let mut driven = false;
        loop {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers carry nothing a caller reads.
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        if this.read_timeout.is_some() {
                            this.last_read = Instant::now();
                        }
                        return Poll::Ready(Some(Ok(data)));
                    }
                    continue;
                }
                Poll::Ready(Some(Err(err))) => {
                    this.fail();
                    return Poll::Ready(Some(Err(DirectHttpError::Body(err))));
                }
                Poll::Ready(None) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Poll::Pending => {}
            }
            if this.driver.is_none() {
                // The connection ended and its body neither ended nor failed.
                this.fail();
                return Poll::Ready(Some(Err(DirectHttpError::Closed)));
            }
            if !driven {
                // Nothing decoded yet: the connection reads and decodes (it
                // hands the body one frame, then waits to be asked again),
                // and the body is looked at once more.
                driven = drive(&mut this.driver, cx).is_pending();
                continue;
            }
            if this.poll_timer(cx).is_ready() {
                this.fail();
                return Poll::Ready(Some(Err(DirectHttpError::Timeout)));
            }
            return Poll::Pending;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    /// What the scripted server does after a request's answer.
    #[derive(Clone, Copy, PartialEq)]
    enum Then {
        KeepOpen,
        Close,
        /// Sends nothing more, holding the connection until the client
        /// goes away.
        Stall,
    }

    /// One request as the server saw it: which connection, and its head.
    #[derive(Debug)]
    struct Seen {
        connection: usize,
        head: String,
        body: Vec<u8>,
    }

    struct Server {
        url: Url,
        seen: mpsc::UnboundedReceiver<Seen>,
        connections: Arc<AtomicUsize>,
    }

    /// A plain HTTP/1.1 server answering the n-th request with `script(n)`.
    async fn scripted_server(script: fn(usize) -> (Vec<u8>, Then)) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, seen) = mpsc::unbounded_channel();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let connection = counted.fetch_add(1, Ordering::SeqCst);
                let tx = tx.clone();
                let requests = requests.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    loop {
                        let Some((head, body)) = read_request(&mut socket, &mut buffer).await
                        else {
                            return;
                        };
                        let _ = tx.send(Seen {
                            connection,
                            head,
                            body,
                        });
                        let (answer, then) = script(requests.fetch_add(1, Ordering::SeqCst));
                        if socket.write_all(&answer).await.is_err() {
                            return;
                        }
                        match then {
                            Then::KeepOpen => {}
                            Then::Close => return,
                            Then::Stall => {
                                let mut rest = [0u8; 64];
                                let _ = socket.read(&mut rest).await;
                                return;
                            }
                        }
                    }
                });
            }
        });
        Server {
            url: Url::parse(&format!("http://127.0.0.1:{port}/v1/messages?beta=true")).unwrap(),
            seen,
            connections,
        }
    }

    async fn read_request(
        socket: &mut TcpStream,
        buffer: &mut Vec<u8>,
    ) -> Option<(String, Vec<u8>)> {
        loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
                let length: usize = head
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while buffer.len() < end + 4 + length {
                    let mut more = [0u8; 4096];
                    let n = socket.read(&mut more).await.ok()?;
                    if n == 0 {
                        return None;
                    }
                    buffer.extend_from_slice(&more[..n]);
                }
                let body = buffer[end + 4..end + 4 + length].to_vec();
                buffer.drain(..end + 4 + length);
                return Some((head, body));
            }
            let mut more = [0u8; 4096];
            let n = socket.read(&mut more).await.ok()?;
            if n == 0 {
                return None;
            }
            buffer.extend_from_slice(&more[..n]);
        }
    }

    /// A chunked answer of `events`, all in one write.
    fn chunked(events: &[&str]) -> Vec<u8> {
        let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for event in events {
            out.extend_from_slice(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes());
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    /// `chunked(events)` without the body's end.
    fn unfinished(events: &[&str]) -> Vec<u8> {
        let mut partial = chunked(events);
        partial.truncate(partial.len() - 5);
        partial
    }

    fn ten_events(_: usize) -> (Vec<u8>, Then) {
        let events: Vec<String> = (0..10).map(|i| format!("event: e{i}\n\n")).collect();
        let events: Vec<&str> = events.iter().map(String::as_str).collect();
        (chunked(&events), Then::KeepOpen)
    }

    fn client() -> DirectHttp {
        DirectHttp::new(DirectHttpSettings::default())
    }

    fn headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", HeaderValue::from_static("secret"));
        headers
    }

    #[tokio::test]
    async fn events_read_together_are_handed_over_without_a_turn_each() {
        let server = scripted_server(ten_events).await;
        let answer = client()
            .post(&server.url, headers(), Bytes::from_static(b"{}"))
            .await
            .unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        let mut body = answer.body;
        assert_eq!(body.next().await.unwrap().unwrap(), "event: e0\n\n");
        // The other nine came in the same read: each is ready at once,
        // without this task giving the scheduler a turn in between.
        for i in 1..10 {
            match futures::poll!(body.next()) {
                Poll::Ready(Some(Ok(event))) => assert_eq!(event, format!("event: e{i}\n\n")),
                Poll::Ready(other) => panic!("event {i}: {other:?}"),
                Poll::Pending => panic!("event {i} was not ready"),
            }
        }
        assert!(matches!(futures::poll!(body.next()), Poll::Ready(None)));
    }

    #[tokio::test]
    async fn connections_are_reused_and_the_request_is_sent_as_reqwest_sent_it() {
        let mut server = scripted_server(ten_events).await;
        let client = client();
        for _ in 0..3 {
            let answer = client
                .post(&server.url, headers(), Bytes::from_static(b"{\"a\":1}"))
                .await
                .unwrap();
            assert_eq!(answer.body.bytes().await.unwrap().len(), 10 * 11);
        }
        assert_eq!(server.connections.load(Ordering::SeqCst), 1);
        let first = server.seen.recv().await.unwrap();
        for _ in 1..3 {
            assert_eq!(
                server.seen.recv().await.unwrap().connection,
                first.connection
            );
        }
        let lines: Vec<String> = first.head.lines().map(str::to_ascii_lowercase).collect();
        assert_eq!(lines[0], "post /v1/messages?beta=true http/1.1");
        let port = server.url.port().unwrap();
        for expected in [
            format!("host: 127.0.0.1:{port}"),
            "accept: */*".to_owned(),
            "x-api-key: secret".to_owned(),
            "content-length: 7".to_owned(),
        ] {
            assert!(lines.contains(&expected), "{expected} missing in {lines:?}");
        }
        assert_eq!(first.body, b"{\"a\":1}");
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced() {
        fn then_close(_: usize) -> (Vec<u8>, Then) {
            (chunked(&["data: x\n\n"]), Then::Close)
        }
        let server = scripted_server(then_close).await;
        let client = client();
        for _ in 0..3 {
            let answer = client
                .post(&server.url, headers(), Bytes::new())
                .await
                .unwrap();
            assert_eq!(answer.body.bytes().await.unwrap(), "data: x\n\n");
            // Until the server's close has reached the pooled connection,
            // so the next request finds it closed.
            tokio::time::timeout(Duration::from_secs(5), pooled_all_closed(&client))
                .await
                .unwrap();
        }
        assert_eq!(server.connections.load(Ordering::SeqCst), 3);
    }

    async fn pooled_all_closed(client: &DirectHttp) {
        loop {
            let closed = {
                let mut idle = client.shared.idle.lock().unwrap();
                idle.values_mut()
                    .flat_map(|kept| kept.iter_mut())
                    .all(|pooled| {
                        let mut cx = Context::from_waker(Waker::noop());
                        Pin::new(&mut pooled.driver).poll(&mut cx).is_ready()
                    })
            };
            if closed {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_body_dropped_early_keeps_its_connection_only_when_it_was_all_read() {
        fn script(n: usize) -> (Vec<u8>, Then) {
            if n == 1 {
                (unfinished(&["event: a\n\n"]), Then::Stall)
            } else {
                ten_events(n)
            }
        }
        let server = scripted_server(script).await;
        let client = client();
        // Request 0: dropped after its first event, the rest already read.
        let mut body = client
            .post(&server.url, headers(), Bytes::new())
            .await
            .unwrap()
            .body;
        assert!(body.next().await.is_some());
        drop(body);
        // Request 1 goes on the same connection; dropped before its end,
        // which has not come: that connection cannot carry another answer.
        let mut body = client
            .post(&server.url, headers(), Bytes::new())
            .await
            .unwrap()
            .body;
        assert_eq!(body.next().await.unwrap().unwrap(), "event: a\n\n");
        drop(body);
        assert_eq!(server.connections.load(Ordering::SeqCst), 1);
        // Request 2 needs a new connection.
        let answer = client
            .post(&server.url, headers(), Bytes::new())
            .await
            .unwrap();
        assert_eq!(answer.body.bytes().await.unwrap().len(), 10 * 11);
        assert_eq!(server.connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_stalled_answer_times_out_between_reads_and_before_its_head() {
        fn head_then_stall(_: usize) -> (Vec<u8>, Then) {
            (unfinished(&["event: a\n\n"]), Then::Stall)
        }
        fn nothing(_: usize) -> (Vec<u8>, Then) {
            (Vec::new(), Then::Stall)
        }
        let settings = DirectHttpSettings {
            read_timeout: Some(Duration::from_millis(150)),
            ..DirectHttpSettings::default()
        };
        let server = scripted_server(head_then_stall).await;
        let mut body = DirectHttp::new(settings)
            .post(&server.url, headers(), Bytes::new())
            .await
            .unwrap()
            .body;
        assert_eq!(body.next().await.unwrap().unwrap(), "event: a\n\n");
        let started = std::time::Instant::now();
        assert!(matches!(
            body.next().await,
            Some(Err(DirectHttpError::Timeout))
        ));
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert!(body.next().await.is_none());

        let silent = scripted_server(nothing).await;
        let refused = DirectHttp::new(settings)
            .post(&silent.url, headers(), Bytes::new())
            .await;
        assert!(matches!(refused, Err(DirectHttpError::Timeout)));
    }

    #[tokio::test]
    async fn a_redirect_is_an_answer_not_a_second_request() {
        fn redirect(_: usize) -> (Vec<u8>, Then) {
            (
                b"HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:9/steal\r\ncontent-length: 0\r\n\r\n".to_vec(),
                Then::KeepOpen,
            )
        }
        let mut server = scripted_server(redirect).await;
        let answer = client()
            .post(&server.url, headers(), Bytes::new())
            .await
            .unwrap();
        assert_eq!(answer.status, StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(answer.headers["location"], "http://127.0.0.1:9/steal");
        assert!(answer.body.bytes().await.unwrap().is_empty());
        assert!(server.seen.recv().await.is_some());
        assert!(server.seen.try_recv().is_err());
        assert_eq!(server.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn only_plain_http_urls_with_a_host_are_taken() {
        for (url, taken) in [
            ("http://127.0.0.1:5052/v1", true),
            ("http://[::1]:8000/v1", true),
            ("http://llm.internal/v1", true),
            ("http://user:secret@llm.internal/v1", false),
            ("http://user@llm.internal/v1", false),
            ("https://api.anthropic.com/v1/messages", false),
            ("unix:/run/model.sock", false),
        ] {
            assert_eq!(
                DirectHttp::serves(&Url::parse(url).unwrap()),
                taken,
                "{url}"
            );
        }
        let refused = client()
            .post(
                &Url::parse("https://api.anthropic.com/v1/messages").unwrap(),
                headers(),
                Bytes::new(),
            )
            .await;
        assert!(matches!(refused, Err(DirectHttpError::Unsupported)));
        assert_eq!(
            Origin::of(&Url::parse("http://[::1]/x").unwrap()).unwrap(),
            Origin {
                host: "::1".to_owned(),
                port: 80
            }
        );
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_a_connection_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let refused = client()
            .post(
                &Url::parse(&format!("http://127.0.0.1:{port}/v1")).unwrap(),
                headers(),
                Bytes::new(),
            )
            .await;
        match refused {
            Err(err) => {
                assert!(err.is_connect(), "{err}");
                assert!(!err.to_string().contains("secret"));
            }
            Ok(_) => panic!("a closed port answered"),
        }
    }
}
