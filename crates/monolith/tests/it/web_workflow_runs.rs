//! Runs of the product from the web app over real HTTP: "Run with Duo" on an
//! issue and the workflows page's start form create a software-development
//! run as the Duo service account and queue its first leg; the run page
//! shows the legs (escaped output, failure, queue place), Approve / Reject
//! once a leg paused, Stop, and the branch and merge request; the buttons
//! send the events the REST API takes. Refused: another user's run (404),
//! forms without their token (403), a user who may not run workflows there
//! (no button, 403), no runner (422). No worker runs here: the tests move the
//! legs themselves where a runner would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{Fx, Server};
use crate::web_code_pages::{Session, Site, page_data, session, site, workflow_count};

use monolith::policy::{Actor, access};
use serde_json::json;

const PLAN_APPROVAL_REQUIRED: i16 = 7;
const TOOL_CALL_APPROVAL_REQUIRED: i16 = 8;
const FINISHED: i16 = 3;

/// `duo-bot`, the instance's workflow service account, a developer of `acme`
/// when `member`.
async fn service_account(s: &Site, member: bool) -> Actor {
    let bot = s.fx.user("duo-bot").await;
    let db = s.fx.pool.get().await.unwrap();
    db.execute(
        "UPDATE users SET service_account = true WHERE id = $1",
        &[&bot.id],
    )
    .await
    .unwrap();
    db.execute(
        "UPDATE instance_settings SET duo_workflow_service_account_id = $1",
        &[&bot.id],
    )
    .await
    .unwrap();
    if member {
        let group: i64 =
            s.fx.id("SELECT group_id FROM projects WHERE id = $1", &[&s.project])
                .await;
        s.fx.group_member(group, bot, access::DEVELOPER).await;
    }
    bot
}

/// A user of `acme` with `role`, with a Duo seat or not, signed in.
async fn member(s: &Site, name: &str, role: i32, seat: bool) -> Session {
    let user = s.fx.user(name).await;
    if seat {
        s.fx.seat(user, "duo_enterprise", false).await;
    }
    let group: i64 =
        s.fx.id("SELECT group_id FROM projects WHERE id = $1", &[&s.project])
            .await;
    s.fx.group_member(group, user, role).await;
    session(&s.fx, user.id).await
}

/// Issue #`iid` of the site with this description.
async fn issue_with(s: &Site, description: &str) -> (i64, i32) {
    let issue = s.fx.issue(s.project, s.owner, false).await;
    let db = s.fx.pool.get().await.unwrap();
    let row = db
        .query_one(
            "UPDATE issues SET title = 'Sessions expire too early', description = $2
             WHERE id = $1 RETURNING iid",
            &[&issue, &description],
        )
        .await
        .unwrap();
    (issue, row.get(0))
}

fn form<'a>(session: &'a Session, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut fields = vec![("authenticity_token", session.csrf.as_str())];
    fields.extend_from_slice(extra);
    fields
}

