//! The MCP server at `/api/v4/mcp`, spoken as raw JSON-RPC over real HTTP
//! with real tokens: the tool catalogue, who gets in (scopes, expired,
//! revoked, blocked), the body size and per-token rate limits, the audit log,
//! projects and groups with Duo off, Duo context exclusions in diffs, merge
//! request commits and pipelines with their jobs, the answer cap, epic notes,
//! the tool time limit and JSON-RPC errors (arguments outside their schema's
//! bounds too), and the OAuth endpoints' answers to bodies they cannot read.
//! The end-to-end suite with the Python SDK (e2e/python/mcp_client_suite.py)
//! covers the rest.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use monolith::config::Realm;
use monolith::policy::{Actor, access};
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::rest_support::{get, post};
use crate::support::{Fx, Server};

const PROTOCOL: &str = "2025-06-18";
const DUO_OFF: &str = "GitLab Duo features are turned off for this project or group";

// ---- a small MCP client ---------------------------------------------------------

/// What one HTTP request to `/api/v4/mcp` answered; `body` is the JSON-RPC
/// message (read from the SSE stream when the server streams), `Null` when
/// the body is empty.
struct Http {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

fn mcp_url(server: &Server) -> String {
    server.url("/api/v4/mcp")
}

/// One POST to the MCP endpoint.
async fn post_mcp(
    server: &Server,
    token: Option<&str>,
    session: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> Http {
    let mut req = reqwest::Client::new()
        .post(mcp_url(server))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(session) = session {
        req = req
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", PROTOCOL);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = read_message(res).await;
    Http {
        status,
        headers,
        body,
    }
}

/// The JSON-RPC answer of a response: its JSON body, or the first answer
/// (a message with `result` or `error`) of its event stream.
async fn read_message(mut res: reqwest::Response) -> Value {
    let streaming = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !streaming {
        let text = res.text().await.unwrap();
        return serde_json::from_str(&text).unwrap_or(Value::Null);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut buffer = String::new();
    loop {
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            if let Ok(message) = serde_json::from_str::<Value>(&data.join("\n"))
                && (message.get("result").is_some() || message.get("error").is_some())
            {
                return message;
            }
        }
        let chunk = tokio::time::timeout_at(deadline, res.chunk())
            .await
            .expect("an answer on the event stream within 30 s")
            .unwrap();
        match chunk {
            Some(bytes) => buffer.push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n")),
            None => panic!("the event stream ended without an answer: {buffer:?}"),
        }
    }
}

fn initialize_body(id: i64) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "monolith-it", "version": "1"},
        },
    })
}

/// An MCP session of one token: initialized, ready for `tools/*`.
pub(crate) struct Mcp<'a> {
    server: &'a Server,
    token: String,
    session: String,
    next_id: i64,
}

