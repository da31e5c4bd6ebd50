//! The merge request page for people: its reviewers (the bot as "GitLab
//! Duo"), "Request review from GitLab Duo" for who may set reviewers (CSRF
//! checked, the same review enqueued as through the API), and discussions
//! with diff notes at their file and line and resolved threads marked.

use crate::rest_reviewers::{bot_id, pending_jobs};
use crate::support::{Fx, Server};
use crate::web_sign_in::{browser, set_password, sign_in, token_in};

use monolith::policy::access;
use monolith::work_items::Author;
use monolith::work_items::discussions::{self, NewThreadNote, Noteable, Position};

#[tokio::test]
async fn developers_ask_gitlab_duo_for_a_review_from_the_page() {
    let fx = Fx::new().await;
    let dev = fx.user("dev").await;
    let reporter = fx.user("reporter").await;
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    fx.group_member(group, reporter, access::REPORTER).await;
    let project = fx.project(group, "api", "private").await;
    let mr = fx.merge_request(project, dev).await;
    let issue = fx.issue(project, dev, false).await;
    for user in [dev, reporter] {
        set_password(&fx, user.id, "correct horse battery").await;
    }
    let bot = bot_id(&fx).await;
    let db = fx.pool.get().await.unwrap();
    let thread = discussions::start(
        &*db,
        NewThreadNote {
            noteable: Noteable::merge_request(mr),
            author: Author {
                id: bot,
                on_behalf_of: Some(dev.id),
            },
            body: "This can overflow.".into(),
            internal: false,
            position: Some(Position {
                base_sha: "a".repeat(40),
                start_sha: "b".repeat(40),
                head_sha: "c".repeat(40),
                old_path: "src/math.rs".into(),
                new_path: "src/math.rs".into(),
                position_type: "text".into(),
                old_line: None,
                new_line: Some(42),
            }),
            resolvable: true,
        },
    )
    .await
    .unwrap();
    discussions::resolve(
        &*db,
        Noteable::merge_request(mr),
        &thread.discussion_id,
        true,
        dev.id,
    )
    .await
    .unwrap();
    let issue_thread = discussions::start(
        &*db,
        NewThreadNote {
            noteable: Noteable::issue(issue),
            author: Author {
                id: dev.id,
                on_behalf_of: None,
            },
            body: "Thread on the issue".into(),
            internal: false,
            position: None,
            resolvable: false,
        },
    )
    .await
    .unwrap();
    discussions::reply(
        &*db,
        Noteable::issue(issue),
        &issue_thread.discussion_id,
        Author {
            id: reporter.id,
            on_behalf_of: None,
        },
        "A reply on the issue",
    )
    .await
    .unwrap();
    let server = Server::start(&fx).await;
    let page_url = server.url("/acme/api/-/merge_requests/1");
    let action = "/acme/api/-/merge_requests/1/duo_review";

    // Reporters see the reviewers and the threads, not the button.
    let reporter_browser = browser();
    sign_in(
        &reporter_browser,
        &server,
        "reporter",
        "correct horse battery",
    )
    .await;
    let html = reporter_browser
        .get(page_url.clone())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("No reviewers."), "{html}");
    assert!(!html.contains("Request review from GitLab Duo"));
    assert!(
        html.contains("<code class=\"diff-position\">src/math.rs:42</code>"),
        "{html}"
    );
    assert!(html.contains("class=\"thread resolved\""), "{html}");
    assert!(html.contains("This can overflow."));
    let csrf = token_in(&html, "name=\"csrf-token\"");
    let res = reporter_browser
        .post(server.url(action))
        .form(&[("authenticity_token", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403, "a reporter may not set reviewers");
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("cannot set the reviewers")
    );

    // A developer asks; the form needs its token.
    let dev_browser = browser();
    sign_in(&dev_browser, &server, "dev", "correct horse battery").await;
    let html = dev_browser
        .get(page_url.clone())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("Request review from GitLab Duo"), "{html}");
    let csrf = token_in(&html, &format!("action=\"{action}\""));
    let res = dev_browser
        .post(server.url(action))
        .form(&[("authenticity_token", "forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    assert!(pending_jobs(&fx, "duo_code_review").await.is_empty());
    let res = dev_browser
        .post(server.url(action))
        .form(&[("authenticity_token", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(res.headers()["location"], "/acme/api/-/merge_requests/1");
    assert_eq!(
        pending_jobs(&fx, "duo_code_review").await,
        vec![serde_json::json!({
            "project_id": project, "merge_request_iid": 1, "requester_id": dev.id,
            "trigger": "reviewer_assigned",
        })]
    );
    let html = dev_browser
        .get(page_url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("<strong>GitLab Duo</strong>"), "{html}");
    assert!(html.contains("unreviewed"));

    // The issue page lists its thread with the reply inside.
    let html = dev_browser
        .get(server.url("/acme/api/-/issues/1"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let thread_at = html.find("class=\"thread\"").expect("a thread");
    let reply_at = html.find("A reply on the issue").expect("the reply");
    assert!(thread_at < reply_at);
    assert!(!html.contains("resolved"), "issue threads do not resolve");
}
