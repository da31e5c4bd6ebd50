//! The CI job page and the predefined-question links over real HTTP: the job
//! page's checks are the REST job endpoint's (404 for who may not read it),
//! "Explain this job failure" only on a failed job and "Summarize comments"
//! only on an item with comments, each only for who could ask it (a seat, Duo
//! on for the project), and the chat page takes the question by key only and
//! sends it by itself only when opened from this site.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{Fx, Server};
use crate::web_graphql_explorer::session_client;

use monolith::config::Realm;
use monolith::policy::{Actor, access};
use serde_json::Value;

struct Ci {
    fx: Fx,
    server: Server,
    project: i64,
    failed_job: i64,
    passed_job: i64,
    alice: Actor,
    carol: Actor,
    bob: Actor,
}

/// `acme/api` (private): alice a developer with a seat, carol a reporter
/// without one, bob outside; a failed and a passed job; issue 1 with a
/// comment, issue 2 without.
async fn ci() -> Ci {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let alice = fx.user("alice").await;
    let carol = fx.user("carol").await;
    let bob = fx.user("bob").await;
    fx.seat(alice, "duo_enterprise", false).await;
    fx.seat(bob, "duo_enterprise", false).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, alice, access::DEVELOPER).await;
    fx.group_member(group, carol, access::REPORTER).await;
    let project = fx.project(group, "api", "private").await;
    let failed_job = fx.build(project).await;
    let passed_job = fx.build(project).await;
    fx.exec(
        "UPDATE ci_builds SET status = 'success', name = 'lint' WHERE id = $1",
        &[&passed_job],
    )
    .await;
    let commented = fx.issue(project, alice, false).await;
    fx.note("Issue", commented, carol, false).await;
    fx.issue(project, alice, false).await;
    let server = Server::start(&fx).await;
    Ci {
        fx,
        server,
        project,
        failed_job,
        passed_job,
        alice,
        carol,
        bob,
    }
}

impl Ci {
    async fn page(&self, user: Actor, path: &str) -> (u16, String) {
        let (http, cookie, _) = session_client(&self.fx, user.id).await;
        let res = http
            .get(self.server.url(path))
            .header("Cookie", cookie)
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.text().await.unwrap())
    }

    fn job_path(&self, job: i64) -> String {
        format!("/acme/api/-/jobs/{job}")
    }
}

const EXPLAIN: &str = "Explain this job failure";
const SUMMARIZE: &str = "Summarize comments";

#[tokio::test]
async fn a_failed_job_offers_explain_to_who_may_ask_and_its_page_to_who_may_read() {
    let ci = ci().await;
    let (status, html) = ci.page(ci.alice, &ci.job_path(ci.failed_job)).await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("test (#"), "{html}");
    assert!(
        html.contains("<pre class=\"trace\" id=\"trace\">boom</pre>"),
        "{html}"
    );
    assert!(html.contains(EXPLAIN), "{html}");
    let href = format!(
        "/-/chat?resource=gid%3A%2F%2Fgitlab%2FCi%3A%3ABuild%2F{}",
        ci.failed_job
    );
    assert!(html.contains(&href), "{html}");
    assert!(html.contains("prompt=explain_job_failure"), "{html}");

    // A passed job has nothing to explain.
    let (status, html) = ci.page(ci.alice, &ci.job_path(ci.passed_job)).await;
    assert_eq!(status, 200);
    assert!(html.contains("lint (#"), "{html}");
    assert!(!html.contains(EXPLAIN), "{html}");

    // A reporter reads the job (read_build) but has no seat: no link.
    let (status, html) = ci.page(ci.carol, &ci.job_path(ci.failed_job)).await;
    assert_eq!(status, 200);
    assert!(html.contains("boom"));
    assert!(!html.contains(EXPLAIN), "{html}");

    // Outside the private project: not found, the job's log never shown.
    let (status, html) = ci.page(ci.bob, &ci.job_path(ci.failed_job)).await;
    assert_eq!(status, 404);
    assert!(!html.contains("boom"));
    // A job of another project under this path, or none at all: not found.
    let (status, _) = ci.page(ci.alice, "/acme/api/-/jobs/999999").await;
    assert_eq!(status, 404);
    let (status, _) = ci.page(ci.alice, "/acme/api/-/jobs/x").await;
    assert_eq!(status, 404);

    // Duo switched off for the project: the page stays, the link goes.
    ci.fx.project_duo(ci.project, false).await;
    let (status, html) = ci.page(ci.alice, &ci.job_path(ci.failed_job)).await;
    assert_eq!(status, 200);
    assert!(!html.contains(EXPLAIN), "{html}");
}