/// The legs of a workflow: state, answer and rejection message.
async fn legs(fx: &Fx, workflow: i64) -> Vec<(String, Option<String>, Option<String>)> {
    let db = fx.pool.get().await.unwrap();
    db.query(
        "SELECT state, answer, reject_message FROM duo_workflow_workloads
         WHERE workflow_id = $1 ORDER BY leg",
        &[&workflow],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// Where a runner would be once the newest leg ended as `state`, the
/// workflow in `status`.
async fn leg_ended(fx: &Fx, workflow: i64, state: &str, status: i16, log: Option<&str>) {
    let db = fx.pool.get().await.unwrap();
    db.execute(
        "UPDATE duo_workflow_workloads SET state = $2, log_tail = $3, finished_at = now()
         WHERE workflow_id = $1 AND leg = (SELECT max(leg) FROM duo_workflow_workloads WHERE workflow_id = $1)",
        &[&workflow, &state, &log],
    )
    .await
    .unwrap();
    db.execute(
        "UPDATE duo_workflows_workflows SET status = $2 WHERE id = $1",
        &[&workflow, &status],
    )
    .await
    .unwrap();
}

/// The page's own part, stable: the CSRF token redacted.
fn main_of(html: &str, session: &Session) -> String {
    let start = html.find("<main").unwrap();
    let end = html.find("</main>").unwrap() + "</main>".len();
    html[start..end].replace(&session.csrf, "[csrf]")
}

fn workflow_id(location: &str) -> i64 {
    location
        .rsplit('/')
        .next()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("not a run page: {location}"))
}

#[tokio::test]
async fn run_with_duo_on_an_issue_runs_it_as_the_service_account_and_the_page_steers_it() {
    let s = site().await;
    let bot = service_account(&s, true).await;
    let (issue, iid) = issue_with(&s, "Users with <b>old</b> sessions get a 500.").await;
    let issue_page = format!("/acme/site/-/issues/{iid}");
    let (status, html) = s.alice.get(&s.server, &issue_page).await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("id=\"run-with-duo\""), "{html}");
    let action = format!("{issue_page}/workflows");
    assert!(html.contains(&format!("action=\"{action}\"")), "{html}");
    let mut pages = vec![format!("==== {issue_page}\n{}", main_of(&html, &s.alice))];

    // Without the session's token: refused, nothing started.
    let (status, _) = s.alice.post_form(&s.server, &action, &[]).await;
    assert_eq!(status, 403);
    let wrong = "0".repeat(s.alice.csrf.len());
    let (status, _) = s
        .alice
        .post_form(&s.server, &action, &[("authenticity_token", &wrong)])
        .await;
    assert_eq!(status, 403);
    assert_eq!(workflow_count(&s.fx).await, 0);
    // An issue that does not exist.
    let (status, _) = s
        .alice
        .post_form(
            &s.server,
            "/acme/site/-/issues/99/workflows",
            &form(&s.alice, &[]),
        )
        .await;
    assert_eq!(status, 404);

    let (status, location) = s
        .alice
        .post_form(&s.server, &action, &form(&s.alice, &[]))
        .await;
    assert_eq!(status, 303);
    let location = location.unwrap();
    let workflow = workflow_id(&location);
    assert_eq!(location, format!("/acme/site/-/workflows/{workflow}"));
    let db = s.fx.pool.get().await.unwrap();
    let row = db
        .query_one(
            "SELECT user_id, service_account_id, workflow_definition, goal, issue_id, source_branch,
                    agent_privileges, pre_approved_agent_privileges
             FROM duo_workflows_workflows WHERE id = $1",
            &[&workflow],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), s.owner.id, "the user's workflow");
    assert_eq!(row.get::<_, Option<i64>>(1), Some(bot.id), "run as the bot");
    assert_eq!(row.get::<_, String>(2), "software_development");
    assert_eq!(
        row.get::<_, String>(3),
        format!(
            "Resolve issue #{iid}: Sessions expire too early\n\nUsers with <b>old</b> sessions get a 500."
        )
    );
    assert_eq!(row.get::<_, Option<i64>>(4), Some(issue));
    assert_eq!(row.get::<_, Option<String>>(5), None, "the default branch");
    assert_eq!(row.get::<_, Vec<i16>>(6), vec![1, 2, 4]);
    assert_eq!(row.get::<_, Vec<i16>>(7), vec![2]);
    // The first leg was admitted at once (nothing else runs).
    assert_eq!(
        legs(&s.fx, workflow).await,
        [("running".to_owned(), None, None)]
    );

    // While it runs: the page follows it, offers Stop, no answer yet.
    let (status, html) = s.alice.get(&s.server, &location).await;
    assert_eq!(status, 200, "{html}");
    let data = page_data(&html);
    assert_eq!(data["productRun"], true);
    assert_eq!(data["following"], true);
    assert_eq!(data["browserClient"], false, "the runner runs it");
    assert!(html.contains("id=\"stop-form\""));
    assert!(!html.contains("approve-run"));
    assert!(
        html.contains("Users with &lt;b&gt;old&lt;/b&gt; sessions"),
        "{html}"
    );
    assert!(
        html.contains(&format!("href=\"{issue_page}\"")),
        "links its issue"
    );
    // Answering before the leg saved its work is refused.
    let (status, _) = s
        .alice
        .post_form(
            &s.server,
            &format!("{location}/approve"),
            &form(&s.alice, &[]),
        )
        .await;
    assert_eq!(status, 409);

    // The leg paused for the plan: its output (escaped), the plan, the buttons.
    leg_ended(
        &s.fx,
        workflow,
        "paused",
        PLAN_APPROVAL_REQUIRED,
        Some("cloned\n<script>alert(1)</script>\n"),
    )
    .await;
    db.execute(
        "INSERT INTO duo_workflows_checkpoints
           (workflow_id, project_id, thread_ts, checkpoint_ns, checkpoint, metadata)
         VALUES ($1, $2, 'ts-1', '', $3, '{}')",
        &[
            &workflow,
            &s.project,
            &json!({"channel_values": {
                "ui_chat_log": [{"message_type": "agent", "content": "I read the session code."}],
                "plan": {"steps": [{"description": "Refresh <expired> sessions", "status": "Not Started"}]}
            }})
            .to_string(),
        ],
    )
    .await
    .unwrap();
    let (_, html) = s.alice.get(&s.server, &location).await;
    assert_eq!(page_data(&html)["following"], false);
    assert!(html.contains("id=\"approve-run\""), "{html}");
    assert!(html.contains("id=\"reject-run\""));
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{html}"
    );
    assert!(!html.contains("<script>alert(1)"));
    assert!(
        html.contains("1. Refresh &lt;expired&gt; sessions"),
        "{html}"
    );
    pages.push(format!(
        "==== {location} (plan)\n{}",
        main_of(&html, &s.alice)
    ));

    // Approve: the event is stored and delivered, the next leg queued with
    // the answer.
    let (status, _) = s
        .alice
        .post_form(&s.server, &format!("{location}/approve"), &[])
        .await;
    assert_eq!(status, 403, "the token");
    let (status, back) = s
        .alice
        .post_form(
            &s.server,
            &format!("{location}/approve"),
            &form(&s.alice, &[]),
        )
        .await;
    assert_eq!((status, back.as_deref()), (303, Some(location.as_str())));
    assert_eq!(
        legs(&s.fx, workflow).await[1],
        ("running".to_owned(), Some("approve".to_owned()), None)
    );
    let events: Vec<(i16, i16)> = db
        .query(
            "SELECT event_type, event_status FROM duo_workflows_events WHERE workflow_id = $1",
            &[&workflow],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(events, [(1, 1)], "resume, delivered");

    // The edit waits for approval: reject it with a message.
    leg_ended(&s.fx, workflow, "paused", TOOL_CALL_APPROVAL_REQUIRED, None).await;
    let (status, _) = s
        .alice
        .post_form(
            &s.server,
            &format!("{location}/reject"),
            &form(&s.alice, &[("message", &"x".repeat(5000))]),
        )
        .await;
    assert_eq!(status, 422, "longer than a leg can carry");
    let (status, _) = s
        .alice
        .post_form(
            &s.server,
            &format!("{location}/reject"),
            &form(&s.alice, &[("message", "  Edit src/session.rs instead ")]),
        )
        .await;
    assert_eq!(status, 303);
    assert_eq!(
        legs(&s.fx, workflow).await[2],
        (
            "running".to_owned(),
            Some("reject".to_owned()),
            Some("Edit src/session.rs instead".to_owned())
        )
    );

    // It finished with a branch and a merge request: the page links both.
    leg_ended(&s.fx, workflow, "finished", FINISHED, None).await;
    let mr: i64 = s
        .fx
        .id(
            "INSERT INTO merge_requests (project_id, iid, title, author_id, source_branch, target_branch)
             VALUES ($1, 1, 'Duo Workflow', $2, $3, 'main') RETURNING id",
            &[&s.project, &bot.id, &format!("duo/workflow-{workflow}")],
        )
        .await;
    db.execute(
        "UPDATE duo_workflows_workflows SET result_branch = $2, merge_request_id = $3 WHERE id = $1",
        &[&workflow, &format!("duo/workflow-{workflow}"), &mr],
    )
    .await
    .unwrap();
    let (_, html) = s.alice.get(&s.server, &location).await;
    assert!(
        html.contains("href=\"/acme/site/-/merge_requests/1\""),
        "{html}"
    );
    assert!(html.contains(&format!(
        "href=\"/acme/site/-/tree/duo/workflow-{workflow}\""
    )));
    assert!(!html.contains("id=\"stop-form\""), "over");
    assert!(!html.contains("approve-run"));
    // An answer to a run that waits for nothing is refused.
    let (status, _) = s
        .alice
        .post_form(
            &s.server,
            &format!("{location}/approve"),
            &form(&s.alice, &[]),
        )
        .await;
    assert_eq!(status, 422);
    pages.push(format!(
        "==== {location} (finished)\n{}",
        main_of(&html, &s.alice)
    ));
    insta::assert_snapshot!("run_pages", pages.join("\n"));
}

