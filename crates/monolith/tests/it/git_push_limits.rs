//! The push size limit (`DUO_GIT_MAX_PUSH_BYTES`) counts what git would
//! read: a gzip body is measured once inflated, so compression cannot carry
//! a push past it; and git itself refuses a larger pack
//! (`receive.maxInputSize`). Real `git`, a real server, nothing written on
//! refusal.

use std::io::Write as _;

use monolith::repositories::Repositories;
use monolith::repositories::http_backend::{self, CgiRequest};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::git_support::{GitClient, clone_url};
use crate::support::{Fx, Server};

const LIMIT: usize = 1024 * 1024;
const ZERO: &str = "0000000000000000000000000000000000000000";

struct World {
    _fx: Fx,
    server: Server,
    project: i64,
    token: String,
}

async fn world() -> World {
    let fx = Fx::new().await;
    let limit = LIMIT.to_string();
    let server =
        Server::start_with_settings(&fx, fx.pool.clone(), &[("DUO_GIT_MAX_PUSH_BYTES", &limit)])
            .await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    let project = fx.project(group, "app", "private").await;
    let dev = fx.user("dev").await;
    fx.project_member(project, dev, monolith::policy::access::MAINTAINER)
        .await;
    let token = fx
        .token(dev, &["read_repository", "write_repository"])
        .await;
    World {
        _fx: fx,
        server,
        project,
        token,
    }
}

/// A local repository `name` holding one file of `size` zero bytes; its
/// head commit, the file's blob id, and a pack of it stored without
/// compression (so the pack is as large as the file).
async fn stored_pack(git: &GitClient, name: &str, size: usize) -> (String, String, Vec<u8>) {
    git.ok("", &["init", "-q", "-b", "main", name]).await;
    std::fs::write(git.path(name).join("zeros.bin"), vec![0u8; size]).unwrap();
    git.ok(name, &["add", "-A"]).await;
    git.ok(name, &["commit", "-q", "-m", "Zeros"]).await;
    let head = git.ok(name, &["rev-parse", "HEAD"]).await.trim().to_owned();
    let blob = git
        .ok(name, &["rev-parse", "HEAD:zeros.bin"])
        .await
        .trim()
        .to_owned();
    let mut child = tokio::process::Command::new("git")
        .args([
            "-c",
            "pack.compression=0",
            "pack-objects",
            "-q",
            "--revs",
            "--stdout",
        ])
        .current_dir(git.path(name))
        .env("HOME", git.path("home"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"main\n").await.unwrap();
    drop(stdin);
    let mut pack = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut pack)
        .await
        .unwrap();
    assert!(child.wait().await.unwrap().success());
    (head, blob, pack)
}

/// A receive-pack request creating `refs/heads/main` at `head`.
fn receive_pack_body(head: &str, pack: &[u8]) -> Vec<u8> {
    let line = format!("{ZERO} {head} refs/heads/main\0report-status\n");
    let mut body = format!("{:04x}{line}0000", line.len() + 4).into_bytes();
    body.extend_from_slice(pack);
    body
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

async fn post_gzip(w: &World, body: Vec<u8>) -> (u16, String) {
    let res = reqwest::Client::new()
        .post(w.server.url("/acme/app.git/git-receive-pack"))
        .basic_auth("dev", Some(&w.token))
        .header("Content-Type", "application/x-git-receive-pack-request")
        .header("Content-Encoding", "gzip")
        .body(body)
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

/// The server's repository of the project.
fn repository(w: &World) -> std::path::PathBuf {
    Repositories::new(w.server.repositories.clone(), 1).path(w.project)
}

async fn has_object(git: &GitClient, repository: &std::path::Path, id: &str) -> bool {
    let dir = repository.display().to_string();
    git.run("", &["--git-dir", &dir, "cat-file", "-e", id])
        .await
        .ok
}

#[tokio::test]
async fn a_gzip_push_is_measured_once_inflated_and_refused_past_the_limit() {
    let w = world().await;
    let git = GitClient::new();
    let (head, blob, pack) = stored_pack(&git, "big", 3 * LIMIT).await;
    let body = receive_pack_body(&head, &pack);
    let compressed = gzip(&body);
    assert!(body.len() > 2 * LIMIT, "{}", body.len());
    assert!(compressed.len() < LIMIT / 10, "{}", compressed.len());

    let (status, text) = post_gzip(&w, compressed).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("inflated"), "{text}");
    // Nothing written: no ref, and not the object either.
    let url = clone_url(&w.server.base, "acme/app", Some(&w.token));
    let refs = git.ok("", &["ls-remote", &url]).await;
    assert_eq!(refs.trim(), "", "a ref was written: {refs}");
    assert!(!has_object(&git, &repository(&w), &blob).await);

    // The same kind of request, under the limit once inflated, is accepted:
    // gzip itself is fine.
    let (head, blob, pack) = stored_pack(&git, "small", LIMIT / 4).await;
    let (status, text) = post_gzip(&w, gzip(&receive_pack_body(&head, &pack))).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("ok refs/heads/main"), "{text}");
    let refs = git.ok("", &["ls-remote", &url]).await;
    assert!(refs.contains(&head), "{refs}");
    assert!(has_object(&git, &repository(&w), &blob).await);
}

