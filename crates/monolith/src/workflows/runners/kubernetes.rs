//! The Kubernetes runner: each leg is a Job created through the API server
//! (kube-rs), from the monolith's image, running `duo-workflow-executor`.
//!
//! A small controller, idempotent by name: the Job (`duo-workflow-<id>-<leg>`)
//! is created first, then a Secret with the leg's tokens owned by that Job
//! (so the garbage collector deletes it with the Job); the pod reads the
//! Secret through `envFrom`, never its arguments. The Job is polled until it
//! ends, the executor's exit code and log tail are read from its pod, and the
//! Job is deleted with its pods and Secret however the leg ended. Limits are
//! the pod's: CPU, memory, an `emptyDir` workspace of bounded size,
//! `activeDeadlineSeconds`; the pod runs as a non-root user without a
//! service account token, and the network policy of the deployment
//! (`deploy/`) lets it reach only the monolith and the workflow service.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{LegEnd, LegOutcome, LegSpec, Reach, Runner, RunnerError, end_of, tail};

/// How often the Job's state is read while it runs.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// The workspace inside the pod.
const WORKSPACE: &str = "/workspace";
/// What the pod's log tail keeps.
const LOG_LINES: i64 = 200;
/// The label every run's objects carry (for operators and clean-up).
pub const RUN_LABEL: &str = "duo.gitlab.com/workflow-run";

/// How the Kubernetes runner is set up.
#[derive(Debug, Clone)]
pub struct KubernetesRunnerConfig {
    /// The API server; `None` reads the in-cluster configuration.
    pub api_url: Option<url::Url>,
    /// `None`: the client's default (the pod's own namespace in a cluster).
    pub namespace: Option<String>,
    /// The image with `duo-workflow-executor` (the monolith's own).
    pub image: String,
    /// How pods reach the monolith and the workflow service.
    pub gitlab_url: String,
    pub service_url: String,
    /// CPU limit of the executor's container (`"1"`, `"500m"`).
    pub cpu: String,
}

pub struct KubernetesRunner {
    /// The API client and namespace, made on first use: a worker starts
    /// (and runs its other jobs) even while the API cannot be reached, and
    /// a leg then fails with the reason.
    connection: tokio::sync::OnceCell<(kube::Client, String)>,
    config: KubernetesRunnerConfig,
}

impl KubernetesRunner {
    /// A runner that connects when its first leg runs.
    pub fn lazy(config: KubernetesRunnerConfig) -> Self {
        Self {
            connection: tokio::sync::OnceCell::new(),
            config,
        }
    }

    /// A runner connected now.
    pub async fn connect(config: KubernetesRunnerConfig) -> Result<Self, RunnerError> {
        let runner = Self::lazy(config);
        runner.connection().await?;
        Ok(runner)
    }

    async fn connection(&self) -> Result<&(kube::Client, String), RunnerError> {
        self.connection
            .get_or_try_init(|| Self::open(&self.config))
            .await
    }

    async fn open(config: &KubernetesRunnerConfig) -> Result<(kube::Client, String), RunnerError> {
        let kube_config = match &config.api_url {
            Some(url) => kube::Config::new(
                url.as_str()
                    .parse()
                    .map_err(|e| RunnerError::Start(format!("{url}: {e}")))?,
            ),
            None => kube::Config::infer()
                .await
                .map_err(|e| RunnerError::Start(format!("Kubernetes configuration: {e}")))?,
        };
        let client = kube::Client::try_from(kube_config)
            .map_err(|e| RunnerError::Start(format!("Kubernetes client: {e}")))?;
        let namespace = config
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        Ok((client, namespace))
    }

    fn name_for(spec: &LegSpec) -> String {
        format!("duo-workflow-{}-{}", spec.workflow_id, spec.workload_id)
    }
}