#[tokio::test]
async fn a_stop_from_the_page_cancels_a_waiting_leg() {
    let s = site().await;
    service_account(&s, true).await;
    let (_, iid) = issue_with(&s, "").await;
    let action = format!("/acme/site/-/issues/{iid}/workflows");
    let mut runs = Vec::new();
    // Two legs of alice's run at once; the third waits its turn.
    for _ in 0..3 {
        let (status, location) = s
            .alice
            .post_form(&s.server, &action, &form(&s.alice, &[]))
            .await;
        assert_eq!(status, 303);
        runs.push(location.unwrap());
    }
    let third = &runs[2];
    let workflow = workflow_id(third);
    assert_eq!(legs(&s.fx, workflow).await[0].0, "queued");
    let (_, html) = s.alice.get(&s.server, third).await;
    assert!(
        html.contains("Waiting for a free runner: number 1 in line."),
        "{html}"
    );
    assert_eq!(page_data(&html)["following"], true);
    let (status, _) = s
        .alice
        .post_form(&s.server, &format!("{third}/stop"), &form(&s.alice, &[]))
        .await;
    assert_eq!(status, 303);
    assert_eq!(legs(&s.fx, workflow).await[0].0, "cancelled");
    let status: i64 =
        s.fx.id(
            "SELECT status::bigint FROM duo_workflows_workflows WHERE id = $1",
            &[&workflow],
        )
        .await;
    assert_eq!(status, 5, "stopped");
    let stops: i64 =
        s.fx.id(
            "SELECT count(*) FROM duo_workflows_events WHERE workflow_id = $1 AND event_type = 2",
            &[&workflow],
        )
        .await;
    assert_eq!(stops, 1, "the stop went through the events");
}