impl<'a> Mcp<'a> {
    /// `initialize` and `notifications/initialized` (two requests).
    pub(crate) async fn connect(server: &'a Server, token: &str) -> Mcp<'a> {
        let init = post_mcp(server, Some(token), None, initialize_body(1).to_string()).await;
        assert_eq!(init.status, 200, "initialize: {}", init.body);
        assert_eq!(init.body["result"]["protocolVersion"], PROTOCOL);
        assert_eq!(
            init.body["result"]["serverInfo"]["name"],
            "GitLab MCP server"
        );
        let session = init.headers["mcp-session-id"].to_str().unwrap().to_owned();
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let ack = post_mcp(server, Some(token), Some(&session), initialized.to_string()).await;
        assert_eq!(ack.status, 202, "notifications/initialized: {}", ack.body);
        Mcp {
            server,
            token: token.to_owned(),
            session,
            next_id: 2,
        }
    }

    /// One request of this session, as HTTP answered it.
    async fn send(&mut self, method: &str, params: Value) -> Http {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_body(body.to_string()).await
    }

    async fn send_body(&self, body: String) -> Http {
        post_mcp(self.server, Some(&self.token), Some(&self.session), body).await
    }

    /// The `result` of `tools/call`; fails on a JSON-RPC error.
    pub(crate) async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let http = self
            .send("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        assert_eq!(http.status, 200, "{tool}: {}", http.body);
        assert!(
            http.body.get("result").is_some(),
            "{tool} answered no result: {}",
            http.body
        );
        http.body["result"].clone()
    }

    /// A successful tool result's first text, as JSON.
    async fn call_ok(&mut self, tool: &str, arguments: Value) -> Value {
        let result = self.call(tool, arguments).await;
        assert_eq!(result["isError"], false, "{tool}: {result}");
        serde_json::from_str(&texts(&result)[0]).unwrap()
    }

    /// A tool result with `isError: true`: its text.
    pub(crate) async fn call_refused(&mut self, tool: &str, arguments: Value) -> String {
        let result = self.call(tool, arguments).await;
        assert_eq!(result["isError"], true, "{tool} was not refused: {result}");
        texts(&result).join("\n")
    }

    /// The JSON-RPC `error` of `tools/call`; fails on a result.
    pub(crate) async fn call_error(&mut self, tool: &str, arguments: Value) -> Value {
        let http = self
            .send("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        assert_eq!(http.status, 200, "{tool}: {}", http.body);
        assert!(
            http.body.get("error").is_some(),
            "{tool} answered no error: {}",
            http.body
        );
        http.body["error"].clone()
    }
}

/// The text blocks of a tool result.
pub(crate) fn texts(result: &Value) -> Vec<String> {
    result["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no content: {result}"))
        .iter()
        .map(|block| {
            assert_eq!(block["type"], "text", "{block}");
            block["text"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// The JSON-RPC body every refusal before the protocol carries.
fn assert_rpc_refusal(http: &Http, code: i64, message: &str) {
    assert_eq!(
        http.body,
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}}),
        "status {}",
        http.status
    );
}

// ---- fixtures -----------------------------------------------------------------------

/// A token with these scopes, and its id (the audit log's `token_id`).
async fn token_with_id(fx: &Fx, user: Actor, scopes: &[&str]) -> (String, i64) {
    let db = fx.pool.get().await.unwrap();
    let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
    let created = monolith::identity::tokens::create(&**db, user.id, "mcp-test", &scopes, None)
        .await
        .unwrap();
    (created.token, created.id)
}

/// The `acme` group (ultimate) with the private project `acme/api`: an owner,
/// a reporter, a guest, and someone outside.
struct World {
    fx: Fx,
    group: i64,
    project: i64,
    owner: Actor,
    reporter: Actor,
    guest: Actor,
    outsider: Actor,
}

async fn world() -> World {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let owner = fx.user("owner").await;
    let reporter = fx.user("reporter").await;
    let guest = fx.user("guest").await;
    let outsider = fx.user("outsider").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, owner, access::OWNER).await;
    fx.group_member(group, reporter, access::REPORTER).await;
    fx.group_member(group, guest, access::GUEST).await;
    let project = fx.project(group, "api", "private").await;
    World {
        fx,
        group,
        project,
        owner,
        reporter,
        guest,
        outsider,
    }
}

/// An issue titled `title` (description `description`); its iid.
async fn issue(fx: &Fx, project: i64, author: Actor, title: &str, description: &str) -> i32 {
    let id = fx.issue(project, author, false).await;
    fx.exec(
        "UPDATE issues SET title = $2, description = $3 WHERE id = $1",
        &[&id, &title, &description],
    )
    .await;
    let db = fx.pool.get().await.unwrap();
    db.query_one("SELECT iid FROM issues WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

/// `main` with a README, then `feature` from it, one commit per entry of
/// `commits` (title, files); the commits' ids in order.
async fn repository(
    server: &Server,
    project: i64,
    token: &str,
    commits: &[(&str, &[(&str, &str)])],
) -> Vec<String> {
    let (status, body) = post(
        server,
        &format!("/projects/{project}/repository/files/README.md"),
        token,
        json!({"branch": "main", "content": "# API\n", "commit_message": "Start"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let mut ids = Vec::new();
    for (i, (title, files)) in commits.iter().enumerate() {
        let actions: Vec<Value> = files
            .iter()
            .map(|(path, content)| json!({"action": "create", "file_path": path, "content": content}))
            .collect();
        let mut commit = json!({"branch": "feature", "commit_message": title, "actions": actions});
        if i == 0 {
            commit["start_branch"] = json!("main");
        }
        let (status, body) = post(
            server,
            &format!("/projects/{project}/repository/commits"),
            token,
            commit,
        )
        .await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["id"].as_str().unwrap().to_owned());
    }
    ids
}

/// A merge request from `source` into `main`; its iid.
async fn merge_request(server: &Server, project: i64, token: &str, source: &str) -> i64 {
    let (status, mr) = post(
        server,
        &format!("/projects/{project}/merge_requests"),
        token,
        json!({"source_branch": source, "target_branch": "main", "title": format!("Merge {source}")}),
    )
    .await;
    assert_eq!(status, 201, "{mr}");
    mr["iid"].as_i64().unwrap()
}

/// Imports a finished job (and so a pipeline) on `git_ref`; the pipeline's id.
async fn import_job(
    server: &Server,
    project: i64,
    token: &str,
    name: &str,
    status: &str,
    git_ref: &str,
) -> i64 {
    let (code, job) = post(
        server,
        &format!("/projects/{project}/jobs/import"),
        token,
        json!({"name": name, "stage": "test", "status": status, "ref": git_ref, "log": format!("{name} log")}),
    )
    .await;
    assert_eq!(code, 201, "{job}");
    job["pipeline"]["id"].as_i64().unwrap()
}

// ---- 1. the catalogue -----------------------------------------------------------------

#[tokio::test]
async fn the_tool_catalogue_names_describes_and_shapes_each_tool() {
    let w = world().await;
    let token = w.fx.token(w.reporter, &["mcp"]).await;
    let server = Server::start(&w.fx).await;
    let mut mcp = Mcp::connect(&server, &token).await;

    let listed = mcp.send("tools/list", json!({})).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let tools: Vec<Value> = listed.body["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            json!({
                "name": t["name"],
                "description": t["description"],
                "inputSchema": t["inputSchema"],
                "annotations": t["annotations"],
            })
        })
        .collect();
    // Every schema is closed: a client learns all the arguments a tool takes.
    for tool in &tools {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
        assert_eq!(tool["inputSchema"]["additionalProperties"], false, "{tool}");
    }
    insta::assert_json_snapshot!("tools", tools);
}

// ---- 2. who gets in -----------------------------------------------------------------

#[tokio::test]
async fn only_an_active_mcp_token_of_an_active_user_gets_in() {
    let w = world().await;
    let fx = &w.fx;
    let api_and_mcp = fx.token(w.owner, &["api", "mcp"]).await;
    let read_api_and_mcp = fx.token(w.owner, &["read_api", "mcp"]).await;
    let api_only = fx.token(w.owner, &["api"]).await;
    let ai_features = fx.token(w.owner, &["ai_features", "read_api"]).await;
    let workflow = {
        let db = fx.pool.get().await.unwrap();
        monolith::identity::oauth::mint(
            &**db,
            w.owner.id,
            monolith::identity::oauth::USER_TOKEN_LIFETIME,
        )
        .await
        .unwrap()
        .token
    };
    let expired = {
        let db = fx.pool.get().await.unwrap();
        let yesterday = chrono::Utc::now().date_naive() - chrono::Days::new(1);
        monolith::identity::tokens::create(
            &**db,
            w.owner.id,
            "old",
            &["mcp".to_owned()],
            Some(yesterday),
        )
        .await
        .unwrap()
        .token
    };
    let (revoked, revoked_id) = token_with_id(fx, w.owner, &["mcp"]).await;
    let blocked_user = fx.user("blocked").await;
    fx.group_member(w.group, blocked_user, access::DEVELOPER)
        .await;
    let blocked = fx.token(blocked_user, &["mcp"]).await;
    let mcp_only = fx.token(w.owner, &["mcp"]).await;
    let server = Server::start(fx).await;
    let init = || initialize_body(1).to_string();

    // The mcp scope next to others works.
    for token in [&api_and_mcp, &read_api_and_mcp] {
        let mut mcp = Mcp::connect(&server, token).await;
        let version = mcp.call_ok("get_mcp_server_version", json!({})).await;
        assert!(version["version"].is_string(), "{version}");
    }

    // Tokens without the mcp scope: 403 insufficient_scope, a JSON-RPC body.
    for (name, token) in [
        ("api", &api_only),
        ("ai_features", &ai_features),
        ("ai_workflows", &workflow),
    ] {
        let http = post_mcp(&server, Some(token), None, init()).await;
        assert_eq!(http.status, 403, "{name}: {}", http.body);
        let challenge = http.headers["www-authenticate"].to_str().unwrap();
        assert!(
            challenge.starts_with(r#"Bearer error="insufficient_scope", scope="mcp""#),
            "{name}: {challenge}"
        );
        assert_rpc_refusal(&http, -32001, "the token needs the mcp scope");
    }

    // No token, a bad, an expired or a revoked one: 401 naming the metadata.
    fx.exec(
        "UPDATE personal_access_tokens SET revoked = true WHERE id = $1",
        &[&revoked_id],
    )
    .await;
    for (name, token) in [
        ("none", None),
        ("garbage", Some("glpat-not-a-token")),
        ("expired", Some(expired.as_str())),
        ("revoked", Some(revoked.as_str())),
    ] {
        let http = post_mcp(&server, token, None, init()).await;
        assert_eq!(http.status, 401, "{name}: {}", http.body);
        let challenge = http.headers["www-authenticate"].to_str().unwrap();
        assert!(
            challenge.starts_with(r#"Bearer resource_metadata=""#)
                && challenge.ends_with(&format!(
                    r#"{}", scope="mcp""#,
                    monolith::rest::mcp::RESOURCE_METADATA_PATH
                )),
            "{name}: {challenge}"
        );
        assert_rpc_refusal(&http, -32001, "401 Unauthorized");
    }

    // A blocked user's token: 403, said as GitLab says it.
    fx.exec(
        "UPDATE users SET state = 'blocked' WHERE id = $1",
        &[&blocked_user.id],
    )
    .await;
    let http = post_mcp(&server, Some(&blocked), None, init()).await;
    assert_eq!(http.status, 403, "{}", http.body);
    assert_rpc_refusal(
        &http,
        -32001,
        "403 Forbidden - Your account has been blocked.",
    );

    // The mcp scope opens the MCP server and nothing else of the API.
    let (status, body) = get(&server, &format!("/projects/{}", w.project), &mcp_only).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "insufficient_scope", "{body}");

    // A session outlives nothing: revoking the token or blocking the user
    // ends it at the next request.
    let (live, live_id) = token_with_id(fx, w.reporter, &["mcp"]).await;
    let mut mcp = Mcp::connect(&server, &live).await;
    mcp.call_ok("get_mcp_server_version", json!({})).await;
    fx.exec(
        "UPDATE personal_access_tokens SET revoked = true WHERE id = $1",
        &[&live_id],
    )
    .await;
    let http = mcp.send("tools/list", json!({})).await;
    assert_eq!(http.status, 401, "{}", http.body);
    let live = fx.token(w.reporter, &["mcp"]).await;
    let mut mcp = Mcp::connect(&server, &live).await;
    fx.exec(
        "UPDATE users SET state = 'blocked' WHERE id = $1",
        &[&w.reporter.id],
    )
    .await;
    let http = mcp.send("tools/list", json!({})).await;
    assert_eq!(http.status, 403, "{}", http.body);
}

#[tokio::test]
async fn a_session_id_carries_no_identity_each_request_runs_as_its_own_token() {
    let w = world().await;
    let fx = &w.fx;
    let iid = issue(fx, w.project, w.owner, "Rotate the signing key", "").await;
    let owner = fx.token(w.owner, &["mcp"]).await;
    let outsider = fx.token(w.outsider, &["mcp"]).await;
    let server = Server::start(fx).await;

    let mut mcp = Mcp::connect(&server, &owner).await;
    let args = json!({"id": "acme/api", "issue_iid": iid});
    let read = mcp.call_ok("get_issue", args.clone()).await;
    assert_eq!(read["title"], "Rotate the signing key");

    // The outsider presents the owner's session id with their own token.
    let body = json!({
        "jsonrpc": "2.0", "id": 99, "method": "tools/call",
        "params": {"name": "get_issue", "arguments": args},
    });
    let http = post_mcp(
        &server,
        Some(&outsider),
        Some(&mcp.session),
        body.to_string(),
    )
    .await;
    assert_eq!(http.status, 200, "{}", http.body);
    assert_eq!(http.body["id"], 99);
    assert_eq!(http.body["result"]["isError"], true, "{}", http.body);
    assert_eq!(
        texts(&http.body["result"]),
        vec!["404 Project Not Found".to_owned()]
    );
    // The session itself still answers its owner.
    let read = mcp.call_ok("get_issue", args).await;
    assert_eq!(read["title"], "Rotate the signing key");
}

// ---- 3. limits -----------------------------------------------------------------------

#[tokio::test]
async fn a_body_above_the_limit_is_a_413_with_a_json_rpc_error() {
    let w = world().await;
    let token = w.fx.token(w.owner, &["mcp"]).await;
    let server = Server::start_with_settings(
        &w.fx,
        w.fx.pool.clone(),
        &[("DUO_MCP_MAX_REQUEST_BYTES", "2048")],
    )
    .await;
    let message = "the request body is larger than 2048 bytes";
    let padded = |len: usize| {
        let mut body = initialize_body(1);
        body["params"]["clientInfo"]["name"] = json!("");
        let bare = body.to_string().len();
        body["params"]["clientInfo"]["name"] = json!("x".repeat(len - bare));
        let text = body.to_string();
        assert_eq!(text.len(), len);
        text
    };

    // Exactly at the limit passes; one byte more is refused (Content-Length).
    let http = post_mcp(&server, Some(&token), None, padded(2048)).await;
    assert_eq!(http.status, 200, "{}", http.body);
    let http = post_mcp(&server, Some(&token), None, padded(2049)).await;
    assert_eq!(http.status, 413, "{}", http.body);
    assert_rpc_refusal(&http, -32600, message);

    // Without a Content-Length (chunked), the body is counted as it comes.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..3).map(|_| Ok(vec![b' '; 1000])).collect();
    let stream = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let http = post_mcp(&server, Some(&token), None, stream).await;
    assert_eq!(http.status, 413, "{}", http.body);
    assert_rpc_refusal(&http, -32600, message);

    // A tool call too large is refused, and the session goes on.
    let mut mcp = Mcp::connect(&server, &token).await;
    let huge = json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "create_issue", "arguments": {"id": w.project, "title": "Big", "description": "d".repeat(4000)}},
    });
    let http = mcp.send_body(huge.to_string()).await;
    assert_eq!(http.status, 413, "{}", http.body);
    assert_rpc_refusal(&http, -32600, message);
    let count: i64 =
        w.fx.id(
            "SELECT count(*) FROM issues WHERE project_id = $1",
            &[&w.project],
        )
        .await;
    assert_eq!(count, 0, "the refused call created nothing");
    mcp.call_ok("get_mcp_server_version", json!({})).await;
}

