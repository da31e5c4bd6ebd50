//! A temporary workspace and a runner over it.
#![expect(clippy::unwrap_used, reason = "test support fails loudly")]

use contracts::duo_workflow::{ActionResponse, action, action_response};
use std::path::PathBuf;
use workflow_executor::{ActionRunner, Limits, Workspace};

pub struct Dir {
    pub path: PathBuf,
}

impl Dir {
    pub fn new() -> Self {
        let path = std::env::temp_dir().join(format!(
            "executor-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self { path }
    }

    pub fn write(&self, name: &str, content: &str) {
        let file = self.path.join(name);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, content).unwrap();
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

pub fn runner(dir: &Dir, limits: Limits) -> ActionRunner {
    ActionRunner {
        workspace: Workspace::new(&dir.path).unwrap(),
        limits,
        gitlab: None,
        mcp: None,
    }
}

/// (response, error) of a plain-text reply.
pub async fn run(runner: &ActionRunner, action: action::Action) -> (String, String) {
    let reply: ActionResponse = runner.perform("id-1", &action).await.unwrap();
    assert_eq!(reply.request_id, "id-1");
    match reply.response_type.unwrap() {
        action_response::ResponseType::PlainTextResponse(text) => (text.response, text.error),
        action_response::ResponseType::HttpResponse(http) => (http.body, http.error),
        other => (format!("{other:?}"), String::new()),
    }
}
