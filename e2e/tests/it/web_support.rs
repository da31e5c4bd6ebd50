//! What the browser tests share: a signed-in browser, the chat page with its
//! live subscription, asking a question.

use e2e_tests::System;
use e2e_tests::browser::Browser;

/// A browser signed in as a seeded user.
pub async fn signed_in(system: &System, user: &str) -> Browser {
    let browser = Browser::start().await.unwrap();
    browser
        .sign_in(&system.web_url, user, &system.password(user).unwrap())
        .await
        .unwrap();
    browser
}

/// Waits until the chat page's subscription is live.
pub async fn chat_is_live(browser: &Browser) {
    browser
        .until(
            "the live subscription",
            "return document.body.dataset.live === 'true'",
        )
        .await
        .unwrap();
}

/// Opens the chat page and waits for its subscription.
pub async fn open_chat(browser: &Browser, system: &System) {
    browser
        .goto(&format!("{}/-/chat", system.web_url))
        .await
        .unwrap();
    chat_is_live(browser).await;
}

/// Types a question and sends it.
pub async fn ask(browser: &Browser, question: &str) {
    browser.type_into("#question", question).await.unwrap();
    browser.click("#send").await.unwrap();
}
