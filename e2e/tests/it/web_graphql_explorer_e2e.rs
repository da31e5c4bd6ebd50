//! The GraphQL explorer in a real browser: a query with variables runs
//! against `/api/graphql` (Ctrl+Enter) and the answer is pretty-printed,
//! invalid variables are caught before sending, the schema browser opens a
//! type's fields, the history keeps the query across a reload, and the page's
//! request without the CSRF token is refused. Screenshot: `graphql-explorer`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::web_support::signed_in;
use e2e_tests::System;
use e2e_tests::browser::Browser;
use serde_json::json;

const QUERY: &str = "query explorerTest($typeName: String!) {\n  currentUser {\n    username\n  }\n  __type(name: $typeName) {\n    name\n    kind\n  }\n}\n";

async fn open_explorer(browser: &Browser, system: &System) {
    browser
        .goto(&format!("{}/-/graphql-explorer", system.web_url))
        .await
        .unwrap();
    browser
        .until(
            "the schema's types",
            "return document.querySelectorAll('#types li').length",
        )
        .await
        .unwrap();
}

/// Replaces an editor's text (typing a whole query key by key is slow and
/// the editor indents on Tab).
async fn set_editor(browser: &Browser, id: &str, text: &str) {
    browser
        .js(
            "document.getElementById(arguments[0]).value = arguments[1]",
            vec![json!(id), json!(text)],
        )
        .await
        .unwrap();
}

/// Waits for a run to finish after `since` (the result's `data-done` stamp).
async fn result_after(browser: &Browser, since: &str) -> (String, String) {
    browser
        .until(
            "the result",
            &format!("const r = document.getElementById('result'); return (r.dataset.done ?? '') !== {since:?}"),
        )
        .await
        .unwrap();
    (
        browser.text("#result-status").await.unwrap(),
        browser.text("#result").await.unwrap(),
    )
}