/// The Job of one leg (without its tokens, which the Secret carries).
pub fn job_manifest(config: &KubernetesRunnerConfig, spec: &LegSpec, name: &str) -> Value {
    let reach = Reach::Urls {
        gitlab: config.gitlab_url.clone(),
        service: config.service_url.clone(),
    };
    let limits = &spec.limits;
    let memory = format!("{}Mi", limits.memory_bytes / (1024 * 1024));
    let disk = format!("{}Mi", limits.disk_bytes / (1024 * 1024));
    let mut env = vec![
        json!({"name": "HOME", "value": "/tmp"}),
        json!({"name": "LANG", "value": "C.UTF-8"}),
    ];
    // The run's calls continue the trace of the job that started it.
    if let Some(traceparent) = duo_telemetry::current_traceparent() {
        env.push(json!({"name": "TRACEPARENT", "value": traceparent}));
    }
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {
                RUN_LABEL: name,
                "duo.gitlab.com/workflow-id": spec.workflow_id.to_string(),
                "app.kubernetes.io/name": "duo-workflow-run",
                "app.kubernetes.io/part-of": "duo",
            },
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": limits.max_duration.as_secs(),
            "ttlSecondsAfterFinished": 300,
            "template": {
                "metadata": {
                    "labels": {
                        RUN_LABEL: name,
                        "app.kubernetes.io/name": "duo-workflow-run",
                        "app.kubernetes.io/part-of": "duo",
                    },
                },
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "fsGroup": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "executor",
                        "image": config.image,
                        "command": ["duo-workflow-executor"],
                        "args": spec.executor_args(&reach, WORKSPACE),
                        "workingDir": WORKSPACE,
                        "envFrom": [{"secretRef": {"name": name}}],
                        "env": env,
                        "resources": {
                            "requests": {"cpu": "100m", "memory": "128Mi", "ephemeral-storage": "64Mi"},
                            "limits": {"cpu": config.cpu, "memory": memory, "ephemeral-storage": disk},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [
                            {"name": "workspace", "mountPath": WORKSPACE},
                            {"name": "tmp", "mountPath": "/tmp"},
                        ],
                    }],
                    "volumes": [
                        {"name": "workspace", "emptyDir": {"sizeLimit": disk}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                    ],
                },
            },
        },
    })
}

/// The Job the runner would create for an example leg under `config`
/// (`duo-monolith render-run-job`): for reviewing RBAC, network policies
/// and admission rules before any run. Its Secret is not shown.
pub fn example_job(config: &crate::config::Config) -> Value {
    let k8s = &config.duo_workflow.runs.kubernetes;
    let runner = KubernetesRunnerConfig {
        api_url: k8s.api_url.clone(),
        namespace: k8s.namespace.clone(),
        image: k8s.image.clone(),
        gitlab_url: k8s.gitlab_url.as_str().trim_end_matches('/').to_owned(),
        service_url: k8s.service_url.as_str().trim_end_matches('/').to_owned(),
        cpu: k8s.cpu.clone(),
    };
    let runs = &config.duo_workflow.runs;
    let spec = LegSpec {
        workflow_id: 1,
        workload_id: 1,
        project_path: "group/project".into(),
        source_ref: "main".into(),
        checkpoint_ref: "refs/workloads/1".into(),
        definition: "software_development".into(),
        goal: "An example goal".into(),
        gitlab_token: secrecy::SecretString::from(""),
        service_token: secrecy::SecretString::from(""),
        service_headers: secrecy::SecretString::from(""),
        answer: None,
        git_author: ("GitLab Duo".into(), "duo@example.com".into()),
        limits: super::RunLimits {
            max_duration: runs.max_duration,
            memory_bytes: runs.memory_mb * 1024 * 1024,
            cpu_seconds: runs.cpu_seconds,
            disk_bytes: runs.disk_mb * 1024 * 1024,
        },
    };
    job_manifest(&runner, &spec, "duo-workflow-1-1")
}

