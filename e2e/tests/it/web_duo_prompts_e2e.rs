//! Predefined questions in a real browser: "Explain this job failure" on a
//! failed CI job's page and "Summarize comments" on an issue open the chat,
//! which sends the question with the item as its resource; the (fake)
//! model's answer shows, and what the model received is about that item.
//! Screenshots: `job`, `chat-explain-job`, `issue-summarize`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::web_support::{chat_is_live, signed_in};
use e2e_tests::System;
use e2e_tests::browser::Browser;

/// Waits for the finished answer and returns its text.
async fn finished_answer(browser: &Browser, expected: &str) -> String {
    browser
        .until(
            "the finished answer",
            &format!(
                "const b = document.querySelector('.message.assistant .body:not(.streaming)'); \
                 return b && b.textContent.includes({expected:?}) ? b.textContent : null"
            ),
        )
        .await
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn explain_this_job_failure_asks_about_the_failed_job() {
    let system = System::start().await.unwrap();
    system
        .fake
        .set_default_text("The session refresh spec gets a 500 instead of a 200.");
    let job: i64 = system
        .db
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT id FROM ci_builds WHERE name = 'rspec' AND status = 'failed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let browser = signed_in(&system, "alice").await;
    browser
        .goto(&format!(
            "{}/acme/platform/api/-/jobs/{job}",
            system.web_url
        ))
        .await
        .unwrap();
    let trace = browser.text("#trace").await.unwrap();
    assert!(trace.contains("ERROR: Job failed: exit code 1"), "{trace}");
    let link = browser.text("a.duo-prompt").await.unwrap();
    assert_eq!(link, "Explain this job failure");
    browser.screenshot("job").await.unwrap();

    browser.click("a.duo-prompt").await.unwrap();
    chat_is_live(&browser).await;
    let answer = finished_answer(&browser, "500 instead of a 200").await;
    assert!(answer.contains("session refresh"), "{answer}");
    assert_eq!(
        browser.text(".message.user").await.unwrap(),
        "/troubleshoot"
    );
    let attached = browser.text("#attached").await.unwrap();
    assert!(attached.contains(&format!("rspec (#{job})")), "{attached}");
    // Sent once: the address is now the thread's, so a reload asks nothing.
    let url = browser.client.current_url().await.unwrap();
    assert!(url.query().unwrap_or("").starts_with("thread="), "{url}");
    browser.screenshot("chat-explain-job").await.unwrap();

    // The job's log reached the model as the chat's resource.
    let bodies = system.provider_bodies();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert!(
        bodies[0].contains("expected 200, got 500"),
        "the job log never reached the model: {bodies:?}"
    );
}

#[tokio::test]
async fn summarize_comments_asks_about_the_issue() {
    let system = System::start().await.unwrap();
    system
        .fake
        .set_default_text("Two comments: it reproduces on staging; the middleware is the cause.");
    let browser = signed_in(&system, "alice").await;
    browser
        .goto(&format!("{}/acme/platform/api/-/issues/1", system.web_url))
        .await
        .unwrap();
    let link = browser.text("a.duo-prompt").await.unwrap();
    assert_eq!(link, "Summarize comments");
    browser.screenshot("issue-summarize").await.unwrap();

    browser.click("a.duo-prompt").await.unwrap();
    chat_is_live(&browser).await;
    finished_answer(&browser, "the middleware is the cause").await;
    assert_eq!(
        browser.text(".message.user").await.unwrap(),
        "/summarize_comments"
    );
    let bodies = system.provider_bodies();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert!(
        bodies[0].contains("Root cause is in the session middleware.")
            && bodies[0].contains("I can reproduce this on staging."),
        "the issue's comments never reached the model: {bodies:?}"
    );
}
