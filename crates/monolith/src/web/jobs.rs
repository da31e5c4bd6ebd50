//! The page of a CI job (`/<project>/-/jobs/<id>`, the `web_url` the REST API
//! gives): name, status, stage, pipeline, the end of its log, "Ask Duo" and,
//! on a failed job, "Explain this job failure". The checks are the REST job
//! endpoint's: the project readable, then `read_build` on the job; anything
//! else is "not found".

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;

use super::PageError;
use super::duo_prompts::{self, PredefinedPrompt};
use super::layout::{self, Page};
use crate::app_state::AppState;
use crate::policy::{Ability, Actor, Subject};
use crate::work_items::builds;

/// Most lines of the log the page shows (its end).
const TRACE_LINES: usize = 200;
/// Most bytes of the log the page shows (its end).
const TRACE_CHARS: usize = 32_000;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/{path:.+}/-/jobs/{id}", web::get().to(job));
}

/// The last `TRACE_LINES` lines of `log`, at most `TRACE_CHARS` bytes,
/// and whether anything was left out.
fn trace_tail(log: &str) -> (&str, bool) {
    let mut start = log.len();
    let mut lines = 0;
    for (i, c) in log.char_indices().rev() {
        if c == '\n' && i + 1 < log.len() {
            lines += 1;
            if lines >= TRACE_LINES {
                break;
            }
        }
        if log.len() - i > TRACE_CHARS {
            break;
        }
        start = i;
    }
    (&log[start..], start > 0)
}

async fn job(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, PageError> {
    let (project_path, id) = path.into_inner();
    let id = id
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or(PageError::NotFound)?;
    let session = super::signed_in(&state, &req).await?;
    let db = state.pool.get().await?;
    let project = super::project_with(
        &state,
        &*db,
        &session,
        &project_path,
        &[Ability::ReadProject],
    )
    .await?;
    let Some(job) = builds::job(&*db, project, id).await? else {
        return Err(PageError::NotFound);
    };
    if !state
        .policy
        .can(
            &*db,
            Some(Actor::from(&session.user)),
            Ability::ReadBuild,
            Subject::Build(job.id),
        )
        .await?
    {
        return Err(PageError::NotFound);
    }
    drop(db);
    let gid = crate::gid::format("Ci::Build", job.id);
    let heading = format!("{} (#{})", job.name, job.id);
    let explain = job.status == "failed"
        && duo_prompts::offered(
            &state,
            &session,
            PredefinedPrompt::ExplainJobFailure,
            Subject::Build(job.id),
        )
        .await?;
    let (trace, cut) = trace_tail(&job.log);
    let body = html! {
        section class="card job" {
            div class="title-row" {
                h1 { (heading) " " span class={ "badge " (job.status) } { (job.status) } }
                div class="actions" {
                    @if explain {
                        (duo_prompts::link(PredefinedPrompt::ExplainJobFailure, &gid, &heading))
                    }
                    (super::resources::ask_duo(&gid, &heading))
                }
            }
            dl class="facts" {
                dt { "Stage" } dd { (job.stage) }
                dt { "Pipeline" } dd { "#" (job.pipeline_id) " " span class={ "badge " (job.pipeline_status) } { (job.pipeline_status) } }
                dt { "Ref" } dd { code { (job.git_ref) } " " code { (job.sha.chars().take(8).collect::<String>()) } }
                @if let Some(finished) = job.finished_at {
                    dt { "Finished" } dd { (finished.format("%Y-%m-%d %H:%M UTC")) }
                }
            }
            p { a href={ "/" (project_path) } { "Back to the project" } }
        }
        section class="card" {
            h2 { "Log" }
            @if trace.is_empty() {
                p class="muted" { "This job has no log." }
            } @else {
                @if cut { p class="muted" { "The end of the log:" } }
                pre class="trace" id="trace" { (trace) }
            }
        }
    };
    Ok(layout::html_response(
        StatusCode::OK,
        layout::render(
            Page {
                title: &heading,
                session: Some(&session),
                scripts: &[],
                data: serde_json::Value::Null,
            },
            body,
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_tail_keeps_the_last_lines() {
        assert_eq!(trace_tail("a\nb\n"), ("a\nb\n", false));
        let long: String = (0..500).map(|i| format!("line {i}\n")).collect();
        let (tail, cut) = trace_tail(&long);
        assert!(cut);
        assert!(tail.starts_with("line 300\n"), "{tail}");
        assert!(tail.ends_with("line 499\n"));
        let wide = "é".repeat(40_000);
        let (tail, cut) = trace_tail(&wide);
        assert!(cut);
        assert_eq!(tail.chars().count(), TRACE_CHARS / 2);
    }
}
