//! What each proxy lets through: unit primitives, paths, models and headers.

use contracts::UnitPrimitive;
use regex::Regex;
use std::sync::LazyLock;

use super::ProxyKind;

/// The unit primitives each proxy may be used for (Cloud Connector's proxy map).
pub fn allowed_purposes(kind: ProxyKind) -> &'static [UnitPrimitive] {
    use UnitPrimitive::*;
    const SHARED: &[UnitPrimitive] = &[
        CompleteCode,
        GenerateCode,
        DuoChat,
        ExplainCode,
        FixCode,
        RefactorCode,
        WriteTests,
        ExplainVulnerability,
        ResolveVulnerability,
        TroubleshootJob,
        SummarizeComments,
        SummarizeReview,
        SummarizeNewMergeRequest,
        GenerateDescription,
        GenerateCommitMessage,
        GlabAskGitCommand,
    ];
    const VERTEX: &[UnitPrimitive] = &[
        CompleteCode,
        GenerateCode,
        DuoChat,
        ExplainCode,
        FixCode,
        RefactorCode,
        WriteTests,
        ExplainVulnerability,
        ResolveVulnerability,
        TroubleshootJob,
        SummarizeComments,
        SummarizeReview,
        SummarizeNewMergeRequest,
        GenerateDescription,
        GenerateCommitMessage,
        GlabAskGitCommand,
        GenerateEmbeddingsCodebase,
        CodebaseSearch,
    ];
    match kind {
        ProxyKind::Anthropic => SHARED,
        ProxyKind::VertexAi => VERTEX,
    }
}

/// Anthropic paths the proxy forwards.
pub const ANTHROPIC_PATHS: &[&str] = &["/v1/complete", "/v1/messages"];

/// Claude model ids the Anthropic proxy accepts.
pub const ANTHROPIC_MODELS: &[&str] = &[
    "claude-instant-1.2",
    "claude-2.0",
    "claude-2.1",
    "claude-3-haiku-20240307",
    "claude-3-sonnet-20240229",
    "claude-3-opus-20240229",
    "claude-3-5-sonnet-20240620",
    "claude-3-5-sonnet-20241022",
    "claude-3-5-haiku-20241022",
    "claude-3-7-sonnet-20250219",
    "claude-sonnet-4-20250514",
    "claude-opus-4-20250514",
];

/// A Vertex AI publisher-model call. Project and location are ignored: the
/// gateway substitutes its own.
static VERTEX_PATH: LazyLock<Result<Regex, regex::Error>> = LazyLock::new(|| {
    Regex::new(
        r"^/v1/projects/[A-Za-z0-9_.-]+/locations/[A-Za-z0-9_-]+/publishers/google/models/([A-Za-z0-9_.@-]+):(predict|serverStreamingPredict)$",
    )
});

/// The model and action of an allowed Vertex path, if it is one.
pub fn parse_vertex_path(path: &str) -> Option<(String, VertexAction)> {
    let re = VERTEX_PATH.as_ref().ok()?;
    let caps = re.captures(path)?;
    let action = match caps.get(2)?.as_str() {
        "predict" => VertexAction::Predict,
        _ => VertexAction::ServerStreamingPredict,
    };
    Some((caps.get(1)?.as_str().to_owned(), action))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VertexAction {
    Predict,
    ServerStreamingPredict,
}

impl VertexAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Predict => "predict",
            Self::ServerStreamingPredict => "serverStreamingPredict",
        }
    }
}

/// Vertex models the proxy accepts; `local_embedding_model` is the bundled
/// local model server's embedding model.
pub fn vertex_model_allowed(model: &str, local_embedding_model: &str) -> bool {
    const FAMILIES: &[&str] = &[
        "code-bison",
        "code-gecko",
        "text-bison",
        "chat-bison",
        "codechat-bison",
        "textembedding-gecko",
    ];
    const EXACT: &[&str] = &["codestral@2405", "text-embedding-005"];
    let family = model.split('@').next().unwrap_or(model);
    model == local_embedding_model
        || EXACT.contains(&model)
        || FAMILIES.iter().any(|f| {
            family == *f
                || family
                    .strip_prefix(f)
                    .is_some_and(|rest| rest.starts_with('-'))
        })
}

/// Request headers copied upstream (lowercase).
pub fn request_headers(kind: ProxyKind) -> &'static [&'static str] {
    match kind {
        ProxyKind::Anthropic => &["accept", "content-type", "anthropic-version"],
        ProxyKind::VertexAi => &["content-type"],
    }
}

/// Response headers copied back to the caller (lowercase).
pub const RESPONSE_HEADERS: &[&str] = &["content-type"];

/// Whether a raw request path tries to escape its prefix, plainly or encoded.
pub fn is_traversal(raw_path: &str) -> bool {
    let lower = raw_path.to_ascii_lowercase();
    lower.contains("..")
        || lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || lower.contains('\\')
        || lower.contains("//")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vertex_paths() {
        assert_eq!(
            parse_vertex_path(
                "/v1/projects/p/locations/us-central1/publishers/google/models/text-embedding-005:predict"
            ),
            Some(("text-embedding-005".into(), VertexAction::Predict))
        );
        assert_eq!(
            parse_vertex_path(
                "/v1/projects/p/locations/l/publishers/google/models/code-gecko@002:serverStreamingPredict"
            ),
            Some((
                "code-gecko@002".into(),
                VertexAction::ServerStreamingPredict
            ))
        );
        for bad in [
            "/v1/projects/p/locations/l/publishers/google/models/m:generate",
            "/v1/projects/p/locations/l/publishers/other/models/m:predict",
            "/v1/projects/p/locations/l/publishers/google/models/a/b:predict",
            "/v2/projects/p/locations/l/publishers/google/models/m:predict",
        ] {
            assert_eq!(parse_vertex_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn vertex_models() {
        for ok in [
            "code-gecko@002",
            "textembedding-gecko@003",
            "textembedding-gecko-multilingual@001",
            "text-embedding-005",
            "codestral@2405",
            "all-minilm-l6-v2",
        ] {
            assert!(vertex_model_allowed(ok, "all-minilm-l6-v2"), "{ok}");
        }
        for bad in ["gemini-pro", "code-geckos", "codestral@2501", ""] {
            assert!(!vertex_model_allowed(bad, "all-minilm-l6-v2"), "{bad}");
        }
    }

    #[test]
    fn traversal() {
        assert!(is_traversal("/v1/proxy/anthropic/v1/../x"));
        assert!(is_traversal("/v1/proxy/anthropic/v1/%2E%2E/x"));
        assert!(is_traversal("/v1/proxy/anthropic/v1%2fmessages"));
        assert!(!is_traversal("/v1/proxy/anthropic/v1/messages"));
    }
}