#[tokio::test]
async fn others_cannot_see_nor_steer_a_run_and_who_may_not_run_gets_no_button() {
    let s = site().await;
    service_account(&s, true).await;
    let (_, iid) = issue_with(&s, "Something").await;
    let issue_page = format!("/acme/site/-/issues/{iid}");
    let action = format!("{issue_page}/workflows");
    let (_, location) = s
        .alice
        .post_form(&s.server, &action, &form(&s.alice, &[]))
        .await;
    let location = location.unwrap();
    let workflow = workflow_id(&location);
    leg_ended(&s.fx, workflow, "paused", PLAN_APPROVAL_REQUIRED, None).await;

    // Dave may run workflows here himself, but alice's run is not his: 404
    // for the page and every button, and nothing moves.
    let dave = member(&s, "dave", access::DEVELOPER, true).await;
    let (status, html) = dave.get(&s.server, &issue_page).await;
    assert_eq!(status, 200);
    assert!(html.contains("run-with-duo"), "dave may run workflows");
    assert_eq!(dave.get(&s.server, &location).await.0, 404);
    for button in ["approve", "reject", "stop"] {
        let (status, _) = dave
            .post_form(
                &s.server,
                &format!("{location}/{button}"),
                &form(&dave, &[("message", "no")]),
            )
            .await;
        assert_eq!(status, 404, "{button}");
    }
    // Bob is no member of the private project at all.
    assert_eq!(s.bob.get(&s.server, &location).await.0, 404);
    let (status, _) = s
        .bob
        .post_form(&s.server, &action, &form(&s.bob, &[]))
        .await;
    assert_eq!(status, 404);
    // Alice's own token does not do for dave, nor dave's for alice.
    let (status, _) = s
        .alice
        .post_form(
            &s.server,
            &format!("{location}/reject"),
            &[("authenticity_token", &dave.csrf), ("message", "no")],
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(legs(&s.fx, workflow).await.len(), 1);

    // Carol reads the project but has no seat: no button, and the start is
    // refused from the issue and from the workflows page.
    let carol = member(&s, "carol", access::DEVELOPER, false).await;
    let (status, html) = carol.get(&s.server, &issue_page).await;
    assert_eq!(status, 200);
    assert!(!html.contains("run-with-duo"), "{html}");
    let (status, _) = carol
        .post_form(&s.server, &action, &form(&carol, &[]))
        .await;
    assert_eq!(status, 403);
    let (status, _) = carol
        .post_form(
            &s.server,
            "/acme/site/-/workflows",
            &form(&carol, &[("goal", "Change it"), ("run_in", "product")]),
        )
        .await;
    assert_eq!(status, 403);
    // A reporter with a seat may not run workflows either.
    let erin = member(&s, "erin", access::REPORTER, true).await;
    let (_, html) = erin.get(&s.server, &issue_page).await;
    assert!(!html.contains("run-with-duo"));
    let (status, _) = erin.post_form(&s.server, &action, &form(&erin, &[])).await;
    assert_eq!(status, 403);
    assert_eq!(workflow_count(&s.fx).await, 1, "only alice's run");
}

#[tokio::test]
async fn the_start_form_runs_in_the_product_from_a_chosen_branch_where_it_can() {
    let s = site().await;
    // A service account that cannot work in the project: runs in the page only.
    service_account(&s, false).await;
    let (_, iid) = issue_with(&s, "").await;
    let issue_page = format!("/acme/site/-/issues/{iid}");
    let (_, html) = s.alice.get(&s.server, "/acme/site/-/workflows").await;
    assert!(!html.contains("run-in-product"), "{html}");
    assert!(html.contains("Duo service account"), "{html}");
    let (status, _) = s
        .alice
        .post_form(
            &s.server,
            "/acme/site/-/workflows",
            &form(&s.alice, &[("goal", "Change it"), ("run_in", "product")]),
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(workflow_count(&s.fx).await, 0);
    let (status, html) = s.alice.get(&s.server, &issue_page).await;
    assert_eq!(status, 200);
    assert!(!html.contains("run-with-duo"));

    // Once it is a developer there: offered, from the default branch first.
    let group: i64 =
        s.fx.id("SELECT group_id FROM projects WHERE id = $1", &[&s.project])
            .await;
    let bot: i64 =
        s.fx.id("SELECT id FROM users WHERE username = 'duo-bot'", &[])
            .await;
    s.fx.group_member(group, Actor::user(bot, false), access::DEVELOPER)
        .await;
    let (_, html) = s.alice.get(&s.server, "/acme/site/-/workflows").await;
    assert!(html.contains("id=\"run-in-product\""), "{html}");
    let main = html.find("<option value=\"main\" selected>").unwrap();
    let feature = html.find("<option value=\"feature/more\">").unwrap();
    assert!(main < feature, "{html}");

    let (status, location) = s
        .alice
        .post_form(
            &s.server,
            "/acme/site/-/workflows",
            &form(
                &s.alice,
                &[
                    ("goal", "Add a changelog"),
                    ("run_in", "product"),
                    ("source_branch", "feature/more"),
                ],
            ),
        )
        .await;
    assert_eq!(status, 303);
    let workflow = workflow_id(&location.unwrap());
    let db = s.fx.pool.get().await.unwrap();
    let row = db
        .query_one(
            "SELECT workflow_definition, source_branch, service_account_id FROM duo_workflows_workflows
             WHERE id = $1",
            &[&workflow],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "software_development");
    assert_eq!(
        row.get::<_, Option<String>>(1).as_deref(),
        Some("feature/more")
    );
    assert_eq!(row.get::<_, Option<i64>>(2), Some(bot));
    assert_eq!(legs(&s.fx, workflow).await.len(), 1);
    // A branch that does not exist: the form comes back with the reason.
    let (status, _) = s
        .alice
        .post_form(
            &s.server,
            "/acme/site/-/workflows",
            &form(
                &s.alice,
                &[
                    ("goal", "Add a changelog"),
                    ("run_in", "product"),
                    ("source_branch", "nope"),
                ],
            ),
        )
        .await;
    assert_eq!(status, 422);
    assert_eq!(workflow_count(&s.fx).await, 1);

    // No runner on the instance: the page says why, runs stay in the page.
    let disabled = Server::start_with_settings(
        &s.fx,
        s.fx.pool.clone(),
        &[("DUO_WORKFLOW_RUNNER", "disabled")],
    )
    .await;
    let (status, html) = s.alice.get(&disabled, "/acme/site/-/workflows").await;
    assert_eq!(status, 200);
    assert!(!html.contains("run-in-product"));
    assert!(html.contains("id=\"no-product-runs\""), "{html}");
    assert!(html.contains("no runner is configured"), "{html}");
    assert!(
        html.contains("duo-workflow-executor"),
        "how to run it by hand"
    );
    let (status, _) = s
        .alice
        .post_form(
            &disabled,
            "/acme/site/-/workflows",
            &form(&s.alice, &[("goal", "Change it"), ("run_in", "product")]),
        )
        .await;
    assert_eq!(status, 422);
    let (_, html) = s.alice.get(&disabled, &issue_page).await;
    assert!(!html.contains("run-with-duo"));
    let (status, _) = s
        .alice
        .post_form(
            &disabled,
            &format!("{issue_page}/workflows"),
            &form(&s.alice, &[]),
        )
        .await;
    assert_eq!(status, 422);
    assert_eq!(workflow_count(&s.fx).await, 1);
    // Runs in the page still start.
    let (status, _) = s
        .alice
        .post_form(
            &disabled,
            "/acme/site/-/workflows",
            &form(&s.alice, &[("goal", "Summarize issue #1")]),
        )
        .await;
    assert_eq!(status, 303);
}