fn minute_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60
}

#[tokio::test]
async fn a_token_past_its_requests_per_minute_gets_429_and_others_do_not() {
    let w = world().await;
    let server = Server::start_with_settings(
        &w.fx,
        w.fx.pool.clone(),
        &[("DUO_MCP_REQUESTS_PER_MINUTE", "5")],
    )
    .await;
    // The limiter counts per wall-clock minute: a burst that straddles two
    // minutes proves nothing, so it is run again (at most once more).
    for attempt in 0..2 {
        let started = minute_now();
        let flooding = w.fx.token(w.owner, &["mcp"]).await;
        let other = w.fx.token(w.owner, &["mcp"]).await;
        // initialize + initialized + 3 calls = 5 requests: all pass.
        let mut mcp = Mcp::connect(&server, &flooding).await;
        let mut answered = Vec::new();
        for _ in 0..3 {
            answered.push(
                mcp.send(
                    "tools/call",
                    json!({"name": "get_mcp_server_version", "arguments": {}}),
                )
                .await,
            );
        }
        let sixth = mcp.send("tools/list", json!({})).await;
        // Another token of the same user has its own budget.
        let mut fresh = Mcp::connect(&server, &other).await;
        let version = fresh
            .send(
                "tools/call",
                json!({"name": "get_mcp_server_version", "arguments": {}}),
            )
            .await;
        if minute_now() != started && attempt == 0 {
            continue;
        }
        for http in &answered {
            assert_eq!(http.status, 200, "{}", http.body);
            assert_eq!(http.body["result"]["isError"], false, "{}", http.body);
        }
        assert_eq!(sixth.status, 429, "{}", sixth.body);
        let retry: u64 = sixth.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&retry), "Retry-After: {retry}");
        assert_rpc_refusal(
            &sixth,
            -32000,
            "more than 5 requests this minute from this token",
        );
        assert_eq!(version.status, 200, "{}", version.body);
        assert_eq!(version.body["result"]["isError"], false);
        return;
    }
}

// ---- 4. the audit log --------------------------------------------------------------------

/// The user's audit rows (tool, outcome, token), once `want` of them landed:
/// the server writes them from a spawned task, after the answer.
async fn audit_rows(fx: &Fx, user: Actor, want: usize) -> Vec<(String, String, i64, i32)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let db = fx.pool.get().await.unwrap();
        let rows: Vec<(String, String, i64, i32)> = db
            .query(
                "SELECT tool, outcome, token_id, duration_ms FROM mcp_tool_calls
                 WHERE user_id = $1 ORDER BY id",
                &[&user.id],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect();
        if rows.len() >= want {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "{} audit rows after 10 s, wanted {want}: {rows:?}",
            rows.len()
        );
        drop(db);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn every_tool_call_lands_in_the_audit_log_with_its_outcome() {
    let w = world().await;
    let fx = &w.fx;
    let iid = issue(fx, w.project, w.owner, "Audited", "").await;
    let other_group = fx.group(None, "secret", "private", "ultimate").await;
    let hidden = fx.project(other_group, "vault", "private").await;
    let (token, token_id) = token_with_id(fx, w.reporter, &["mcp"]).await;
    let (_, owner_token_id) = token_with_id(fx, w.owner, &["mcp"]).await;
    let server = Server::start(fx).await;
    let mut mcp = Mcp::connect(&server, &token).await;

    mcp.call_ok("get_issue", json!({"id": w.project, "issue_iid": iid}))
        .await;
    let refused = mcp
        .call_refused("get_issue", json!({"id": hidden, "issue_iid": 1}))
        .await;
    assert_eq!(refused, "404 Project Not Found");
    let error = mcp
        .call_error("get_issue", json!({"id": w.project, "issue_iid": "one"}))
        .await;
    assert_eq!(error["code"], -32602, "{error}");
    // A tool that does not exist is no tool call.
    mcp.call_error("drop_database", json!({})).await;

    let rows = audit_rows(fx, w.reporter, 3).await;
    let seen: Vec<(&str, &str, i64)> = rows
        .iter()
        .map(|(tool, outcome, token, _)| (tool.as_str(), outcome.as_str(), *token))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("get_issue", "ok", token_id),
            ("get_issue", "refused", token_id),
            ("get_issue", "invalid_arguments", token_id),
        ]
    );
    assert!(rows.iter().all(|(.., ms)| *ms >= 0));
    let owner_rows: i64 = fx
        .id(
            "SELECT count(*) FROM mcp_tool_calls WHERE user_id = $1 OR token_id = $2",
            &[&w.owner.id, &owner_token_id],
        )
        .await;
    assert_eq!(owner_rows, 0, "no one else's calls are logged");
}

// ---- 5. Duo off -------------------------------------------------------------------------