#[tokio::test]
async fn a_plain_push_over_the_limit_is_refused_and_writes_nothing() {
    let w = world().await;
    let git = GitClient::new();
    git.ok("", &["init", "-q", "-b", "main", "big"]).await;
    // Random bytes: git's own compression cannot shrink them under the limit.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: Vec<u8> = (0..2 * LIMIT)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    std::fs::write(git.path("big").join("noise.bin"), noise).unwrap();
    git.ok("big", &["add", "-A"]).await;
    git.ok("big", &["commit", "-q", "-m", "Noise"]).await;
    let url = clone_url(&w.server.base, "acme/app", Some(&w.token));
    let pushed = git.run("big", &["push", &url, "main"]).await;
    assert!(!pushed.ok, "{}", pushed.stderr);
    assert!(pushed.stderr.contains("413"), "{}", pushed.stderr);
    let refs = git.ok("", &["ls-remote", &url]).await;
    assert_eq!(refs.trim(), "");
}

#[tokio::test]
async fn git_itself_refuses_a_pack_larger_than_its_input_limit() {
    let w = world().await;
    let git = GitClient::new();
    let (head, blob, pack) = stored_pack(&git, "big", LIMIT).await;
    // Straight to git http-backend, past the server's own count: git's
    // `receive.maxInputSize` is the last word.
    let repositories = Repositories::new(w.server.repositories.clone(), 1);
    let path = repositories.ensure(w.project, "main").await.unwrap();
    let request = CgiRequest {
        method: "POST".into(),
        path_info: format!(
            "/{}/git-receive-pack",
            Repositories::relative_path(w.project)
        ),
        content_type: Some("application/x-git-receive-pack-request".into()),
        remote_user: Some("dev".into()),
        max_input_bytes: (LIMIT / 2) as u64,
        ..CgiRequest::default()
    };
    let mut backend = http_backend::spawn(repositories.root(), &request).unwrap();
    let mut stdin = backend.stdin.take().unwrap();
    let body = receive_pack_body(&head, &pack);
    let writer = tokio::spawn(async move {
        // git may stop reading once it refused; that is the point.
        let _ = stdin.write_all(&body).await;
    });
    let mut answer = Vec::new();
    backend.stdout.read_to_end(&mut answer).await.unwrap();
    writer.await.unwrap();
    let _ = backend.child.wait().await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(!answer.contains("ok refs/heads/main"), "{answer}");
    assert!(
        answer.contains("unpack") || answer.contains("maximum"),
        "{answer}"
    );
    let dir = path.display().to_string();
    let refs = git.run("", &["--git-dir", &dir, "show-ref"]).await;
    assert_eq!(refs.stdout.trim(), "", "a ref was written");
    assert!(!has_object(&git, &path, &blob).await);
}
