//! The Kubernetes runner against a test API server (actix, on loopback) that
//! keeps the objects it is sent, finishes a Job when the test says so, and
//! collects garbage as the real one does (a Job's Secret goes with it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
use monolith::workflows::runners::kubernetes::{KubernetesRunner, KubernetesRunnerConfig};
use monolith::workflows::runners::{Answer, LegEnd, LegSpec, RunLimits, Runner};
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Cluster {
    jobs: BTreeMap<String, Value>,
    secrets: BTreeMap<String, Value>,
    /// The executor's exit code once the Job is to end.
    exit: Option<i32>,
    deleted_jobs: Vec<String>,
    created: Vec<String>,
}

type Shared = Arc<Mutex<Cluster>>;

fn not_found(name: &str) -> HttpResponse {
    HttpResponse::NotFound().json(json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": format!("{name} not found"), "reason": "NotFound", "code": 404,
    }))
}

async fn create_job(state: web::Data<Shared>, body: web::Json<Value>) -> HttpResponse {
    let mut job = body.into_inner();
    let name = job["metadata"]["name"].as_str().unwrap().to_owned();
    job["metadata"]["uid"] = json!(format!("uid-{name}"));
    let mut cluster = state.lock().unwrap();
    cluster.created.push(format!("Job/{name}"));
    cluster.jobs.insert(name, job.clone());
    HttpResponse::Created().json(job)
}

async fn get_job(state: web::Data<Shared>, path: web::Path<(String, String)>) -> HttpResponse {
    let cluster = state.lock().unwrap();
    let Some(job) = cluster.jobs.get(&path.1) else {
        return not_found(&path.1);
    };
    let mut job = job.clone();
    if let Some(code) = cluster.exit {
        job["status"] = if code == 0 {
            json!({"succeeded": 1})
        } else {
            json!({"failed": 1})
        };
    }
    HttpResponse::Ok().json(job)
}

async fn delete_job(state: web::Data<Shared>, path: web::Path<(String, String)>) -> HttpResponse {
    let mut cluster = state.lock().unwrap();
    let Some(job) = cluster.jobs.remove(&path.1) else {
        return not_found(&path.1);
    };
    let uid = job["metadata"]["uid"].clone();
    // The garbage collector: whatever the Job owned goes too.
    cluster
        .secrets
        .retain(|_, s| s["metadata"]["ownerReferences"][0]["uid"] != uid);
    cluster.deleted_jobs.push(path.1.clone());
    HttpResponse::Ok()
        .json(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}))
}

async fn create_secret(state: web::Data<Shared>, body: web::Json<Value>) -> HttpResponse {
    let secret = body.into_inner();
    let name = secret["metadata"]["name"].as_str().unwrap().to_owned();
    let mut cluster = state.lock().unwrap();
    cluster.created.push(format!("Secret/{name}"));
    cluster.secrets.insert(name, secret.clone());
    HttpResponse::Created().json(secret)
}

async fn get_secret(state: web::Data<Shared>, path: web::Path<(String, String)>) -> HttpResponse {
    match state.lock().unwrap().secrets.get(&path.1) {
        Some(secret) => HttpResponse::Ok().json(secret),
        None => not_found(&path.1),
    }
}

async fn list_pods(state: web::Data<Shared>) -> HttpResponse {
    let cluster = state.lock().unwrap();
    let items: Vec<Value> = cluster
        .jobs
        .keys()
        .map(|name| {
            let state = match cluster.exit {
                Some(code) => json!({"terminated": {"exitCode": code}}),
                None => json!({"running": {}}),
            };
            json!({
                "metadata": {"name": format!("{name}-pod")},
                "status": {"containerStatuses": [{
                    "name": "executor", "image": "x", "imageID": "", "ready": false,
                    "restartCount": 0, "state": state,
                }]},
            })
        })
        .collect();
    HttpResponse::Ok()
        .json(json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}))
}

async fn pod_log(state: web::Data<Shared>) -> HttpResponse {
    let text = match state.lock().unwrap().exit {
        Some(0) => "cloned acme/api at main\n",
        Some(3) => "duo-workflow-executor: the workflow is paused (TOOL_CALL_APPROVAL_REQUIRED)\n",
        _ => "cloned\nduo-workflow-executor: the model is unreachable\n",
    };
    HttpResponse::Ok().content_type("text/plain").body(text)
}

fn api_server(state: Shared) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let data = web::Data::new(state);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route(
                "/apis/batch/v1/namespaces/{ns}/jobs",
                web::post().to(create_job),
            )
            .route(
                "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
                web::get().to(get_job),
            )
            .route(
                "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
                web::delete().to(delete_job),
            )
            .route(
                "/api/v1/namespaces/{ns}/secrets",
                web::post().to(create_secret),
            )
            .route(
                "/api/v1/namespaces/{ns}/secrets/{name}",
                web::get().to(get_secret),
            )
            .route("/api/v1/namespaces/{ns}/pods", web::get().to(list_pods))
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}/log",
                web::get().to(pod_log),
            )
    })
    .workers(1)
    .listen(listener)
    .unwrap()
    .run();
    actix_web::rt::spawn(server);
    format!("http://{address}")
}