#[tokio::test]
async fn tools_refuse_where_duo_is_off_and_rest_still_reads() {
    let w = world().await;
    let fx = &w.fx;
    let on = fx.project(w.group, "web", "private").await;
    fx.project_duo(w.project, false).await;
    let off_iid = issue(fx, w.project, w.owner, "Flaky login", "").await;
    let on_iid = issue(fx, on, w.owner, "Flaky logout", "").await;
    let reporter = fx.token(w.reporter, &["mcp"]).await;
    let reporter_api = fx.token(w.reporter, &["api"]).await;
    let outsider = fx.token(w.outsider, &["mcp"]).await;
    let server = Server::start(fx).await;
    let mut mcp = Mcp::connect(&server, &reporter).await;

    let refused = mcp
        .call_refused("get_issue", json!({"id": w.project, "issue_iid": off_iid}))
        .await;
    assert_eq!(refused, DUO_OFF);
    assert!(!refused.contains("Flaky"), "{refused}");
    let refused = mcp
        .call_refused("get_issue", json!({"id": "acme/api", "issue_iid": off_iid}))
        .await;
    assert_eq!(refused, DUO_OFF, "by path too");
    let refused = mcp
        .call_refused(
            "get_workitem_notes",
            json!({"project_id": w.project, "work_item_iid": off_iid}),
        )
        .await;
    assert_eq!(refused, DUO_OFF);
    let read = mcp
        .call_ok("get_issue", json!({"id": on, "issue_iid": on_iid}))
        .await;
    assert_eq!(read["title"], "Flaky logout");
    // Search skips the project whose Duo is off.
    let hits = mcp
        .call_ok(
            "search",
            json!({"scope": "issues", "search": "flaky", "group_id": "acme"}),
        )
        .await;
    let titles: Vec<&str> = hits
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["title"].as_str().unwrap())
        .collect();
    assert_eq!(titles, vec!["Flaky logout"]);

    // REST is not a Duo feature: it still reads the project.
    let (status, body) = get(
        &server,
        &format!("/projects/{}/issues/{off_iid}", w.project),
        &reporter_api,
    )
    .await;
    assert_eq!((status, &body["title"]), (200, &json!("Flaky login")));

    // Someone who cannot read the project learns nothing of its Duo setting.
    let mut stranger = Mcp::connect(&server, &outsider).await;
    let refused = stranger
        .call_refused("get_issue", json!({"id": w.project, "issue_iid": off_iid}))
        .await;
    assert_eq!(refused, "404 Project Not Found");

    // Off for the group: every project under it, and its epics.
    fx.group_flag(w.group, "duo_features_enabled", false).await;
    let epic = fx.epic(w.group, w.owner, false).await;
    fx.note("Epic", epic, w.owner, false).await;
    let refused = mcp
        .call_refused("get_issue", json!({"id": on, "issue_iid": on_iid}))
        .await;
    assert_eq!(refused, DUO_OFF);
    let refused = mcp
        .call_refused(
            "get_workitem_notes",
            json!({"group_id": "acme", "work_item_iid": 1}),
        )
        .await;
    assert_eq!(refused, DUO_OFF);
    let refused = mcp
        .call_refused(
            "create_workitem_note",
            json!({"group_id": w.group, "work_item_iid": 1, "body": "hi"}),
        )
        .await;
    assert_eq!(refused, DUO_OFF);
    let notes: i64 = fx
        .id(
            "SELECT count(*) FROM notes WHERE noteable_type = 'Epic' AND noteable_id = $1",
            &[&epic],
        )
        .await;
    assert_eq!(notes, 1, "the refused note was not written");
}

// ---- 6. Duo context exclusion ----------------------------------------------------------

const SECRET: &str = "SECRET_MARKER_hunter2";
const PLAIN: &str = "PLAIN_MARKER_fn";

#[tokio::test]
async fn excluded_files_keep_their_diff_entry_without_their_content() {
    let w = world().await;
    let fx = &w.fx;
    let owner_api = fx.token(w.owner, &["api"]).await;
    let reporter = fx.token(w.reporter, &["mcp"]).await;
    let server = Server::start(fx).await;
    let secret_rs = format!("// {SECRET}\npub const KEY: &str = \"x\";\n");
    let secret_env = format!("TOKEN={SECRET}\n");
    let plain = format!("// {PLAIN}\npub fn app() {{}}\n");
    repository(
        &server,
        w.project,
        &owner_api,
        &[(
            "Add files",
            &[
                ("secrets/key.rs", secret_rs.as_str()),
                ("config/prod.env", secret_env.as_str()),
                ("src/app.rs", plain.as_str()),
            ],
        )],
    )
    .await;
    fx.exec(
        "UPDATE projects SET duo_context_exclusion_rules = '{secrets/,*.env}' WHERE id = $1",
        &[&w.project],
    )
    .await;
    let iid = merge_request(&server, w.project, &owner_api, "feature").await;
    let mut mcp = Mcp::connect(&server, &reporter).await;

    let result = mcp
        .call(
            "get_merge_request_diffs",
            json!({"id": w.project, "merge_request_iid": iid}),
        )
        .await;
    assert_eq!(result["isError"], false, "{result}");
    assert!(
        !result.to_string().contains(SECRET),
        "excluded content reached the client: {result}"
    );
    let diffs: Value = serde_json::from_str(&texts(&result)[0]).unwrap();
    let mut by_path: Vec<(String, String)> = diffs
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["new_path"].as_str().unwrap().to_owned(),
                d["diff"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    by_path.sort();
    let paths: Vec<&str> = by_path.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        vec!["config/prod.env", "secrets/key.rs", "src/app.rs"]
    );
    for (path, diff) in &by_path[..2] {
        assert_eq!(
            diff,
            &format!(
                "The content of {path} is not shown: the project's Duo context exclusion rules exclude it."
            )
        );
    }
    assert!(
        by_path[2].1.contains(&format!("+// {PLAIN}")),
        "{}",
        by_path[2].1
    );

    // The REST API shows people the whole diff: the rules are about AI.
    let (status, rest) = get(
        &server,
        &format!("/projects/{}/merge_requests/{iid}/diffs", w.project),
        &owner_api,
    )
    .await;
    assert_eq!(status, 200, "{rest}");
    assert!(rest.to_string().contains(SECRET));
}

// ---- 7. merge request commits and pipelines, pipeline jobs ------------------------------

#[tokio::test]
async fn merge_request_commits_pipelines_and_jobs_through_rest_and_tools() {
    let w = world().await;
    let fx = &w.fx;
    let owner_api = fx.token(w.owner, &["api"]).await;
    let reporter_api = fx.token(w.reporter, &["api"]).await;
    let guest_api = fx.token(w.guest, &["api"]).await;
    let reporter = fx.token(w.reporter, &["mcp"]).await;
    let guest = fx.token(w.guest, &["mcp"]).await;
    let elsewhere_group = fx.group(None, "oss", "public", "free").await;
    let elsewhere = fx.project(elsewhere_group, "lib", "public").await;
    let foreign_build = fx.build(elsewhere).await;
    let foreign_pipeline: i64 = fx
        .id(
            "SELECT pipeline_id FROM ci_builds WHERE id = $1",
            &[&foreign_build],
        )
        .await;
    let server = Server::start(fx).await;
    let p = w.project;
    let commits = repository(
        &server,
        p,
        &owner_api,
        &[
            (
                "Add the parser",
                &[("src/parser.rs", "pub fn parse() {}\n")],
            ),
            ("Add the lexer", &[("src/lexer.rs", "pub fn lex() {}\n")]),
        ],
    )
    .await;
    let iid = merge_request(&server, p, &owner_api, "feature").await;
    let ghost = merge_request(&server, p, &owner_api, "ghost").await;
    let rspec = import_job(&server, p, &owner_api, "rspec", "failed", "feature").await;
    import_job(&server, p, &owner_api, "deploy", "success", "main").await;
    let lint = import_job(&server, p, &owner_api, "lint", "success", "feature").await;

    // REST: the source branch's own commits, newest first; its pipelines.
    let mr = format!("/projects/{p}/merge_requests/{iid}");
    let (status, rest_commits) = get(&server, &format!("{mr}/commits"), &reporter_api).await;
    assert_eq!(status, 200, "{rest_commits}");
    let ids: Vec<&str> = rest_commits
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![commits[1].as_str(), commits[0].as_str()]);
    assert_eq!(rest_commits[0]["title"], "Add the lexer");
    let (status, rest_pipelines) = get(&server, &format!("{mr}/pipelines"), &reporter_api).await;
    assert_eq!(status, 200, "{rest_pipelines}");
    let pipeline_ids: Vec<i64> = rest_pipelines
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        pipeline_ids,
        vec![lint, rspec],
        "feature only, newest first"
    );
    let ghost_mr = format!("/projects/{p}/merge_requests/{ghost}");
    let (status, none) = get(&server, &format!("{ghost_mr}/commits"), &reporter_api).await;
    assert_eq!(
        (status, none),
        (200, json!([])),
        "no source branch, no commits"
    );
    let (status, none) = get(&server, &format!("{ghost_mr}/pipelines"), &reporter_api).await;
    assert_eq!((status, none), (200, json!([])));
    // A guest does not read merge requests of a private project, nor CI.
    let (status, _) = get(&server, &format!("{mr}/commits"), &guest_api).await;
    assert_eq!(status, 404);
    let (status, _) = get(&server, &format!("{mr}/pipelines"), &guest_api).await;
    assert_eq!(status, 404);

    // The tools answer what REST answers.
    let mut mcp = Mcp::connect(&server, &reporter).await;
    let args = json!({"id": "acme/api", "merge_request_iid": iid});
    let tool_commits = mcp.call_ok("get_merge_request_commits", args.clone()).await;
    assert_eq!(tool_commits, rest_commits);
    let older = mcp
        .call_ok(
            "get_merge_request_commits",
            json!({"id": p, "merge_request_iid": iid, "per_page": 1, "page": 2}),
        )
        .await;
    assert_eq!(older.as_array().unwrap().len(), 1);
    assert_eq!(older[0]["id"], commits[0].as_str());
    let tool_pipelines = mcp.call_ok("get_merge_request_pipelines", args).await;
    assert_eq!(tool_pipelines, rest_pipelines);
    let jobs = mcp
        .call_ok("get_pipeline_jobs", json!({"id": p, "pipeline_id": rspec}))
        .await;
    let (status, rest_jobs) = get(
        &server,
        &format!("/projects/{p}/pipelines/{rspec}/jobs"),
        &reporter_api,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(jobs, rest_jobs);
    assert_eq!(jobs.as_array().unwrap().len(), 1);
    assert_eq!(jobs[0]["name"], "rspec");
    assert_eq!(jobs[0]["status"], "failed");
    // Another project's pipeline is not found through this one.
    let refused = mcp
        .call_refused(
            "get_pipeline_jobs",
            json!({"id": p, "pipeline_id": foreign_pipeline}),
        )
        .await;
    assert_eq!(refused, "404 Pipeline Not Found");

    // A guest reads the project but not its CI: a 403, and no job data.
    let mut guest_mcp = Mcp::connect(&server, &guest).await;
    let refused = guest_mcp
        .call_refused("get_pipeline_jobs", json!({"id": p, "pipeline_id": rspec}))
        .await;
    assert_eq!(refused, "403 Forbidden");
    let refused = guest_mcp
        .call_refused(
            "get_merge_request_pipelines",
            json!({"id": p, "merge_request_iid": iid}),
        )
        .await;
    assert_eq!(refused, "404 Merge Request Not Found");
    assert!(!refused.contains("rspec") && !refused.contains("lint"));
    let refused = guest_mcp
        .call_refused(
            "get_merge_request_commits",
            json!({"id": p, "merge_request_iid": iid}),
        )
        .await;
    assert_eq!(refused, "404 Merge Request Not Found");
}

