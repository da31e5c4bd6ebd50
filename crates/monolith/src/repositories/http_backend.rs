//! `git http-backend`, git's own smart-HTTP server, run as a CGI program for
//! one request (as GitLab's Workhorse and Radicle's httpd do): the caller has
//! already authenticated and authorized the request; this module sets the CGI
//! variables, and splits git's answer into its status, headers and body.

use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::error::RepositoryError;

/// The services smart HTTP offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Clone and fetch.
    UploadPack,
    /// Push.
    ReceivePack,
}

impl Service {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "git-upload-pack" => Some(Service::UploadPack),
            "git-receive-pack" => Some(Service::ReceivePack),
            _ => None,
        }
    }
}

/// Whether a URL path is one of git's smart-HTTP endpoints: these carry binary
/// pack data, which the REST input guard must not buffer or inspect.
pub fn is_smart_http_path(path: &str) -> bool {
    path.ends_with("/git-upload-pack")
        || path.ends_with("/git-receive-pack")
        || path.ends_with("/info/refs")
}

/// One request as the CGI program sees it.
#[derive(Debug, Clone, Default)]
pub struct CgiRequest {
    pub method: String,
    /// The repository's relative path and the rest of the URL path:
    /// `/@hashed/../x.git/info/refs`.
    pub path_info: String,
    pub query: String,
    pub content_type: Option<String>,
    /// `Git-Protocol` (protocol version 2).
    pub git_protocol: Option<String>,
    /// Who pushes (http-backend refuses receive-pack without a user).
    pub remote_user: Option<String>,
    pub remote_addr: Option<String>,
    /// Read by the repository's pre-receive hook.
    pub extra_env: Vec<(String, String)>,
    /// The largest pack git itself accepts in a push (`receive.maxInputSize`;
    /// 0: no limit). The body reaches git inflated (see [`gunzip`]), so this
    /// bounds what git writes whatever the request looked like on the wire.
    pub max_input_bytes: u64,
    /// More configuration for git, in order (`uploadpack.hideRefs`, ...).
    pub config: Vec<(String, String)>,
}

/// A running backend: feed the request body to `stdin`, then read the head and
/// body from `stdout`; wait on `child` to know how it ended.
pub struct Backend {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub stdout: ChildStdout,
}

/// Starts `git http-backend` for `request` in the repositories under `root`.
pub fn spawn(root: &Path, request: &CgiRequest) -> Result<Backend, RepositoryError> {
    let mut command = Command::new("git");
    command
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("REQUEST_METHOD", &request.method)
        .env("PATH_INFO", &request.path_info)
        .env("QUERY_STRING", &request.query)
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        // Configuration through the environment reaches `git receive-pack`,
        // which http-backend runs with it.
        .env("GIT_CONFIG_COUNT", (1 + request.config.len()).to_string())
        .env("GIT_CONFIG_KEY_0", "receive.maxInputSize")
        .env("GIT_CONFIG_VALUE_0", request.max_input_bytes.to_string())
        .envs(
            request
                .config
                .iter()
                .enumerate()
                .flat_map(|(i, (key, value))| {
                    [
                        (format!("GIT_CONFIG_KEY_{}", i + 1), key.clone()),
                        (format!("GIT_CONFIG_VALUE_{}", i + 1), value.clone()),
                    ]
                }),
        )
        .envs(
            request
                .extra_env
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(v) = &request.content_type {
        command.env("CONTENT_TYPE", v);
    }
    // Never `HTTP_CONTENT_ENCODING`: a compressed body is inflated (and
    // measured) before git reads it.
    if let Some(v) = &request.git_protocol {
        command.env("GIT_PROTOCOL", v);
    }
    if let Some(v) = &request.remote_user {
        command.env("REMOTE_USER", v);
    }
    if let Some(v) = &request.remote_addr {
        command.env("REMOTE_ADDR", v);
    }
    let mut child = command.spawn()?;
    let stdin = child.stdin.take();
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| RepositoryError::Git("no stdout".into()))?;
    Ok(Backend {
        child,
        stdin,
        stdout,
    })
}

/// How a request body is encoded (`Content-Encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEncoding {
    Identity,
    /// `gzip` or `x-gzip`: what git sends for large fetch negotiations.
    Gzip,
}

impl BodyEncoding {
    /// `None` for an encoding git never sends (refused rather than passed on).
    pub fn from_header(value: Option<&str>) -> Option<Self> {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("" | "identity") => Some(Self::Identity),
            Some("gzip" | "x-gzip") => Some(Self::Gzip),
            Some(_) => None,
        }
    }
}

/// Why an inflated body was cut off.
#[derive(Debug, thiserror::Error)]
pub enum InflateError {
    #[error("the body is larger than {0} bytes once inflated")]
    TooLarge(u64),
    #[error("the body is not valid gzip: {0}")]
    Corrupt(String),
}

/// A gzip inflater on a blocking thread: compressed chunks go in, inflated
/// chunks (at most [`INFLATED_CHUNK`] bytes each) come out, and it stops
/// with [`InflateError::TooLarge`] as soon as more than `limit` bytes came
/// out. Memory stays at a few chunks whatever the ratio: a small body that
/// inflates to gigabytes is stopped after `limit` bytes, never buffered.
pub struct Gunzip {
    pub input: tokio::sync::mpsc::Sender<bytes::Bytes>,
    pub output: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, InflateError>>,
}

