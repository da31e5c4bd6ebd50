//! llama.cpp's CPU code per instruction level: the server loads the best
//! build this machine runs, a forced one only if the CPU and kernel enable
//! what it needs, and says why when it cannot start.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use local_llm::cpu_variant::{self, Settings};
use serde_json::{Value, json};

use crate::common;

fn server_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_duo-local-llm"));
    command
        .env("DUO_MODELS_DIR", common::models_dir())
        .env("DUO_LOCAL_LLM_THREADS", "1")
        .env_remove("DUO_LOCAL_LLM_CPU_VARIANT")
        .env_remove("DUO_LOCAL_LLM_BACKENDS_DIR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Runs the server expecting it to refuse to start; returns its stderr.
fn refused(command: &mut Command) -> String {
    let output = command.output().expect("run duo-local-llm");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    stderr
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn serve(mut command: Command) -> (Server, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = command
        .env("DUO_LOCAL_LLM_ADDR", format!("127.0.0.1:{port}"))
        .stderr(Stdio::null())
        .spawn()
        .expect("start duo-local-llm");
    let mut server = Server(child);
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(resp) = reqwest::get(format!("{base}/health")).await
            && resp.status().is_success()
        {
            return (server, base);
        }
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!("duo-local-llm exited: {status}");
        }
        assert!(Instant::now() < deadline, "duo-local-llm did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn the_server_loads_the_best_variant_this_machine_runs() {
    let settings = Settings::default();
    let dir = cpu_variant::modules_dir(&settings).expect("the build's CPU variants");
    let installed = cpu_variant::installed(&dir).unwrap();
    // The build ships every x86-64 level, from the baseline to AVX-512.
    for name in ["x64", "haswell", "skylakex", "zen4"] {
        assert!(installed.iter().any(|n| n == name), "{name}: {installed:?}");
    }
    let expected = cpu_variant::pick(&dir, &settings).unwrap();
    assert!(
        expected
            .requires
            .iter()
            .all(|f| cpu_variant::available_here(*f))
    );

    let base = common::start_server(common::test_config()).await;
    let health = common::get_json(&format!("{base}/health")).await;
    assert_eq!(health["cpu_variant"], expected.name, "{health}");
    assert_eq!(
        local_llm::engine::cpu_variant().unwrap().path,
        dir.join(format!("libggml-cpu-{}.so", expected.name))
    );
}

#[actix_web::test]
async fn a_forced_variant_runs_and_answers() {
    let mut command = server_command();
    command.env("DUO_LOCAL_LLM_CPU_VARIANT", "haswell");
    let (_server, base) = serve(command).await;
    let health = common::get_json(&format!("{base}/health")).await;
    assert_eq!(health["cpu_variant"], "haswell", "{health}");
    let reply: Value = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({
            "model": "smollm2-135m-instruct",
            "messages": [{ "role": "user", "content": "Name one colour." }],
            "temperature": 0,
            "max_tokens": 8,
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("");
    assert!(!text.trim().is_empty(), "{reply}");
}

#[test]
fn a_variant_the_cpu_or_kernel_does_not_enable_is_refused_at_start() {
    // AMX is never enabled for llama.cpp here, whatever the CPU reports.
    let stderr = refused(server_command().env("DUO_LOCAL_LLM_CPU_VARIANT", "sapphirerapids"));
    assert!(
        stderr.contains("sapphirerapids: this CPU or its kernel does not enable")
            && stderr.contains("amx"),
        "{stderr}"
    );
    let stderr = refused(server_command().env("DUO_LOCAL_LLM_CPU_VARIANT", "pentium"));
    assert!(stderr.contains("\"pentium\" is not a variant"), "{stderr}");
}

#[test]
fn a_directory_without_cpu_code_is_refused_at_start() {
    let dir = std::env::temp_dir().join(format!("no-ggml-variants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stderr = refused(server_command().env("DUO_LOCAL_LLM_BACKENDS_DIR", &dir));
    assert!(
        stderr.contains("no llama.cpp CPU modules (libggml-cpu-*.so) in")
            && stderr.contains("DUO_LOCAL_LLM_BACKENDS_DIR"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_modules_directory_is_named_at_start() {
    let dir = std::env::temp_dir().join(format!("no-such-ggml-dir-{}", std::process::id()));
    let stderr = refused(server_command().env("DUO_LOCAL_LLM_BACKENDS_DIR", &dir));
    assert!(
        stderr.contains(&format!(
            "reading llama.cpp's CPU modules in {}",
            dir.display()
        )) && stderr.contains("DUO_LOCAL_LLM_BACKENDS_DIR"),
        "{stderr}"
    );
}