// ---- 8. the answer cap ----------------------------------------------------------------------

#[tokio::test]
async fn answers_above_the_cap_keep_whole_items_and_say_so() {
    let w = world().await;
    let fx = &w.fx;
    let issue_id = fx.issue(w.project, w.owner, false).await;
    fx.exec(
        "UPDATE issues SET description = $2 WHERE id = $1",
        &[&issue_id, &"é".repeat(1000)],
    )
    .await;
    let mut note_ids = Vec::new();
    for _ in 0..10 {
        note_ids.push(fx.note("Issue", issue_id, w.owner, false).await);
    }
    let token = fx.token(w.reporter, &["mcp"]).await;
    let server =
        Server::start_with_settings(fx, fx.pool.clone(), &[("DUO_MCP_MAX_ANSWER_BYTES", "1500")])
            .await;
    let mut mcp = Mcp::connect(&server, &token).await;

    let result = mcp
        .call(
            "get_workitem_notes",
            json!({"project_id": w.project, "work_item_iid": 1}),
        )
        .await;
    assert_eq!(result["isError"], false, "{result}");
    let blocks = texts(&result);
    assert_eq!(blocks.len(), 2, "{result}");
    assert!(blocks[0].len() <= 1500, "{} bytes", blocks[0].len());
    let kept: Value = serde_json::from_str(&blocks[0]).expect("the kept items are whole JSON");
    let kept_ids: Vec<i64> = kept
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_i64().unwrap())
        .collect();
    assert!(
        !kept_ids.is_empty() && kept_ids.len() < 10,
        "{} kept",
        kept_ids.len()
    );
    assert_eq!(
        kept_ids,
        note_ids[..kept_ids.len()],
        "the first items, oldest first"
    );
    assert!(
        kept.as_array()
            .unwrap()
            .iter()
            .all(|n| n["body"] == "a note")
    );
    assert_eq!(
        blocks[1],
        format!(
            "The answer was cut to 1500 bytes: {} of 10 items are shown; ask for a smaller page (per_page) to see the rest.",
            kept_ids.len()
        )
    );
    // A smaller page fits whole.
    let page = mcp
        .call(
            "get_workitem_notes",
            json!({"project_id": w.project, "work_item_iid": 1, "per_page": 1, "page": 3}),
        )
        .await;
    let page_blocks = texts(&page);
    assert_eq!(page_blocks.len(), 1, "{page}");
    let page: Value = serde_json::from_str(&page_blocks[0]).unwrap();
    assert_eq!(
        page.as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        note_ids[2..3]
    );

    // One object too long: cut on a character boundary, and said so.
    let result = mcp
        .call("get_issue", json!({"id": w.project, "issue_iid": 1}))
        .await;
    assert_eq!(result["isError"], false, "{result}");
    let blocks = texts(&result);
    assert_eq!(blocks.len(), 2, "{result}");
    assert!(blocks[0].len() <= 1500 && blocks[0].len() >= 1497);
    assert!(blocks[0].starts_with('{'));
    assert!(
        blocks[1].starts_with("The answer was cut to 1500 bytes of "),
        "{}",
        blocks[1]
    );
}

// ---- 9. epic notes ----------------------------------------------------------------------------

#[tokio::test]
async fn epic_notes_are_read_and_written_through_group_id() {
    let w = world().await;
    let fx = &w.fx;
    let epic = fx.epic(w.group, w.owner, false).await;
    fx.note("Epic", epic, w.owner, false).await;
    fx.note("Epic", epic, w.owner, true).await;
    let secret_epic = fx.epic(w.group, w.owner, true).await;
    fx.note("Epic", secret_epic, w.owner, false).await;
    let reporter = fx.token(w.reporter, &["mcp"]).await;
    let guest = fx.token(w.guest, &["mcp"]).await;
    let owner_api = fx.token(w.owner, &["api"]).await;
    let server = Server::start(fx).await;

    let mut mcp = Mcp::connect(&server, &reporter).await;
    let notes = mcp
        .call_ok(
            "get_workitem_notes",
            json!({"group_id": "acme", "work_item_iid": 1}),
        )
        .await;
    let internal: Vec<bool> = notes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["internal"].as_bool().unwrap())
        .collect();
    assert_eq!(
        internal,
        vec![false, true],
        "a reporter reads internal notes"
    );
    let created = mcp
        .call_ok(
            "create_workitem_note",
            json!({"group_id": w.group, "work_item_iid": 1, "body": "Planned for 18.0"}),
        )
        .await;
    assert_eq!(created["body"], "Planned for 18.0");
    assert_eq!(created["author"]["username"], "reporter");
    let (status, listed) = get(
        &server,
        &format!("/groups/{}/epics/{epic}/notes?sort=asc", w.group),
        &owner_api,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["body"] == "Planned for 18.0" && n["id"] == created["id"]),
        "{listed}"
    );
    let error = mcp
        .call_error(
            "get_workitem_notes",
            json!({"group_id": "acme", "project_id": w.project, "work_item_iid": 1}),
        )
        .await;
    assert_eq!(error["code"], -32602, "{error}");

    // A guest: no internal notes, no confidential epic.
    let mut guest_mcp = Mcp::connect(&server, &guest).await;
    let notes = guest_mcp
        .call_ok(
            "get_workitem_notes",
            json!({"group_id": "acme", "work_item_iid": 1}),
        )
        .await;
    assert!(
        notes
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["internal"] == false),
        "{notes}"
    );
    let refused = guest_mcp
        .call_refused(
            "get_workitem_notes",
            json!({"group_id": "acme", "work_item_iid": 2}),
        )
        .await;
    assert_eq!(refused, "404 Epic Not Found");
    let refused = guest_mcp
        .call_refused(
            "create_workitem_note",
            json!({"group_id": "acme", "work_item_iid": 1, "body": "psst", "internal": true}),
        )
        .await;
    assert!(refused.starts_with("403"), "{refused}");
}

// ---- 10. JSON-RPC errors ------------------------------------------------------------------