/// Largest piece of inflated body handed on at once.
pub const INFLATED_CHUNK: usize = 64 * 1024;

pub fn gunzip(limit: u64) -> Gunzip {
    let (input, compressed) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
    let (inflated, output) = tokio::sync::mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        let reader = ChannelReader {
            chunks: compressed,
            current: bytes::Bytes::new(),
        };
        let mut decoder = flate2::read::MultiGzDecoder::new(reader);
        let mut buf = vec![0u8; INFLATED_CHUNK];
        let mut total: u64 = 0;
        loop {
            use std::io::Read as _;
            let piece = match decoder.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    total += n as u64;
                    if total > limit {
                        Err(InflateError::TooLarge(limit))
                    } else {
                        Ok(bytes::Bytes::copy_from_slice(&buf[..n]))
                    }
                }
                Err(e) => Err(InflateError::Corrupt(e.to_string())),
            };
            let stop = piece.is_err();
            // The receiver gone: the request ended; nothing more to do.
            if inflated.blocking_send(piece).is_err() || stop {
                return;
            }
        }
    });
    Gunzip { input, output }
}

/// Compressed chunks from the async side, read as a `std::io::Read`.
struct ChannelReader {
    chunks: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    current: bytes::Bytes,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// The CGI head git answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgiHead {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Body bytes read together with the head.
    pub leftover: Vec<u8>,
}

/// Most bytes of CGI headers accepted before giving up.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Reads the CGI head (`Status:` and headers up to the empty line).
pub async fn read_head(stdout: &mut (impl AsyncRead + Unpin)) -> Result<CgiHead, RepositoryError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(end) = find_head_end(&buf) {
            break end;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(RepositoryError::Git("oversized CGI head".into()));
        }
        let n = stdout.read(&mut chunk).await?;
        if n == 0 {
            return Err(RepositoryError::Git(
                "git http-backend ended before its head".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let (head, body_start) = end;
    Ok(parse_head(&buf[..head], buf[body_start..].to_vec()))
}

/// Where the head ends (`\r\n\r\n` or `\n\n`): (head length, body start).
fn find_head_end(buf: &[u8]) -> Option<(usize, usize)> {
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4));
    let lf = buf
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| (i, i + 2));
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

fn parse_head(head: &[u8], leftover: Vec<u8>) -> CgiHead {
    let text = String::from_utf8_lossy(head);
    let mut status = 200;
    let mut headers = Vec::new();
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("status") {
            status = value
                .split_whitespace()
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(500);
        } else {
            headers.push((name.to_owned(), value.to_owned()));
        }
    }
    CgiHead {
        status,
        headers,
        leftover,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn gzipped(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    async fn inflate(body: Vec<u8>, limit: u64) -> (usize, Option<String>) {
        let Gunzip { input, mut output } = gunzip(limit);
        let feeder = tokio::spawn(async move {
            for chunk in body.chunks(1000) {
                if input
                    .send(bytes::Bytes::copy_from_slice(chunk))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        let (mut size, mut error) = (0, None);
        while let Some(piece) = output.recv().await {
            match piece {
                Ok(bytes) => {
                    assert!(bytes.len() <= INFLATED_CHUNK);
                    size += bytes.len();
                }
                Err(e) => error = Some(e.to_string()),
            }
        }
        feeder.await.unwrap();
        (size, error)
    }

    #[tokio::test]
    async fn gzip_bodies_are_measured_once_inflated() {
        let small = gzipped(&vec![7u8; 100_000]);
        assert_eq!(inflate(small, 100_000).await, (100_000, None));
        // 4 MB of zeros fit in a few kilobytes; stopped just past the limit.
        let bomb = gzipped(&vec![0u8; 4 * 1024 * 1024]);
        assert!(bomb.len() < 10_000, "{}", bomb.len());
        let (size, error) = inflate(bomb, 1024 * 1024).await;
        assert!(size <= 1024 * 1024, "{size}");
        assert!(error.is_some_and(|e| e.contains("larger than")));
        let (_, error) = inflate(b"not gzip at all".to_vec(), 1024).await;
        assert!(error.is_some_and(|e| e.contains("not valid gzip")));
    }

    #[test]
    fn encodings_git_never_sends_are_refused() {
        assert_eq!(
            BodyEncoding::from_header(None),
            Some(BodyEncoding::Identity)
        );
        assert_eq!(
            BodyEncoding::from_header(Some("x-gzip")),
            Some(BodyEncoding::Gzip)
        );
        assert_eq!(BodyEncoding::from_header(Some("br")), None);
    }

    #[tokio::test]
    async fn heads_are_split_from_bodies() {
        let raw = b"Status: 403 Forbidden\r\nContent-Type: text/plain\r\n\r\nnope".to_vec();
        let head = read_head(&mut raw.as_slice()).await.unwrap();
        assert_eq!(head.status, 403);
        assert_eq!(
            head.headers,
            vec![("Content-Type".into(), "text/plain".into())]
        );
        assert_eq!(head.leftover, b"nope");
        let raw =
            b"Content-Type: application/x-git-upload-pack-advertisement\n\n001e# service".to_vec();
        let head = read_head(&mut raw.as_slice()).await.unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.leftover, b"001e# service");
        assert!(read_head(&mut b"Status: 200".as_slice()).await.is_err());
    }
}
