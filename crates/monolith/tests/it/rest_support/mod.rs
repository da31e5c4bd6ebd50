//! What the REST test binaries share: one call to `/api/v4` with a bearer token,
//! and the usual fixture of named users holding `api` tokens. Include it next to
//! `support` (`mod support; mod rest_support;`).
// Test support panics on failures by design; not every test binary uses every helper.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use monolith::policy::Actor;
use reqwest::Method;
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::support::{Fx, Server};

/// What one REST call answered; `body` is `Null` when it is empty or not JSON.
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

/// One call to `/api/v4{path}`, with `token` as bearer and `body` as JSON when given.
pub async fn send(
    server: &Server,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Reply {
    let mut req = reqwest::Client::new().request(method, server.url(&format!("/api/v4{path}")));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let text = res.text().await.unwrap();
    Reply {
        status,
        headers,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
    }
}

async fn status_and_body(
    server: &Server,
    method: Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let reply = send(server, method, path, Some(token), body).await;
    (reply.status, reply.body)
}

/// Status and body of `GET /api/v4{path}`.
pub async fn get(server: &Server, path: &str, token: &str) -> (u16, Value) {
    status_and_body(server, Method::GET, path, token, None).await
}

/// Status, headers (pagination) and body of `GET /api/v4{path}`.
pub async fn get_with_headers(server: &Server, path: &str, token: &str) -> (u16, HeaderMap, Value) {
    let reply = send(server, Method::GET, path, Some(token), None).await;
    (reply.status, reply.headers, reply.body)
}

/// Status and body of `POST /api/v4{path}` with a JSON body.
pub async fn post(server: &Server, path: &str, token: &str, body: Value) -> (u16, Value) {
    status_and_body(server, Method::POST, path, token, Some(body)).await
}

/// Status and body of `POST /api/v4{path}` without a body.
pub async fn post_empty(server: &Server, path: &str, token: &str) -> (u16, Value) {
    status_and_body(server, Method::POST, path, token, None).await
}

/// Status and body of `PUT /api/v4{path}` with a JSON body.
pub async fn put(server: &Server, path: &str, token: &str, body: Value) -> (u16, Value) {
    status_and_body(server, Method::PUT, path, token, Some(body)).await
}

/// Status and body of `DELETE /api/v4{path}`.
pub async fn delete(server: &Server, path: &str, token: &str) -> (u16, Value) {
    status_and_body(server, Method::DELETE, path, token, None).await
}

/// Users with these names, created in this order.
pub async fn users<const N: usize>(fx: &Fx, names: [&str; N]) -> [Actor; N] {
    let mut users = Vec::with_capacity(N);
    for name in names {
        users.push(fx.user(name).await);
    }
    users.try_into().unwrap()
}

/// An `api` token for each user, created in this order.
pub async fn api_tokens<const N: usize>(fx: &Fx, users: [Actor; N]) -> [String; N] {
    let mut tokens = Vec::with_capacity(N);
    for user in users {
        tokens.push(fx.token(user, &["api"]).await);
    }
    tokens.try_into().unwrap()
}

/// The `field` of every item of a JSON list, as text (`usernames`, `names`, ...).
pub fn strings<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|item| item[field].as_str().unwrap())
        .collect()
}

/// The `field` of every item of a JSON list, as integers (`id`, `iid`, ...).
pub fn integers(list: &Value, field: &str) -> Vec<i64> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|item| item[field].as_i64().unwrap())
        .collect()
}