#[tokio::test]
async fn an_unknown_tool_or_arguments_off_the_schema_are_json_rpc_errors() {
    let w = world().await;
    let token = w.fx.token(w.reporter, &["mcp"]).await;
    let server = Server::start(&w.fx).await;
    let mut mcp = Mcp::connect(&server, &token).await;

    let http = mcp
        .send(
            "tools/call",
            json!({"name": "delete_project", "arguments": {"id": w.project}}),
        )
        .await;
    assert_eq!(http.status, 200, "{}", http.body);
    assert_eq!(
        http.body["id"],
        mcp.next_id - 1,
        "the error answers the request"
    );
    assert_eq!(http.body["error"]["code"], -32602, "{}", http.body);
    assert_eq!(
        http.body["error"]["message"],
        "unknown tool: delete_project"
    );
    assert!(http.body.get("result").is_none());

    for (tool, arguments) in [
        ("get_issue", json!({"id": w.project})),
        (
            "get_issue",
            json!({"id": w.project, "issue_iid": 1, "title": "x"}),
        ),
        ("get_pipeline_jobs", json!({"id": true, "pipeline_id": 1})),
        ("search", json!({"scope": "issues"})),
        ("semantic_code_search", json!({"project_id": w.project})),
    ] {
        let error = mcp.call_error(tool, arguments.clone()).await;
        assert_eq!(error["code"], -32602, "{tool} {arguments}: {error}");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .starts_with("invalid arguments: "),
            "{tool} {arguments}: {error}"
        );
    }
}

// ---- the tool time limit -----------------------------------------------------------------

#[tokio::test]
async fn a_tool_call_past_its_time_is_stopped_and_logged_as_a_timeout() {
    let w = world().await;
    let fx = &w.fx;
    let iid = issue(fx, w.project, w.owner, "Slow", "").await;
    let token = fx.token(w.reporter, &["mcp"]).await;
    let server =
        Server::start_with_settings(fx, fx.pool.clone(), &[("DUO_MCP_TOOL_TIMEOUT_SECS", "1")])
            .await;
    let mut mcp = Mcp::connect(&server, &token).await;

    // Another transaction holds the issues table: reading an issue waits.
    let mut holder = fx.pool.get().await.unwrap();
    let lock = holder.transaction().await.unwrap();
    lock.execute("LOCK TABLE issues IN ACCESS EXCLUSIVE MODE", &[])
        .await
        .unwrap();
    let started = Instant::now();
    let refused = mcp
        .call_refused("get_issue", json!({"id": w.project, "issue_iid": iid}))
        .await;
    let took = started.elapsed();
    lock.rollback().await.unwrap();
    assert_eq!(
        refused,
        "the tool call took longer than 1 s and was stopped"
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(10),
        "{took:?}"
    );
    let rows = audit_rows(fx, w.reporter, 1).await;
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_str()),
        ("get_issue", "timeout")
    );
    assert!(rows[0].3 >= 1000, "{} ms", rows[0].3);

    // The lock gone, the same call answers.
    let read = mcp
        .call_ok("get_issue", json!({"id": w.project, "issue_iid": iid}))
        .await;
    assert_eq!(read["title"], "Slow");
}

/// An OAuth access token of `user` with the `mcp` scope (a row of
/// `oauth_access_tokens`, as an MCP client's) whose id is `id`: the two
/// tables count their ids apart, so tokens are minted until one is numbered
/// so. `None` when the OAuth ids have passed `id` already.
async fn oauth_mcp_token_numbered(fx: &Fx, user: Actor, id: i64) -> Option<String> {
    let db = fx.pool.get().await.unwrap();
    loop {
        let minted = monolith::identity::oauth::mint(
            &**db,
            user.id,
            monolith::identity::oauth::USER_TOKEN_LIFETIME,
        )
        .await
        .unwrap();
        if minted.id > id {
            return None;
        }
        if minted.id == id {
            db.execute(
                "UPDATE oauth_access_tokens SET scopes = '{mcp}' WHERE id = $1",
                &[&minted.id],
            )
            .await
            .unwrap();
            return Some(minted.token);
        }
    }
}

#[tokio::test]
async fn a_personal_and_an_oauth_token_with_the_same_id_have_their_own_budgets() {
    let w = world().await;
    let fx = &w.fx;
    let server =
        Server::start_with_settings(fx, fx.pool.clone(), &[("DUO_MCP_REQUESTS_PER_MINUTE", "3")])
            .await;
    for attempt in 0..2 {
        let started = minute_now();
        let (pat, pat_id) = token_with_id(fx, w.owner, &["mcp"]).await;
        // Another user's OAuth token for an MCP client, numbered like the PAT.
        let oauth = oauth_mcp_token_numbered(fx, w.reporter, pat_id)
            .await
            .unwrap_or_else(|| panic!("no OAuth token numbered {pat_id}"));
        // The owner's PAT spends its 3 requests.
        let mut mcp = Mcp::connect(&server, &pat).await;
        let call = mcp
            .send(
                "tools/call",
                json!({"name": "get_mcp_server_version", "arguments": {}}),
            )
            .await;
        let spent = mcp.send("tools/list", json!({})).await;
        // The reporter's OAuth token has spent nothing.
        let other = post_mcp(&server, Some(&oauth), None, initialize_body(1).to_string()).await;
        if minute_now() != started && attempt == 0 {
            continue;
        }
        assert_eq!(call.status, 200, "{}", call.body);
        assert_eq!(spent.status, 429, "the PAT used its minute: {}", spent.body);
        assert_eq!(
            other.status, 200,
            "another user's OAuth token was refused with the PAT's budget: {}",
            other.body
        );
        return;
    }
}

#[tokio::test]
async fn a_note_asked_to_be_confidential_is_never_posted_in_public() {
    let w = world().await;
    let fx = &w.fx;
    let iid = issue(fx, w.project, w.owner, "Incident", "").await;
    let token = fx.token(w.reporter, &["mcp"]).await;
    let server = Server::start(fx).await;
    let mut mcp = Mcp::connect(&server, &token).await;

    // `confidential` is the REST API's older name of `internal`: a client
    // sending it means a note only members see.
    let http = mcp
        .send(
            "tools/call",
            json!({"name": "create_workitem_note", "arguments": {
                "project_id": w.project, "work_item_iid": iid,
                "body": "The leaked key is AKIA-EXAMPLE", "confidential": true,
            }}),
        )
        .await;
    assert_eq!(http.status, 200, "{}", http.body);
    let public: i64 = fx
        .id(
            "SELECT count(*) FROM notes WHERE body LIKE 'The leaked key%' AND NOT internal",
            &[],
        )
        .await;
    assert_eq!(public, 0, "a public note was posted: {}", http.body);
    if let Some(error) = http.body.get("error") {
        assert_eq!(error["code"], -32602, "{error}");
    }
    // Any argument off the schema is refused, as the schema says.
    let http = mcp
        .send(
            "tools/call",
            json!({"name": "search", "arguments": {"scope": "issues", "search": "incident", "bogus": 1}}),
        )
        .await;
    assert_eq!(http.body["error"]["code"], -32602, "{}", http.body);
}

// ---- arguments outside their schema's bounds ------------------------------------------------