fn spec(answer: Option<Answer>) -> LegSpec {
    LegSpec {
        workflow_id: 7,
        workload_id: 11,
        project_path: "acme/api".into(),
        source_ref: "main".into(),
        checkpoint_ref: "refs/workloads/7".into(),
        definition: "software_development".into(),
        goal: "Fix it".into(),
        gitlab_token: SecretString::from("run-token-secret"),
        service_token: SecretString::from("service-token-secret"),
        service_headers: SecretString::from(r#"{"x-gitlab-realm":"self-managed"}"#),
        answer,
        git_author: ("GitLab Duo".into(), "duo@example.com".into()),
        limits: RunLimits {
            max_duration: Duration::from_secs(30),
            ..RunLimits::default()
        },
    }
}

async fn runner(api: &str) -> KubernetesRunner {
    KubernetesRunner::connect(KubernetesRunnerConfig {
        api_url: Some(api.parse().unwrap()),
        namespace: Some("duo".into()),
        image: "registry.example.com/duo-chat:0.1.0".into(),
        gitlab_url: "http://duo-web:3000".into(),
        service_url: "http://duo-gateway:50052".into(),
        cpu: "1".into(),
    })
    .await
    .unwrap()
}

/// Lets the Job end with `code` once both objects exist.
fn finish_when_created(state: &Shared, code: i32) {
    let state = state.clone();
    tokio::spawn(async move {
        loop {
            {
                let mut cluster = state.lock().unwrap();
                if cluster.created.len() == 2 {
                    cluster.exit = Some(code);
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

#[actix_web::test]
async fn a_leg_is_a_job_with_its_tokens_in_a_secret_it_owns_and_nothing_is_left() {
    let state: Shared = Arc::default();
    let api = api_server(state.clone());
    let runner = runner(&api).await;
    finish_when_created(&state, 0);
    let outcome = runner
        .run_leg(&spec(Some(Answer::Approve)), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.end, LegEnd::Finished);
    assert!(outcome.log_tail.contains("cloned"), "{}", outcome.log_tail);
    let cluster = state.lock().unwrap();
    // Job first (the Secret names it as owner), then the Secret.
    assert_eq!(
        cluster.created,
        ["Job/duo-workflow-7-11", "Secret/duo-workflow-7-11"]
    );
    assert_eq!(cluster.deleted_jobs, ["duo-workflow-7-11"]);
    assert!(cluster.jobs.is_empty() && cluster.secrets.is_empty());
    drop(cluster);
}

#[actix_web::test]
async fn the_job_carries_no_token_and_the_secret_carries_them_all() {
    let state: Shared = Arc::default();
    let api = api_server(state.clone());
    let runner = runner(&api).await;
    // Keep the objects: cancel only after both exist, and read them first.
    let cancel = CancellationToken::new();
    let watcher = {
        let state = state.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            loop {
                {
                    let cluster = state.lock().unwrap();
                    if cluster.created.len() == 2 {
                        let job = cluster.jobs.values().next().unwrap().clone();
                        let secret = cluster.secrets.values().next().unwrap().clone();
                        cancel.cancel();
                        return (job, secret);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let outcome = runner.run_leg(&spec(None), cancel).await.unwrap();
    assert_eq!(outcome.end, LegEnd::Cancelled);
    let (job, secret) = watcher.await.unwrap();
    let text = job.to_string();
    for secret_text in ["run-token-secret", "service-token-secret", "self-managed"] {
        assert!(
            !text.contains(secret_text),
            "{secret_text} in the Job: {text}"
        );
    }
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let container = &pod["containers"][0];
    assert_eq!(
        container["envFrom"][0]["secretRef"]["name"],
        "duo-workflow-7-11"
    );
    assert_eq!(container["resources"]["limits"]["memory"], "2048Mi");
    assert_eq!(
        container["resources"]["limits"]["ephemeral-storage"],
        "1024Mi"
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for wanted in [
        "--gitlab-url",
        "http://duo-web:3000",
        "--service-url",
        "http://duo-gateway:50052",
        "--clone-project",
        "acme/api",
        "--checkpoint-ref",
        "refs/workloads/7",
    ] {
        assert!(args.contains(&wanted), "{wanted} not in {args:?}");
    }
    assert_eq!(job["spec"]["activeDeadlineSeconds"], 30);
    assert_eq!(job["spec"]["backoffLimit"], 0);
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["uid"],
        "uid-duo-workflow-7-11"
    );
    assert_eq!(secret["stringData"]["DUO_GITLAB_TOKEN"], "run-token-secret");
    assert_eq!(
        secret["stringData"]["DUO_SERVICE_TOKEN"],
        "service-token-secret"
    );
    // Cancelled: the Job was deleted, and its Secret with it.
    let cluster = state.lock().unwrap();
    assert!(cluster.jobs.is_empty() && cluster.secrets.is_empty());
}

#[actix_web::test]
async fn exit_codes_become_paused_and_failed_legs() {
    for (code, expected) in [
        (3, LegEnd::Paused),
        (
            1,
            LegEnd::Failed("the model is unreachable (exit 1)".into()),
        ),
    ] {
        let state: Shared = Arc::default();
        let api = api_server(state.clone());
        let runner = runner(&api).await;
        finish_when_created(&state, code);
        let outcome = runner
            .run_leg(&spec(None), CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(outcome.end, expected);
        assert!(state.lock().unwrap().jobs.is_empty());
    }
}