#[tokio::test]
async fn the_job_page_needs_read_build_as_the_rest_endpoint_does() {
    let ci = ci().await;
    // A guest reads the private project but not its CI.
    let guest = ci.fx.user("guest").await;
    ci.fx.project_member(ci.project, guest, access::GUEST).await;
    let (status, html) = ci.page(guest, &ci.job_path(ci.failed_job)).await;
    assert_eq!(status, 404, "{html}");
    assert!(!html.contains("boom"));
    let token = ci.fx.token(guest, &["api"]).await;
    let (status, _) = crate::rest_support::get(
        &ci.server,
        &format!("/projects/{}/jobs/{}", ci.project, ci.failed_job),
        &token,
    )
    .await;
    assert_eq!(status, 404, "the REST endpoint refuses the guest alike");
}

#[tokio::test]
async fn summarize_comments_shows_on_items_with_comments_for_who_may_ask() {
    let ci = ci().await;
    let (status, html) = ci.page(ci.alice, "/acme/api/-/issues/1").await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains(SUMMARIZE), "{html}");
    assert!(html.contains("prompt=summarize_comments"), "{html}");
    assert!(
        html.contains("resource=gid%3A%2F%2Fgitlab%2FIssue%2F"),
        "{html}"
    );
    let (_, html) = ci.page(ci.alice, "/acme/api/-/issues/2").await;
    assert!(
        !html.contains(SUMMARIZE),
        "no comments to summarize: {html}"
    );
    let (status, html) = ci.page(ci.carol, "/acme/api/-/issues/1").await;
    assert_eq!(status, 200);
    assert!(html.contains("a note"));
    assert!(!html.contains(SUMMARIZE), "no seat: {html}");
}

/// The chat page's data block.
fn page_data(html: &str) -> Value {
    let start = html.find("id=\"page-data\">").unwrap() + "id=\"page-data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    serde_json::from_str(&html[start..end]).unwrap()
}

#[tokio::test]
async fn the_chat_page_sends_a_known_prompt_only_when_opened_from_this_site() {
    let ci = ci().await;
    let (http, cookie, _) = session_client(&ci.fx, ci.alice.id).await;
    let open = |query: String, site: Option<&'static str>| {
        let mut req = http
            .get(ci.server.url(&format!("/-/chat?{query}")))
            .header("Cookie", &cookie);
        if let Some(site) = site {
            req = req.header("Sec-Fetch-Site", site);
        }
        async move { req.send().await.unwrap().text().await.unwrap() }
    };
    let resource = format!(
        "resource=gid%3A%2F%2Fgitlab%2FCi%3A%3ABuild%2F{}",
        ci.failed_job
    );
    let data = page_data(
        &open(
            format!("{resource}&prompt=explain_job_failure"),
            Some("same-origin"),
        )
        .await,
    );
    assert_eq!(data["prompt"], "/troubleshoot", "{data}");
    assert_eq!(data["sendPrompt"], true);
    assert_eq!(
        data["resource"],
        format!("gid://gitlab/Ci::Build/{}", ci.failed_job)
    );

    // From another site (or a browser that does not say): filled in, not sent.
    for site in [Some("cross-site"), None] {
        let data = page_data(&open(format!("{resource}&prompt=explain_job_failure"), site).await);
        assert_eq!(data["prompt"], "/troubleshoot");
        assert_eq!(data["sendPrompt"], false, "{site:?}");
    }
    // Only known keys, and only about a resource.
    let data = page_data(&open(format!("{resource}&prompt=%2Fclear"), Some("same-origin")).await);
    assert_eq!(data["prompt"], Value::Null);
    assert_eq!(data["sendPrompt"], false);
    let data = page_data(&open("prompt=summarize_comments".into(), Some("same-origin")).await);
    assert_eq!(data["prompt"], Value::Null);
}