#[tokio::test]
async fn arguments_outside_their_schema_bounds_are_json_rpc_invalid_params() {
    let w = world().await;
    let fx = &w.fx;
    let iid = issue(fx, w.project, w.owner, "Paged", "").await;
    let issue_id = iid_to_id(fx, w.project, iid).await;
    for _ in 0..3 {
        fx.note("Issue", issue_id, w.owner, false).await;
    }
    let token = fx.token(w.reporter, &["mcp"]).await;
    let server = Server::start(fx).await;
    let mut mcp = Mcp::connect(&server, &token).await;
    let notes = |extra: Value| {
        let mut arguments = json!({"project_id": w.project, "work_item_iid": iid});
        for (k, v) in extra.as_object().unwrap() {
            arguments[k] = v.clone();
        }
        arguments
    };

    for (tool, arguments, message) in [
        (
            "get_workitem_notes",
            notes(json!({"page": 0})),
            "page must be at least 1",
        ),
        (
            "get_workitem_notes",
            notes(json!({"per_page": 0})),
            "per_page must be at least 1",
        ),
        (
            "get_workitem_notes",
            notes(json!({"per_page": 101})),
            "per_page must be at most 100",
        ),
        (
            "get_merge_request_commits",
            json!({"id": w.project, "merge_request_iid": 1, "page": 0}),
            "page must be at least 1",
        ),
        (
            "get_pipeline_jobs",
            json!({"id": w.project, "pipeline_id": 1, "per_page": 0}),
            "per_page must be at least 1",
        ),
        (
            "get_pipeline_jobs",
            json!({"id": w.project, "pipeline_id": 0}),
            "pipeline_id must be at least 1",
        ),
        (
            "get_issue",
            json!({"id": w.project, "issue_iid": 0}),
            "issue_iid must be at least 1",
        ),
        (
            "get_merge_request",
            json!({"id": w.project, "merge_request_iid": -1}),
            "merge_request_iid must be at least 1",
        ),
        (
            "get_workitem_notes",
            json!({"project_id": w.project, "work_item_iid": 0}),
            "work_item_iid must be at least 1",
        ),
        (
            "search",
            json!({"scope": "issues", "search": "paged", "page": 0}),
            "page must be at least 1",
        ),
        (
            "search",
            json!({"scope": "wikis", "search": "paged"}),
            "scope must be one of issues, merge_requests, projects",
        ),
        (
            "search",
            json!({"scope": "issues", "search": ""}),
            "search must be at least 1 characters long",
        ),
        (
            "create_issue",
            json!({"id": w.project, "title": "t".repeat(256)}),
            "title must be at most 255 characters long",
        ),
        (
            "semantic_code_search",
            json!({"project_id": w.project, "semantic_query": "q".repeat(2001)}),
            "semantic_query must be at most 2000 characters long",
        ),
    ] {
        let error = mcp.call_error(tool, arguments.clone()).await;
        assert_eq!(error["code"], -32602, "{tool} {arguments}: {error}");
        assert_eq!(
            error["message"],
            format!("invalid arguments: {message}"),
            "{tool} {arguments}"
        );
    }
    let created: i64 = fx
        .id(
            "SELECT count(*) FROM issues WHERE project_id = $1",
            &[&w.project],
        )
        .await;
    assert_eq!(created, 1, "the refused create_issue created nothing");

    // The bounds themselves pass: 255 characters counted as characters,
    // per_page 100, and a page past the end is an empty list.
    let read = mcp
        .call_ok(
            "get_workitem_notes",
            notes(json!({"page": 1, "per_page": 100})),
        )
        .await;
    assert_eq!(read.as_array().unwrap().len(), 3, "{read}");
    let second = mcp
        .call_ok(
            "get_workitem_notes",
            notes(json!({"page": 2, "per_page": 2})),
        )
        .await;
    assert_eq!(second.as_array().unwrap().len(), 1, "{second}");
    let past = mcp
        .call_ok(
            "get_workitem_notes",
            notes(json!({"page": 3, "per_page": 2})),
        )
        .await;
    assert_eq!(past, json!([]));
    let hits = mcp
        .call_ok(
            "search",
            json!({"scope": "issues", "search": "é".repeat(255), "project_id": w.project}),
        )
        .await;
    assert_eq!(
        hits,
        json!([]),
        "255 two-byte characters are within maxLength"
    );
}

/// The id of the issue `iid` of `project`.
async fn iid_to_id(fx: &Fx, project: i64, iid: i32) -> i64 {
    fx.id(
        "SELECT id FROM issues WHERE project_id = $1 AND iid = $2",
        &[&project, &iid],
    )
    .await
}

// ---- search where Duo is off -----------------------------------------------------------------

#[tokio::test]
async fn search_in_a_project_or_group_with_duo_off_says_so_to_readers_only() {
    let w = world().await;
    let fx = &w.fx;
    let on = fx.project(w.group, "web", "private").await;
    issue(fx, w.project, w.owner, "Flaky login", "").await;
    issue(fx, on, w.owner, "Flaky logout", "").await;
    fx.project_duo(w.project, false).await;
    let reporter = fx.token(w.reporter, &["mcp"]).await;
    let outsider = fx.token(w.outsider, &["mcp"]).await;
    let server = Server::start(fx).await;
    let mut mcp = Mcp::connect(&server, &reporter).await;
    let mut stranger = Mcp::connect(&server, &outsider).await;
    let search =
        |project: Value| json!({"scope": "issues", "search": "flaky", "project_id": project});

    // A reader is told why, by id or by path, as get_issue tells them.
    for project in [json!(w.project), json!("acme/api"), json!("acme%2Fapi")] {
        let refused = mcp.call_refused("search", search(project.clone())).await;
        assert_eq!(refused, DUO_OFF, "{project}");
    }
    let refused = mcp
        .call_refused("get_issue", json!({"id": w.project, "issue_iid": 1}))
        .await;
    assert_eq!(refused, DUO_OFF);
    let hits = mcp.call_ok("search", search(json!(on))).await;
    assert_eq!(hits[0]["title"], "Flaky logout", "{hits}");

    // Someone who cannot read it gets a project that does not exist's answer.
    let hidden = stranger
        .call_refused("search", search(json!(w.project)))
        .await;
    let missing = stranger
        .call_refused("search", search(json!(999_999)))
        .await;
    let missing_path = stranger
        .call_refused("search", search(json!("acme/nothing")))
        .await;
    assert_eq!(hidden, "404 Project Not Found");
    assert_eq!(missing, hidden);
    assert_eq!(missing_path, hidden);
    let by_get_issue = stranger
        .call_refused("get_issue", json!({"id": w.project, "issue_iid": 1}))
        .await;
    assert_eq!(by_get_issue, hidden, "search and get_issue agree");
    let missing = mcp.call_refused("search", search(json!(999_999))).await;
    assert_eq!(
        missing, hidden,
        "a reader of other projects learns nothing either"
    );

    // Off for the group: a reader of the group is told, others get 404.
    fx.group_flag(w.group, "duo_features_enabled", false).await;
    let by_group = json!({"scope": "issues", "search": "flaky", "group_id": "acme"});
    let refused = mcp.call_refused("search", by_group.clone()).await;
    assert_eq!(refused, DUO_OFF);
    let refused = mcp.call_refused("search", search(json!(on))).await;
    assert_eq!(refused, DUO_OFF);
    let hidden = stranger.call_refused("search", by_group).await;
    assert_eq!(hidden, "404 Group Not Found");
    let missing = stranger
        .call_refused(
            "search",
            json!({"scope": "issues", "search": "flaky", "group_id": "nowhere"}),
        )
        .await;
    assert_eq!(missing, hidden);
}

// ---- the audit log's token kind ----------------------------------------------------------------

