//! `POST /v1/search/gitlab-docs`: search the product documentation.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchDocsRequest {
    #[serde(rename = "type", default = "search_docs")]
    pub request_type: String,
    #[serde(default)]
    pub metadata: SearchMetadata,
    pub payload: SearchPayload,
}

fn search_docs() -> String {
    "search-docs".to_owned()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchMetadata {
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchPayload {
    pub query: String,
    /// 1..=20, default 4.
    #[serde(default = "default_page_size")]
    pub page_size: u32,
}

pub const fn default_page_size() -> u32 {
    4
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchDocsResponse {
    pub response: SearchResults,
    pub metadata: SearchResponseMetadata,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchResults {
    pub results: Vec<SearchResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchResult {
    pub id: String,
    pub content: String,
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchResponseMetadata {
    pub provider: String,
    pub timestamp: i64,
}
