//! Duo Code Review and mentions end to end: real git pushes to the
//! monolith, GitLab's REST API (reviewers, notes, discussions), the worker
//! running the review and mention jobs, the gateway's review prompt, and
//! the fake provider scripting the model's `<review>` answers.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::fixtures::{Scratch, git, project_id};
use e2e_tests::System;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

fn write(dir: &Path, path: &str, text: &str) {
    let file = dir.join(path);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(file, text).unwrap();
}

async fn call(
    system: &System,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Value {
    let (status, answer) = system.rest(token, method, path, body).await.unwrap();
    assert!((200..300).contains(&status), "{path}: {status} {answer}");
    answer
}

/// Polls `path` until `done` holds for its answer (the worker runs jobs in
/// the background), up to a minute.
async fn wait_for(
    system: &System,
    token: &str,
    path: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answer = call(system, token, reqwest::Method::GET, path, None).await;
        if done(&answer) {
            return answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} never got there: {answer:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn bot_notes(notes: &Value, containing: &str) -> usize {
    notes
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| {
            n["author"]["username"] == "GitLabDuo"
                && n["body"].as_str().unwrap().contains(containing)
        })
        .count()
}

#[tokio::test]
async fn the_bot_reviews_on_changed_lines_follows_up_refuses_without_access_and_answers_mentions() {
    let system = System::start().await.unwrap();
    let alice = system.token("alice").unwrap();
    let bob = system.token("bob").unwrap();
    let id = project_id(&system, &alice, "acme/platform/api").await;
    let bot = call(
        &system,
        &alice,
        reqwest::Method::GET,
        "/users?username=GitLabDuo",
        None,
    )
    .await;
    let bot_id = bot[0]["id"].as_i64().unwrap();
    assert_eq!(bot[0]["bot"], true);

    // Review instructions on the target branch, then a branch with a defect.
    let scratch = Scratch::new("code-review-e2e");
    let dir = scratch.path();
    let url = system
        .web_url
        .replacen("://", &format!("://alice:{alice}@"), 1);
    git(
        dir,
        &[
            "clone",
            "-q",
            &format!("{url}/acme/platform/api.git"),
            "api",
        ],
    );
    let checkout = dir.join("api");
    git(&checkout, &["config", "user.name", "Alice Owner"]);
    git(&checkout, &["config", "user.email", "alice@example.com"]);
    write(
        &checkout,
        ".gitlab/duo/mr-review-instructions.yaml",
        "instructions:\n  - name: Python safety\n    fileFilters: [\"**/*.py\", \"!tests/**\"]\n    instructions: Every division must guard against zero.\n",
    );
    git(&checkout, &["add", "."]);
    git(&checkout, &["commit", "-q", "-m", "Review instructions"]);
    git(&checkout, &["push", "-q", "origin", "HEAD:main"]);
    let base = git(&checkout, &["rev-parse", "HEAD"]).trim().to_owned();
    git(&checkout, &["checkout", "-q", "-b", "average"]);
    write(
        &checkout,
        "app/stats.py",
        "def average(values):\n    total = sum(values)\n    return total / len(values)\n",
    );
    write(
        &checkout,
        "tests/test_stats.py",
        "from app.stats import average\n\n\ndef test_one():\n    assert average([2]) == 2\n",
    );
    git(&checkout, &["add", "."]);
    git(&checkout, &["commit", "-q", "-m", "Average"]);
    git(&checkout, &["push", "-q", "origin", "average"]);
    let head = git(&checkout, &["rev-parse", "HEAD"]).trim().to_owned();
    let mr = call(
        &system,
        &alice,
        reqwest::Method::POST,
        &format!("/projects/{id}/merge_requests"),
        Some(json!({"source_branch": "average", "target_branch": "main", "title": "Add average"})),
    )
    .await;
    let iid = mr["iid"].as_i64().unwrap();
    let notes_path = format!("/projects/{id}/merge_requests/{iid}/notes?per_page=100");
    let discussions_path = format!("/projects/{id}/merge_requests/{iid}/discussions?per_page=100");

    // 1. Assigning the bot starts a review; the model's comments land on
    //    diff lines only.
    let before = system.provider_bodies().len();
    system.fake.push_text(
        "<review>\n<comment file=\"app/stats.py\" priority=\"3\" old_line=\"\" new_line=\"3\">\nDividing by `len(values)` fails for an empty list; return 0 first.\n</comment>\n<comment file=\"app/stats.py\" priority=\"2\" new_line=\"40\">Not a line of the diff.</comment>\n</review>",
    );
    system.fake.push_text("<review></review>");
    let updated = call(
        &system,
        &alice,
        reqwest::Method::PUT,
        &format!("/projects/{id}/merge_requests/{iid}"),
        Some(json!({"reviewer_ids": [bot_id]})),
    )
    .await;
    assert_eq!(updated["reviewers"][0]["username"], "GitLabDuo");
    let notes = wait_for(&system, &alice, &notes_path, |n| {
        bot_notes(n, "I reviewed") == 1
    })
    .await;
    let summary = notes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["body"].as_str().unwrap().contains("I reviewed"))
        .unwrap()["body"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(summary.starts_with("@alice"), "{summary}");
    assert!(summary.contains("Files reviewed: 2"), "{summary}");
    assert!(
        summary.contains("New comments: 1 (1 to fix before merging)"),
        "{summary}"
    );
    assert!(
        summary.contains("Review instructions applied: Python safety"),
        "{summary}"
    );
    let discussions = call(
        &system,
        &alice,
        reqwest::Method::GET,
        &discussions_path,
        None,
    )
    .await;
    let diff_threads: Vec<&Value> = discussions
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["notes"][0]["type"] == "DiffNote")
        .collect();
    assert_eq!(diff_threads.len(), 1, "{discussions:#}");
    let note = &diff_threads[0]["notes"][0];
    assert_eq!(note["author"]["username"], "GitLabDuo");
    assert_eq!(note["position"]["new_path"], "app/stats.py");
    assert_eq!(note["position"]["new_line"], 3);
    assert_eq!(note["position"]["head_sha"], head);
    assert_eq!(note["position"]["base_sha"], base);
    assert_eq!(note["position"]["position_type"], "text");
    assert_eq!(note["resolvable"], true);
    assert_eq!(note["resolved"], false);
    // One model call per file; instructions only where their globs say.
    let bodies = &system.provider_bodies()[before..];
    assert_eq!(bodies.len(), 2);
    let stats = bodies
        .iter()
        .find(|b| b.contains("`app/stats.py`"))
        .unwrap();
    let tests = bodies
        .iter()
        .find(|b| b.contains("`tests/test_stats.py`"))
        .unwrap();
    assert!(stats.contains("Every division must guard against zero."));
    assert!(
        !tests.contains("Every division must guard against zero."),
        "excluded by !tests/**"
    );

    // A reply in the bot's thread is answered there, no mention needed.
    let thread_id = diff_threads[0]["id"].as_str().unwrap().to_owned();
    system.fake.push_text(
        "Thought: I can answer from my comment.\nFinal Answer: An empty list has length zero, so the division raises ZeroDivisionError.",
    );
    call(
        &system,
        &alice,
        reqwest::Method::POST,
        &format!("/projects/{id}/merge_requests/{iid}/discussions/{thread_id}/notes"),
        Some(json!({"body": "Why is that a problem?"})),
    )
    .await;
    let thread = wait_for(
        &system,
        &alice,
        &format!("/projects/{id}/merge_requests/{iid}/discussions/{thread_id}"),
        |d| d["notes"].as_array().is_some_and(|n| n.len() == 3),
    )
    .await;
    assert_eq!(thread["notes"][2]["author"]["username"], "GitLabDuo");
    assert!(
        thread["notes"][2]["body"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError")
    );
    let asked = system.provider_bodies().last().unwrap().clone();
    assert!(
        asked.contains("Why is that a problem?") && asked.contains("return 0 first"),
        "the thread is the context"
    );

    // A reply that dismisses the comment is answered and teaches the bot.
    system
        .fake
        .push_text("Thought: noted.\nFinal Answer: Understood, the list is never empty there.");
    call(
        &system,
        &alice,
        reqwest::Method::POST,
        &format!("/projects/{id}/merge_requests/{iid}/discussions/{thread_id}/notes"),
        Some(
            json!({"body": "False positive: this is intended, callers never pass an empty list."}),
        ),
    )
    .await;
    let thread = wait_for(
        &system,
        &alice,
        &format!("/projects/{id}/merge_requests/{iid}/discussions/{thread_id}"),
        |d| d["notes"].as_array().is_some_and(|n| n.len() == 5),
    )
    .await;
    let answer = thread["notes"][4]["body"].as_str().unwrap();
    assert_eq!(thread["notes"][4]["author"]["username"], "GitLabDuo");
    assert!(
        answer.contains("later reviews of this project will take your reply into account"),
        "{answer}"
    );

    // 2. A push that fixes the line, then "@GitLabDuo review": the thread is
    //    resolved, nothing is said twice.
    git(&checkout, &["checkout", "-q", "average"]);
    write(
        &checkout,
        "app/stats.py",
        "def average(values):\n    total = sum(values)\n    return total / len(values) if values else 0\n",
    );
    git(
        &checkout,
        &["commit", "-q", "-a", "-m", "Guard empty lists"],
    );
    git(&checkout, &["push", "-q", "origin", "average"]);
    system.fake.push_text("<review></review>");
    system.fake.push_text("<review></review>");
    call(
        &system,
        &alice,
        reqwest::Method::POST,
        &format!("/projects/{id}/merge_requests/{iid}/notes"),
        Some(json!({"body": "@GitLabDuo review"})),
    )
    .await;
    let notes = wait_for(&system, &alice, &notes_path, |n| {
        bot_notes(n, "I reviewed") == 2
    })
    .await;
    assert_eq!(
        bot_notes(&notes, "Earlier threads resolved by the new commits: 1"),
        1
    );
    let discussions = call(
        &system,
        &alice,
        reqwest::Method::GET,
        &discussions_path,
        None,
    )
    .await;
    let thread = discussions
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["notes"][0]["type"] == "DiffNote")
        .unwrap();
    assert_eq!(thread["notes"][0]["resolved"], true);
    assert!(
        thread["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["body"].as_str().unwrap().contains("looks addressed"))
    );
    assert_eq!(
        discussions
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["notes"][0]["type"] == "DiffNote")
            .count(),
        1,
        "no new diff notes"
    );

    // 3. Bob's seat has no code review: a note says so and no model is called.
    let before = system.provider_bodies().len();
    call(
        &system,
        &bob,
        reqwest::Method::POST,
        &format!("/projects/{id}/merge_requests/{iid}/notes"),
        Some(json!({"body": "@GitLabDuo review"})),
    )
    .await;
    wait_for(&system, &alice, &notes_path, |n| {
        bot_notes(n, "does not have access") == 1
    })
    .await;
    assert_eq!(system.provider_bodies().len(), before, "no model call");

    // 4. A question in a comment gets an answer in its thread.
    system
        .fake
        .push_text("Thought: I can answer from the merge request.\nFinal Answer: It adds an average that now guards empty lists.");
    let asked = call(
        &system,
        &alice,
        reqwest::Method::POST,
        &format!("/projects/{id}/merge_requests/{iid}/discussions"),
        Some(json!({"body": "@GitLabDuo what does this change do?"})),
    )
    .await;
    let discussion = asked["id"].as_str().unwrap().to_owned();
    let thread = wait_for(
        &system,
        &alice,
        &format!("/projects/{id}/merge_requests/{iid}/discussions/{discussion}"),
        |d| d["notes"].as_array().is_some_and(|n| n.len() == 2),
    )
    .await;
    let reply = &thread["notes"][1];
    assert_eq!(reply["author"]["username"], "GitLabDuo");
    assert!(
        reply["body"]
            .as_str()
            .unwrap()
            .contains("guards empty lists"),
        "{reply:#}"
    );
    assert!(reply["body"].as_str().unwrap().starts_with("@alice"));
}