/// The Secret holding a leg's tokens, owned by its Job.
pub fn secret_manifest(spec: &LegSpec, name: &str, job_uid: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "labels": {RUN_LABEL: name},
            "ownerReferences": [{
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": job_uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "stringData": {
            "DUO_GITLAB_TOKEN": spec.gitlab_token.expose_secret(),
            "DUO_SERVICE_TOKEN": spec.service_token.expose_secret(),
            "DUO_SERVICE_HEADERS": spec.service_headers.expose_secret(),
        },
    })
}

fn backend(e: impl std::fmt::Display) -> RunnerError {
    RunnerError::Backend(e.to_string())
}

/// The exit code of the executor's container, once it ended.
fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "executor")?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

/// Whether the Job ended, and how its own status says.
fn job_ended(job: &Job) -> Option<bool> {
    let status = job.status.as_ref()?;
    if status.succeeded.unwrap_or(0) > 0 {
        return Some(true);
    }
    if status.failed.unwrap_or(0) > 0 {
        return Some(false);
    }
    let conditions: &[k8s_openapi::api::batch::v1::JobCondition] =
        status.conditions.as_deref().unwrap_or_default();
    conditions
        .iter()
        .find(|c| c.status == "True" && (c.type_ == "Complete" || c.type_ == "Failed"))
        .map(|c| c.type_ == "Complete")
}

#[async_trait]
impl Runner for KubernetesRunner {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn run_leg(
        &self,
        spec: &LegSpec,
        cancel: CancellationToken,
    ) -> Result<LegOutcome, RunnerError> {
        let (client, namespace) = self.connection().await?;
        let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let name = Self::name_for(spec);
        let manifest: Job = serde_json::from_value(job_manifest(&self.config, spec, &name))
            .map_err(|e| RunnerError::Start(e.to_string()))?;
        // Idempotent by name: a worker that runs the leg again (its lease
        // lapsed) finds the Job it started.
        let job = match jobs.get_opt(&name).await.map_err(backend)? {
            Some(job) => job,
            None => jobs
                .create(&PostParams::default(), &manifest)
                .await
                .map_err(|e| RunnerError::Start(e.to_string()))?,
        };
        let uid = job.metadata.uid.clone().unwrap_or_default();
        if secrets.get_opt(&name).await.map_err(backend)?.is_none() {
            let secret: Secret = serde_json::from_value(secret_manifest(spec, &name, &uid))
                .map_err(|e| RunnerError::Start(e.to_string()))?;
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .map_err(|e| RunnerError::Start(e.to_string()))?;
        }
        let deadline = tokio::time::Instant::now() + spec.limits.max_duration;
        let ended = loop {
            tokio::select! {
                () = tokio::time::sleep(POLL_INTERVAL) => {}
                () = cancel.cancelled() => break None,
                () = tokio::time::sleep_until(deadline) => break Some(LegEnd::TimedOut),
            }
            let Some(job) = jobs.get_opt(&name).await.map_err(backend)? else {
                break Some(LegEnd::Failed("the run's Job was deleted".into()));
            };
            if job_ended(&job).is_some() {
                break Some(LegEnd::Finished);
            }
        };
        let selector = format!("{RUN_LABEL}={name}");
        let pod = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(backend)?
            .items
            .into_iter()
            .next();
        let log = match &pod {
            Some(pod) => pods
                .logs(
                    &pod.metadata.name.clone().unwrap_or_default(),
                    &LogParams {
                        container: Some("executor".into()),
                        tail_lines: Some(LOG_LINES),
                        ..LogParams::default()
                    },
                )
                .await
                .unwrap_or_default(),
            None => String::new(),
        };
        let end = match ended {
            None => LegEnd::Cancelled,
            Some(LegEnd::Finished) => end_of(pod.as_ref().and_then(exit_code), &log),
            Some(other) => other,
        };
        // The Job goes with its pods and (as their owner) the Secret.
        jobs.delete(&name, &DeleteParams::background())
            .await
            .map_err(backend)?;
        Ok(LegOutcome {
            end,
            log_tail: tail(&log, 16 * 1024),
        })
    }
}
