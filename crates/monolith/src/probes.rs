//! What an orchestrator asks a process: is it alive (`/-/liveness`), should it get
//! traffic (`/-/readiness`), and how full are the queues (`/-/metrics`,
//! Prometheus text, for autoscaling workers on queue depth).
//!
//! Readiness fails while the database is unreachable, while migrations are
//! pending, and from the moment the process starts stopping. The AI gateway's
//! reachability is reported too, and decides readiness for the `worker` role
//! (which cannot answer anything without it) but not for `web`: taking every web
//! replica out of service when the gateway blips would turn a chat outage into a
//! full outage.

use std::net::IpAddr;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use deadpool_postgres::Pool;
use serde_json::json;

use crate::config::Config;
use crate::lifecycle::Lifecycle;

/// How long one check may take before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Which role is asking, which decides whether the gateway counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Web,
    Worker,
}

/// What the probe handlers need; the `web` role and the worker's probe server
/// each build one.
#[derive(Clone)]
pub struct ProbeState {
    pub pool: Pool,
    pub config: std::sync::Arc<Config>,
    pub lifecycle: Lifecycle,
    pub role: Role,
    pub http: reqwest::Client,
}

impl ProbeState {
    pub fn new(
        pool: Pool,
        config: std::sync::Arc<Config>,
        lifecycle: Lifecycle,
        role: Role,
    ) -> Self {
        let http = reqwest::Client::builder()
            .timeout(CHECK_TIMEOUT)
            .build()
            .unwrap_or_default();
        Self {
            pool,
            config,
            lifecycle,
            role,
            http,
        }
    }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/-/liveness", web::get().to(liveness))
        .route("/-/readiness", web::get().to(readiness))
        .route("/-/metrics", web::get().to(metrics));
}

async fn liveness() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

async fn database_check(pool: &Pool) -> Result<bool, String> {
    let check = async {
        let client = pool.get().await.map_err(|e| e.to_string())?;
        client
            .query_one("SELECT 1", &[])
            .await
            .map_err(|e| e.to_string())?;
        crate::db::migrations_pending(&*client)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(CHECK_TIMEOUT, check).await {
        Ok(result) => result,
        Err(_) => Err("timed out".into()),
    }
}

async fn gateway_check(state: &ProbeState) -> bool {
    let Ok(url) = state.config.ai_gateway_url.join("monitoring/healthz") else {
        return false;
    };
    state
        .http
        .get(url)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

async fn readiness(state: web::Data<ProbeState>) -> HttpResponse {
    let stopping = state.lifecycle.is_stopping();
    let (database, gateway) = tokio::join!(database_check(&state.pool), gateway_check(&state));
    let (database_ok, migrations_ok) = match &database {
        Ok(pending) => (true, !pending),
        Err(_) => (false, false),
    };
    let gateway_counts = state.role == Role::Worker;
    let ready = !stopping && database_ok && migrations_ok && (gateway || !gateway_counts);
    let word = |ok: bool| if ok { "ok" } else { "failed" };
    let body = json!({
        "status": word(ready),
        "checks": {
            "database": word(database_ok),
            "migrations": if database_ok { word(migrations_ok) } else { "unknown" },
            "ai_gateway": if gateway { "ok" } else { "unreachable" },
            "shutdown": if stopping { "stopping" } else { "ok" },
        },
    });
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

fn allowed(state: &ProbeState, req: &HttpRequest) -> bool {
    let Some(ip) = req.peer_addr().map(|a| a.ip()) else {
        return false;
    };
    allowed_ip(&state.config, ip)
}

fn allowed_ip(config: &Config, ip: IpAddr) -> bool {
    config.monitoring_allowlist.iter().any(|n| n.contains(ip))
}

/// Prometheus text: readiness and the job queue's depth and age per queue.
async fn metrics(state: web::Data<ProbeState>, req: HttpRequest) -> HttpResponse {
    if !allowed(&state, &req) {
        return HttpResponse::NotFound().json(json!({ "message": "404 Not Found" }));
    }
    let stats = async {
        let client = state.pool.get().await.map_err(|e| e.to_string())?;
        job_queue::queue_stats(&**client)
            .await
            .map_err(|e| e.to_string())
    };
    let stats = match tokio::time::timeout(CHECK_TIMEOUT, stats).await {
        Ok(Ok(stats)) => stats,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "reading queue metrics failed");
            return HttpResponse::ServiceUnavailable().finish();
        }
        Err(_) => return HttpResponse::ServiceUnavailable().finish(),
    };
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(render_metrics(&stats, state.lifecycle.is_stopping()))
}

/// A gauge family: name, help text, and the figure it reads from a queue's stats.
type Family = (
    &'static str,
    &'static str,
    fn(&job_queue::QueueStats) -> f64,
);

/// The metrics page for `stats` (one gauge family per figure).
pub fn render_metrics(stats: &[job_queue::QueueStats], stopping: bool) -> String {
    let mut out = String::new();
    let families: [Family; 5] = [
        (
            "duo_job_queue_pending",
            "Jobs waiting, due now or later.",
            |s| s.pending as f64,
        ),
        (
            "duo_job_queue_due",
            "Jobs waiting and due now (what workers should be running).",
            |s| s.due as f64,
        ),
        ("duo_job_queue_running", "Jobs held by a worker.", |s| {
            s.running as f64
        }),
        (
            "duo_job_queue_dead",
            "Jobs that used all their attempts.",
            |s| s.dead as f64,
        ),
        (
            "duo_job_queue_oldest_due_age_seconds",
            "How long the oldest due job has waited.",
            |s| s.oldest_due_age_secs,
        ),
    ];
    for (name, help, value) in families {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for s in stats {
            let queue = s.queue.replace('\\', "\\\\").replace('"', "\\\"");
            out.push_str(&format!("{name}{{queue=\"{queue}\"}} {}\n", value(s)));
        }
    }
    out.push_str(
        "# HELP duo_stopping 1 once the process has begun stopping.\n# TYPE duo_stopping gauge\n",
    );
    out.push_str(&format!("duo_stopping {}\n", u8::from(stopping)));
    out
}

/// Serves the probes on `addr` until `lifecycle` stops (the `worker` role's
/// small server).
pub fn serve_probes(
    state: ProbeState,
    addr: std::net::SocketAddr,
) -> std::io::Result<actix_web::dev::Server> {
    let data = web::Data::new(state);
    Ok(actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .app_data(data.clone())
            .configure(routes)
    })
    .workers(1)
    .disable_signals()
    .bind(addr)?
    .run())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_one_line_per_queue_and_family() {
        let stats = vec![job_queue::QueueStats {
            queue: "default".into(),
            pending: 3,
            due: 2,
            running: 1,
            dead: 0,
            oldest_due_age_secs: 4.5,
        }];
        let text = render_metrics(&stats, false);
        assert!(text.contains("duo_job_queue_pending{queue=\"default\"} 3\n"));
        assert!(text.contains("duo_job_queue_due{queue=\"default\"} 2\n"));
        assert!(text.contains("duo_job_queue_oldest_due_age_seconds{queue=\"default\"} 4.5\n"));
        assert!(text.contains("duo_stopping 0\n"));
        assert_eq!(text.matches("# TYPE").count(), 6);
    }
}
