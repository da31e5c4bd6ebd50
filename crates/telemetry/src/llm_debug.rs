//! The LLM debug log: every model request and response, whole, in a file of
//! its own (GitLab's `LLM_DEBUG`). Off unless `LLM_DEBUG` is set; everything
//! written passes through [`crate::redact`] first, so credentials never land
//! there even though whole request bodies do.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Where the log goes when `LLM_DEBUG_LOG` does not say.
pub const DEFAULT_PATH: &str = "log/llm_debug.log";

/// An open LLM debug log.
#[derive(Debug)]
pub struct LlmDebugLog {
    service: &'static str,
    file: Mutex<File>,
    path: PathBuf,
}

static LOG: OnceLock<Option<LlmDebugLog>> = OnceLock::new();

/// Whether an environment value turns a switch on (`1`, `true`, `yes`, `on`).
pub fn switch_on(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

impl LlmDebugLog {
    fn open(service: &'static str, path: &Path) -> std::io::Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            service,
            file: Mutex::new(file),
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one record: `kind` (`request`, `response`, `error`), the
    /// request id when known, the current trace id, and `fields` (the model,
    /// the body…), as one redacted JSON line.
    pub fn record(&self, kind: &str, request_id: Option<&str>, fields: serde_json::Value) {
        let mut line = serde_json::json!({
            "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "service": self.service,
            "kind": kind,
            "request_id": request_id,
            "trace_id": crate::propagation::current_trace_id(),
        });
        if let (Some(line), serde_json::Value::Object(fields)) = (line.as_object_mut(), fields) {
            line.extend(fields);
        }
        let mut text = crate::redact(&line.to_string()).into_owned();
        text.push('\n');
        if let Ok(mut file) = self.file.lock() {
            // A debugging aid must not take the request down with it.
            let _ = file.write_all(text.as_bytes());
        }
    }
}

/// Opens the log if `LLM_DEBUG` is on (called once by [`crate::init`]).
pub(crate) fn init(service: &'static str) {
    LOG.get_or_init(|| {
        if !switch_on(std::env::var("LLM_DEBUG").ok().as_deref()) {
            return None;
        }
        let path = std::env::var("LLM_DEBUG_LOG")
            .ok()
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_PATH.to_owned());
        match LlmDebugLog::open(service, Path::new(&path)) {
            Ok(log) => {
                tracing::warn!(
                    path = %path,
                    "LLM_DEBUG is on: every model request and response is written to this file"
                );
                Some(log)
            }
            Err(e) => {
                tracing::warn!(path = %path, error = %e, "LLM_DEBUG is on but its log cannot be opened");
                None
            }
        }
    });
}

/// The LLM debug log, when it is on.
pub fn llm_debug_log() -> Option<&'static LlmDebugLog> {
    LOG.get().and_then(Option::as_ref)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_redacted_json_lines() -> std::io::Result<()> {
        let dir = std::env::temp_dir().join(format!("llm-debug-{}", std::process::id()));
        let path = dir.join("nested/llm.log");
        let log = LlmDebugLog::open("test", &path)?;
        log.record(
            "request",
            Some("req-1"),
            serde_json::json!({"headers": {"x-api-key": "sk-ant-secretsecret"}, "body": "hi"}),
        );
        let text = std::fs::read_to_string(&path)?;
        std::fs::remove_dir_all(&dir)?;
        assert!(!text.contains("secretsecret"), "{text}");
        let line: serde_json::Value =
            serde_json::from_str(text.trim()).map_err(std::io::Error::other)?;
        assert_eq!(line["kind"], "request");
        assert_eq!(line["request_id"], "req-1");
        assert_eq!(line["body"], "hi");
        Ok(())
    }

    #[test]
    fn switch_values() {
        assert!(switch_on(Some("1")));
        assert!(switch_on(Some(" TRUE ")));
        assert!(!switch_on(Some("0")));
        assert!(!switch_on(None));
    }
}