async fn done_stamp(browser: &Browser) -> String {
    browser
        .js(
            "return document.getElementById('result').dataset.done ?? ''",
            vec![],
        )
        .await
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn the_explorer_runs_a_query_and_browses_the_schema() {
    let system = System::start().await.unwrap();
    let browser = signed_in(&system, "alice").await;
    open_explorer(&browser, &system).await;

    // Variables that are not JSON are caught before anything is sent.
    set_editor(&browser, "query", QUERY).await;
    set_editor(&browser, "variables", "{\"typeName\": ").await;
    browser.click("#run").await.unwrap();
    let error = browser
        .until(
            "the variables error",
            "const e = document.getElementById('variables-error'); return !e.hidden && e.textContent",
        )
        .await
        .unwrap();
    assert!(
        error.as_str().unwrap().contains("not valid JSON"),
        "{error}"
    );
    assert_eq!(browser.text("#result").await.unwrap(), "");

    // Valid variables, run with Ctrl+Enter from the editor.
    set_editor(&browser, "variables", "{\"typeName\": \"CurrentUser\"}").await;
    let since = done_stamp(&browser).await;
    browser
        .type_into("#variables", "\u{e009}\u{e007}\u{e000}")
        .await
        .unwrap();
    let (status, result) = result_after(&browser, &since).await;
    assert!(status.starts_with("HTTP 200"), "{status}");
    assert!(!status.contains("errors"), "{status}");
    assert!(result.contains("\"username\": \"alice\""), "{result}");
    assert!(result.contains("\"name\": \"CurrentUser\""), "{result}");
    // Pretty-printed: one field a line, indented.
    assert!(result.contains("\n    \"currentUser\": {"), "{result}");
    let hidden = browser
        .js(
            "return document.getElementById('variables-error').hidden",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(hidden, true);

    // The schema browser: a type's fields with their types and descriptions.
    browser
        .type_into("#type-filter", "CurrentUser")
        .await
        .unwrap();
    browser
        .click("#types li[data-type=CurrentUser] button")
        .await
        .unwrap();
    let fields = browser
        .until(
            "the type's fields",
            "const d = document.getElementById('type-detail'); \
             return d.dataset.type === 'CurrentUser' && [...d.querySelectorAll('li.field')].map((f) => f.dataset.field).join(',')",
        )
        .await
        .unwrap();
    let fields = fields.as_str().unwrap();
    assert!(fields.contains("username"), "{fields}");
    assert!(fields.contains("duoChatAvailable"), "{fields}");
    let field = browser
        .text("#type-detail li.field[data-field=duoChatAvailable] code")
        .await
        .unwrap();
    assert_eq!(field, "duoChatAvailable: Boolean!");
    // The root query type: a field with arguments, its type a link to follow.
    browser.js("const f = document.getElementById('type-filter'); f.value = ''; f.dispatchEvent(new Event('input'))", vec![]).await.unwrap();
    let first = browser.text("#types li:first-child").await.unwrap();
    assert!(first.starts_with("Query"), "the roots come first: {first}");
    browser
        .click("#types li[data-type=Query] button")
        .await
        .unwrap();
    browser
        .until(
            "the query type's fields",
            "return document.querySelector('#type-detail li.field[data-field=aiMessages]')",
        )
        .await
        .unwrap();
    let ai_messages = browser
        .text("#type-detail li.field[data-field=aiMessages] code")
        .await
        .unwrap();
    assert!(ai_messages.starts_with("aiMessages("), "{ai_messages}");
    browser
        .click("#type-detail li.field[data-field=currentUser] .type-link")
        .await
        .unwrap();
    browser
        .until(
            "the followed type",
            "return document.getElementById('type-detail').dataset.type === 'CurrentUser'",
        )
        .await
        .unwrap();
    browser.screenshot("graphql-explorer").await.unwrap();

    // The history keeps the query in this browser, across a reload.
    open_explorer(&browser, &system).await;
    browser.click("#history-box summary").await.unwrap();
    let entry = browser.text("#history li button").await.unwrap();
    assert_eq!(entry, "query explorerTest($typeName: String!) {");
    browser.click("#history li button").await.unwrap();
    let (query, variables) = (
        browser
            .js("return document.getElementById('query').value", vec![])
            .await
            .unwrap(),
        browser
            .js("return document.getElementById('variables').value", vec![])
            .await
            .unwrap(),
    );
    assert_eq!(query, QUERY);
    assert_eq!(variables, "{\"typeName\": \"CurrentUser\"}");

    // Tab indents in the editor instead of leaving it.
    set_editor(&browser, "query", "").await;
    browser.type_into("#query", "a\u{e004}b").await.unwrap();
    let value = browser
        .js("return document.getElementById('query').value", vec![])
        .await
        .unwrap();
    assert_eq!(value, "a  b");
}

#[tokio::test]
async fn the_explorer_s_request_without_the_csrf_token_is_refused() {
    let system = System::start().await.unwrap();
    let browser = signed_in(&system, "alice").await;
    open_explorer(&browser, &system).await;
    // With the token (what the page sends), the session's query runs.
    let since = done_stamp(&browser).await;
    browser.click("#run").await.unwrap();
    let (status, result) = result_after(&browser, &since).await;
    assert!(status.starts_with("HTTP 200"), "{status}");
    assert!(result.contains("\"username\": \"alice\""), "{result}");
    // Without it (the page's token gone), the same request is refused.
    browser
        .js(
            "document.querySelector('meta[name=\"csrf-token\"]').remove()",
            vec![],
        )
        .await
        .unwrap();
    let since = done_stamp(&browser).await;
    browser.click("#run").await.unwrap();
    let (status, result) = result_after(&browser, &since).await;
    assert!(status.starts_with("HTTP 403"), "{status}");
    assert!(result.contains("CSRF"), "{result}");
    assert!(!result.contains("alice"), "{result}");
}
