//! Shared by the tests that drive the real app against the fake provider:
//! gateways wired to it, a line-by-line NDJSON reader and a /metrics reader.
#![allow(dead_code)]
#![expect(
    clippy::unwrap_used,
    reason = "test support: failing loudly is the point"
)]

use crate::app_support::{TEST_SCOPES, spawn_gateway};
use fake_provider::FakeProvider;
use gateway::Config;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

/// The wire protocol the gateway speaks to the fake provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Anthropic,
    OpenAi,
}

pub const WIRES: [Wire; 2] = [Wire::Anthropic, Wire::OpenAi];

impl Wire {
    /// The provider settings for this wire, with custom models on so that a
    /// request can name a failure mode as its model.
    pub fn env(self, fake: &FakeProvider) -> Vec<(String, String)> {
        let mut env = vec![("AIGW_CUSTOM_MODELS__ENABLED".into(), "true".into())];
        match self {
            Wire::Anthropic => {
                env.push(("ANTHROPIC_API_KEY".into(), "test-key".into()));
                env.push(("ANTHROPIC_BASE_URL".into(), fake.url()));
            }
            Wire::OpenAi => env.push(("OPENAI_BASE_URL".into(), fake.openai_base_url())),
        }
        env
    }

    /// A gateway on this wire, plus `extra` settings.
    pub fn gateway(self, fake: &FakeProvider, extra: &[(&str, &str)]) -> String {
        let mut env = self.env(fake);
        env.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        spawn_gateway(Config::for_tests(&pairs).unwrap())
    }

    /// `model_metadata` sending the call to `model` on the fake over this
    /// wire, with this wire's prompt family.
    /// A self-hosted model at the fake provider, with its own key (a named
    /// endpoint never gets the gateway's).
    pub fn metadata(self, fake: &FakeProvider, model: &str) -> Value {
        let (family, provider, endpoint) = match self {
            Wire::Anthropic => ("base", "anthropic", fake.url()),
            Wire::OpenAi => ("openai", "openai", fake.openai_base_url()),
        };
        json!({
            "name": family,
            "provider": provider,
            "endpoint": endpoint,
            "identifier": model,
            "api_key": "sk-self-hosted",
        })
    }
}

pub fn client() -> reqwest::Client {
    // A bound on every test, so a stream that never ends fails instead of hanging.
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

pub fn question(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

/// Starts `POST /v2/chat/agent`; the answer is read line by line.
pub async fn agent(gw: &str, scopes: &str, body: &Value) -> Ndjson {
    let response = client()
        .post(format!("{gw}/v2/chat/agent"))
        .header(TEST_SCOPES, scopes)
        .header(
            crate::app_support::TEST_MODEL_ENDPOINTS,
            crate::app_support::vouched_by(body),
        )
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/x-ndjson; charset=utf-8"
    );
    Ndjson {
        response,
        buffer: Vec::new(),
    }
}

/// Reads an NDJSON body one line at a time, as the bytes arrive.
pub struct Ndjson {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Ndjson {
    /// The next line without its newline; `None` at the end of the body.
    /// Bytes left after the last newline fail the test: every event ends
    /// its line.
    pub async fn next_line(&mut self) -> Option<String> {
        loop {
            if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=at).collect();
                return Some(String::from_utf8(line[..at].to_vec()).unwrap());
            }
            match self.response.chunk().await.unwrap() {
                Some(bytes) => self.buffer.extend_from_slice(&bytes),
                None => {
                    assert!(
                        self.buffer.is_empty(),
                        "unterminated line {:?}",
                        self.buffer
                    );
                    return None;
                }
            }
        }
    }

    /// Every remaining line.
    pub async fn rest(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        while let Some(line) = self.next_line().await {
            lines.push(line);
        }
        lines
    }
}

/// One NDJSON line as the gateway writes it.
pub fn line(kind: &str, data: Value) -> String {
    contracts::AgentEvent::to_ndjson_line(
        &serde_json::from_value(json!({"type": kind, "data": data})).unwrap(),
    )
    .trim_end()
    .to_owned()
}

/// One sample of the Prometheus text: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

pub async fn scrape(gw: &str) -> Vec<Sample> {
    let text = client()
        .get(format!("{gw}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(parse_sample)
        .collect()
}

fn parse_sample(line: &str) -> Sample {
    let (head, value) = line.rsplit_once(' ').unwrap();
    let (name, labels) = match head.split_once('{') {
        Some((name, rest)) => (name, rest.trim_end_matches('}')),
        None => (head, ""),
    };
    let labels = labels
        .split("\",")
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once("=\"").unwrap();
            (k.to_owned(), v.trim_end_matches('"').to_owned())
        })
        .collect();
    Sample {
        name: name.to_owned(),
        labels,
        value: value.parse().unwrap(),
    }
}

/// The sum of the samples named `name` that carry every label in `labels`.
pub fn metric(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}
