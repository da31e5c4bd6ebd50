//! The admin page `/admin/ai_usage`: Duo Chat usage of the whole instance
//! over the last days (`?days=`, 30 by default, at most a year), drawn on
//! the server as inline SVG, with no script: questions per day (failed ones
//! apart), failed answers by error code, tools the agent ran, question
//! categories, and time to first streamed text (p50 and p95) per day.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::NaiveDate;
use maud::{Markup, html};
use serde::Deserialize;

use super::PageError;
use super::admin_frame::{Flash, admin_page, admin_session};
use crate::ai_usage::reports::{self, DateRange, Overview};
use crate::app_state::AppState;

const PATH: &str = "/admin/ai_usage";
const DEFAULT_DAYS: i64 = 30;

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 180.0;
/// Room for the axis labels.
const LEFT: f64 = 44.0;
const BOTTOM: f64 = 22.0;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PATH, web::get().to(page));
}

#[derive(Deserialize)]
struct UsageQuery {
    days: Option<i64>,
}

impl From<crate::ai_usage::UsageError> for PageError {
    fn from(e: crate::ai_usage::UsageError) -> Self {
        PageError::Internal(e.to_string())
    }
}

async fn page(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<UsageQuery>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    let days = query
        .days
        .unwrap_or(DEFAULT_DAYS)
        .clamp(1, reports::MAX_RANGE_DAYS);
    let range = DateRange::last_days(days);
    let db = state.pool.get().await?;
    let overview = reports::overview(&*db, range).await?;
    Ok(admin_page(
        &session,
        StatusCode::OK,
        PATH,
        "AI usage",
        &Flash::default(),
        body(&overview, range, days),
    ))
}

fn body(o: &Overview, range: DateRange, days: i64) -> Markup {
    let questions: i64 = o.per_day.iter().map(|(_, n, _)| n).sum();
    let failed: i64 = o.per_day.iter().map(|(_, _, f)| f).sum();
    html! {
        form method="get" action=(PATH) class="inline-form" {
            label for="days" { "Days" }
            " "
            input id="days" name="days" type="number" min="1" max=(reports::MAX_RANGE_DAYS) value=(days);
            " "
            button type="submit" { "Show" }
        }
        p class="hint" {
            (range.start) " to " (range.end) " (UTC): " (questions) " questions, "
            (failed) " failed; about " (o.tokens.0) " tokens in and " (o.tokens.1)
            " out (estimated from the text of questions and answers)."
        }
        section aria-labelledby="chart-questions" {
            h2 id="chart-questions" { "Questions per day" }
            (day_bars(&o.per_day))
        }
        section aria-labelledby="chart-first-token" {
            h2 id="chart-first-token" { "Time to first token per day (ms)" }
            (first_token_lines(&o.first_token, range))
        }
        section aria-labelledby="chart-errors" {
            h2 id="chart-errors" { "Failed answers by error code" }
            (hbars("errors", &o.errors))
        }
        section aria-labelledby="chart-tools" {
            h2 id="chart-tools" { "Tools used" }
            (hbars("tools", &o.tools))
        }
        section aria-labelledby="chart-categories" {
            h2 id="chart-categories" { "Question categories" }
            (hbars("categories", &o.categories))
        }
    }
}

/// A value's height on a chart whose top is `max`.
fn scale(value: f64, max: f64) -> f64 {
    if max <= 0.0 {
        0.0
    } else {
        (value / max) * (HEIGHT - BOTTOM - 8.0)
    }
}

fn px(v: f64) -> String {
    format!("{v:.1}")
}