#[tokio::test]
async fn the_audit_log_tells_a_personal_token_from_an_oauth_token_with_the_same_id() {
    let w = world().await;
    let fx = &w.fx;
    let (pat, pat_id) = token_with_id(fx, w.reporter, &["mcp"]).await;
    let oauth = oauth_mcp_token_numbered(fx, w.reporter, pat_id)
        .await
        .unwrap_or_else(|| panic!("no OAuth token numbered {pat_id}"));
    let server = Server::start(fx).await;

    let mut by_pat = Mcp::connect(&server, &pat).await;
    by_pat.call_ok("get_mcp_server_version", json!({})).await;
    audit_rows(fx, w.reporter, 1).await;
    let mut by_oauth = Mcp::connect(&server, &oauth).await;
    by_oauth.call_ok("get_mcp_server_version", json!({})).await;
    audit_rows(fx, w.reporter, 2).await;

    let db = fx.pool.get().await.unwrap();
    let rows: Vec<(i64, String)> = db
        .query(
            "SELECT token_id, token_kind FROM mcp_tool_calls WHERE user_id = $1 ORDER BY id",
            &[&w.reporter.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        rows,
        vec![
            (pat_id, "personal_access_token".to_owned()),
            (pat_id, "oauth_access_token".to_owned()),
        ]
    );
    // The column takes nothing else.
    let bad = db
        .execute(
            "INSERT INTO mcp_tool_calls (user_id, token_id, token_kind, tool, outcome, duration_ms)
             VALUES ($1, 1, 'job_token', 'x', 'ok', 0)",
            &[&w.reporter.id],
        )
        .await;
    assert!(bad.is_err(), "a token kind outside the two was stored");
}

// ---- OAuth: bodies the endpoints cannot read -------------------------------------------------------

/// One POST to `path` with this content type (none when `None`) and body:
/// the status, the `Content-Type` and the body as JSON (`Null` if it is not).
async fn post_raw(
    server: &Server,
    path: &str,
    content_type: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> (u16, String, Value) {
    let mut req = reqwest::Client::new().post(server.url(path)).body(body);
    if let Some(content_type) = content_type {
        req = req.header("content-type", content_type);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let kind = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = res.text().await.unwrap();
    (
        status,
        kind,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// An RFC 6749 / RFC 7591 error answer: 400, JSON, `error` and a description
/// starting with `description`.
fn assert_oauth_error(answer: &(u16, String, Value), error: &str, description: &str, what: &str) {
    let (status, kind, body) = answer;
    assert_eq!(*status, 400, "{what}: {body}");
    assert!(kind.starts_with("application/json"), "{what}: {kind}");
    assert_eq!(body["error"], error, "{what}: {body}");
    let said = body["error_description"].as_str().unwrap_or_default();
    assert!(
        said.starts_with(description),
        "{what}: {said:?} should start with {description:?}"
    );
}

#[tokio::test]
async fn oauth_register_answers_bodies_it_cannot_read_with_invalid_client_metadata() {
    let fx = Fx::new().await;
    let server = Server::start(&fx).await;
    let json = Some("application/json");
    let good = json!({"client_name": "Editor", "redirect_uris": ["http://127.0.0.1:8123/cb"]});
    let metadata = "invalid_client_metadata";

    for (what, content_type, body, description) in [
        (
            "not JSON",
            json,
            "{client_name:".to_owned(),
            "the body is not JSON",
        ),
        (
            "an array",
            json,
            "[]".to_owned(),
            "the client metadata must be a JSON object",
        ),
        (
            "a string",
            json,
            r#""Editor""#.to_owned(),
            "the client metadata must be a JSON object",
        ),
        (
            // serde alone would read a struct from an array, field by field.
            "an array of the fields",
            json,
            r#"["Editor", ["http://127.0.0.1:8123/cb"]]"#.to_owned(),
            "the client metadata must be a JSON object",
        ),
        (
            "a field of the wrong type",
            json,
            r#"{"client_name": 5, "redirect_uris": []}"#.to_owned(),
            "the client metadata is not valid",
        ),
        (
            "text/plain",
            Some("text/plain"),
            good.to_string(),
            "the body must be application/json",
        ),
        (
            "no content type",
            None,
            good.to_string(),
            "the body must be application/json",
        ),
        (
            "too large",
            json,
            json!({"client_name": "x".repeat(20_000), "redirect_uris": []}).to_string(),
            "the body is larger than 16384 bytes",
        ),
    ] {
        let answer = post_raw(&server, "/oauth/register", content_type, body).await;
        assert_oauth_error(&answer, metadata, description, what);
    }
    let registered: i64 = fx.id("SELECT count(*) FROM oauth_applications", &[]).await;
    assert_eq!(registered, 0);

    // A well-formed registration still registers.
    let (status, _, body) = post_raw(&server, "/oauth/register", json, good.to_string()).await;
    assert_eq!(status, 201, "{body}");
    assert!(body["client_id"].as_str().is_some_and(|id| !id.is_empty()));
}

#[tokio::test]
async fn oauth_token_and_revoke_answer_forms_they_cannot_read_with_invalid_request() {
    let fx = Fx::new().await;
    let server = Server::start(&fx).await;
    let form = Some("application/x-www-form-urlencoded");
    let as_json = Some("application/json");

    for path in ["/oauth/token", "/oauth/revoke"] {
        for (what, content_type, body, description) in [
            (
                "JSON",
                as_json,
                r#"{"grant_type": "refresh_token"}"#.to_owned(),
                "the body must be application/x-www-form-urlencoded",
            ),
            (
                "no content type",
                None,
                "grant_type=refresh_token".to_owned(),
                "the body must be application/x-www-form-urlencoded",
            ),
            (
                // RFC 6749 section 3.2: parameters are sent at most once.
                "a parameter twice",
                form,
                "client_id=a&client_id=b&token=t&grant_type=refresh_token".to_owned(),
                "the form could not be read",
            ),
            (
                "too large",
                form,
                format!("client_id={}", "x".repeat(20_000)),
                "the body is larger than 16384 bytes",
            ),
        ] {
            let answer = post_raw(&server, path, content_type, body).await;
            assert_oauth_error(
                &answer,
                "invalid_request",
                description,
                &format!("{path}: {what}"),
            );
        }
    }

    // A readable form still gets the endpoint's own answer.
    let answer = post_raw(&server, "/oauth/token", form, "grant_type=refresh_token").await;
    assert_oauth_error(&answer, "invalid_request", "client_id is required", "token");
    let answer = post_raw(&server, "/oauth/revoke", form, "token=t").await;
    assert_oauth_error(
        &answer,
        "invalid_request",
        "token and client_id are required",
        "revoke",
    );
}

// ---- a session's tool calls, answered without its worker ----------------------------------------

/// One POST of `body` to the MCP endpoint with exactly these headers (and
/// the token): status, `Content-Type` and the answer.
async fn post_mcp_with(
    server: &Server,
    token: &str,
    headers: &[(&str, &str)],
    body: String,
) -> (u16, String, Value) {
    let mut req = reqwest::Client::new()
        .post(mcp_url(server))
        .bearer_auth(token)
        .body(body);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let kind = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, kind, read_message(res).await)
}

#[tokio::test]
async fn a_sessions_tool_calls_answer_as_json_with_the_sessions_checks() {
    let w = world().await;
    let token = w.fx.token(w.reporter, &["mcp"]).await;
    let server = Server::start(&w.fx).await;
    let mut mcp = Mcp::connect(&server, &token).await;

    // tools/call, tools/list and ping: one JSON object, answering the request.
    for (method, params) in [
        (
            "tools/call",
            json!({"name": "get_mcp_server_version", "arguments": {}}),
        ),
        ("tools/list", json!({})),
        ("ping", json!({})),
    ] {
        let http = mcp.send(method, params).await;
        assert_eq!(http.status, 200, "{method}: {}", http.body);
        let kind = http.headers["content-type"].to_str().unwrap();
        assert!(kind.starts_with("application/json"), "{method}: {kind}");
        assert_eq!(http.body["id"], mcp.next_id - 1, "{method}: {}", http.body);
        assert!(http.body.get("result").is_some(), "{method}: {}", http.body);
    }
    // The rest of the session goes through its worker, as an event stream.
    let http = mcp.send("resources/list", json!({})).await;
    let kind = http.headers["content-type"].to_str().unwrap();
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    assert_eq!(http.body["error"]["code"], -32601, "{}", http.body);

    // rmcp's checks hold on the direct path: the protocol version header,
    // what the client accepts, the session's existence.
    let call = json!({
        "jsonrpc": "2.0", "id": 50, "method": "tools/call",
        "params": {"name": "get_mcp_server_version", "arguments": {}},
    })
    .to_string();
    let both = "application/json, text/event-stream";
    let json_type = ("content-type", "application/json");
    let session = ("mcp-session-id", mcp.session.as_str());
    let (status, _, _) = post_mcp_with(
        &server,
        &token,
        &[
            ("accept", both),
            json_type,
            session,
            ("mcp-protocol-version", "1999-01-01"),
        ],
        call.clone(),
    )
    .await;
    assert_eq!(status, 400, "an unknown protocol version");
    let (status, _, _) = post_mcp_with(
        &server,
        &token,
        &[
            ("accept", "application/json"),
            json_type,
            session,
            ("mcp-protocol-version", PROTOCOL),
        ],
        call.clone(),
    )
    .await;
    assert_eq!(status, 406, "a client that does not take event streams");
    let (status, _, _) = post_mcp_with(
        &server,
        &token,
        &[
            ("accept", both),
            json_type,
            ("mcp-session-id", "no-such-session"),
            ("mcp-protocol-version", PROTOCOL),
        ],
        call.clone(),
    )
    .await;
    assert_eq!(status, 404, "a session that does not exist");

    // A session its client ended answers nothing more.
    let ended = reqwest::Client::new()
        .delete(mcp_url(&server))
        .bearer_auth(&token)
        .header("mcp-session-id", &mcp.session)
        .header("mcp-protocol-version", PROTOCOL)
        .send()
        .await
        .unwrap();
    assert!(ended.status().is_success(), "{}", ended.status());
    let (status, _, _) = post_mcp_with(
        &server,
        &token,
        &[
            ("accept", both),
            json_type,
            session,
            ("mcp-protocol-version", PROTOCOL),
        ],
        call,
    )
    .await;
    assert_eq!(status, 404, "a deleted session");
}