/// Questions per day as bars, the failed part of each bar in another colour.
fn day_bars(per_day: &[(NaiveDate, i64, i64)]) -> Markup {
    let max = per_day.iter().map(|(_, n, _)| *n).max().unwrap_or(0) as f64;
    let n = per_day.len().max(1) as f64;
    let slot = (WIDTH - LEFT) / n;
    let base = HEIGHT - BOTTOM;
    let label_every = (per_day.len() / 8).max(1);
    html! {
        svg class="chart" data-chart="questions" viewBox={"0 0 " (WIDTH) " " (HEIGHT)} role="img" aria-label="Questions per day" {
            line x1=(LEFT) y1=(px(base)) x2=(WIDTH) y2=(px(base)) stroke="currentColor" stroke-width="1" {}
            text x="2" y="12" font-size="10" { (max as i64) }
            @for (i, (day, total, failed)) in per_day.iter().enumerate() {
                @let x = LEFT + slot * i as f64 + slot * 0.1;
                @let h = scale(*total as f64, max);
                @let hf = scale(*failed as f64, max);
                g {
                    title { (day) ": " (total) " questions, " (failed) " failed" }
                    rect class="bar" x=(px(x)) y=(px(base - h)) width=(px(slot * 0.8)) height=(px(h)) fill="#1f75cb" {}
                    @if *failed > 0 {
                        rect class="bar-failed" x=(px(x)) y=(px(base - hf)) width=(px(slot * 0.8)) height=(px(hf)) fill="#dd2b0e" {}
                    }
                }
                @if i % label_every == 0 {
                    text x=(px(x)) y=(px(HEIGHT - 6.0)) font-size="9" { (day.format("%m-%d")) }
                }
            }
        }
    }
}

/// Counts by name as horizontal bars, largest first.
fn hbars(kind: &str, items: &[(String, i64)]) -> Markup {
    if items.is_empty() {
        return html! { p class="empty" data-chart=(kind) { "Nothing recorded in this range." } };
    }
    let max = items.iter().map(|(_, n)| *n).max().unwrap_or(0) as f64;
    let row = 20.0;
    let label = 150.0;
    let height = row * items.len() as f64 + 4.0;
    html! {
        svg class="chart" data-chart=(kind) viewBox={"0 0 " (WIDTH) " " (px(height))} role="img" aria-label=(kind) {
            @for (i, (name, count)) in items.iter().enumerate() {
                @let y = row * i as f64 + 2.0;
                @let w = if max > 0.0 { (*count as f64 / max) * (WIDTH - label - 50.0) } else { 0.0 };
                g {
                    title { (name) ": " (count) }
                    text x="0" y=(px(y + 13.0)) font-size="11" { (name) }
                    rect class="bar" x=(px(label)) y=(px(y)) width=(px(w)) height=(px(row - 6.0)) fill="#1f75cb" {}
                    text x=(px(label + w + 4.0)) y=(px(y + 13.0)) font-size="11" { (count) }
                }
            }
        }
    }
}

/// p50 and p95 of the time to first token, one point per day with answers.
fn first_token_lines(points: &[(NaiveDate, f64, f64)], range: DateRange) -> Markup {
    if points.is_empty() {
        return html! { p class="empty" data-chart="first-token" { "No streamed answers in this range." } };
    }
    let days = ((range.end - range.start).num_days() + 1).max(1) as f64;
    let slot = (WIDTH - LEFT) / days;
    let max = points.iter().map(|(_, _, p95)| *p95).fold(0.0, f64::max);
    let base = HEIGHT - BOTTOM;
    let x_of = |day: NaiveDate| LEFT + slot * ((day - range.start).num_days() as f64 + 0.5);
    let line = |pick: fn(&(NaiveDate, f64, f64)) -> f64| {
        points
            .iter()
            .map(|p| format!("{},{}", px(x_of(p.0)), px(base - scale(pick(p), max))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    html! {
        svg class="chart" data-chart="first-token" viewBox={"0 0 " (WIDTH) " " (HEIGHT)} role="img" aria-label="Time to first token, p50 and p95" {
            line x1=(LEFT) y1=(px(base)) x2=(WIDTH) y2=(px(base)) stroke="currentColor" stroke-width="1" {}
            text x="2" y="12" font-size="10" { (max.round() as i64) }
            polyline class="p95" points=(line(|p| p.2)) fill="none" stroke="#dd2b0e" stroke-width="2" {}
            polyline class="p50" points=(line(|p| p.1)) fill="none" stroke="#1f75cb" stroke-width="2" {}
            @for (day, p50, p95) in points {
                circle cx=(px(x_of(*day))) cy=(px(base - scale(*p50, max))) r="3" fill="#1f75cb" {
                    title { (day) ": p50 " (p50.round() as i64) " ms, p95 " (p95.round() as i64) " ms" }
                }
            }
            text x=(px(LEFT)) y=(px(HEIGHT - 6.0)) font-size="9" fill="#1f75cb" { "p50" }
            text x=(px(LEFT + 30.0)) y=(px(HEIGHT - 6.0)) font-size="9" fill="#dd2b0e" { "p95" }
        }
    }
}
