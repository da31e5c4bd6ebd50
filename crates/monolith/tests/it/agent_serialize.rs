//! What the model sees of a resource: the serialised forms tools and the page
//! context send, pinned by snapshots.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on setup errors"
)]

use crate::support;

use monolith::policy::Subject;
use monolith::work_items::ai_serialization::{MAX_TEXT_CHARS, serialize_for_ai};

#[tokio::test]
async fn issue_and_merge_request_serialisation() {
    let fx = support::Fx::new().await;
    let author = fx.user("ada").await;
    let group = fx.group(None, "gl", "private", "ultimate").await;
    let project = fx.project(group, "app", "private").await;
    let issue = fx
        .id(
            "INSERT INTO issues (project_id, iid, title, description, author_id, labels, created_at)
             VALUES ($1, 3, 'Crash <on> start', $2, $3, '{bug,p1}', '2026-01-02T03:04:05Z') RETURNING id",
            &[&project, &"It crashes & burns.", &author.id],
        )
        .await;
    let long = "d".repeat(MAX_TEXT_CHARS + 10);
    let mr = fx
        .id(
            "INSERT INTO merge_requests (project_id, iid, title, description, author_id, source_branch, diff)
             VALUES ($1, 7, 'Fix crash', 'Closes #3', $2, 'fix-crash', $3) RETURNING id",
            &[&project, &author.id, &long],
        )
        .await;
    let db = fx.pool.get().await.unwrap();
    let base = url::Url::parse("https://gitlab.example.com/").unwrap();

    let issue = serialize_for_ai(&**db, Subject::Issue(issue), &base)
        .await
        .unwrap()
        .unwrap();
    let mr = serialize_for_ai(&**db, Subject::MergeRequest(mr), &base)
        .await
        .unwrap()
        .unwrap();
    let missing = serialize_for_ai(&**db, Subject::Issue(999_999), &base)
        .await
        .unwrap();

    insta::assert_snapshot!("issue", issue.content);
    assert!(mr.content.contains("[truncated]"));
    assert!(mr.content.chars().count() < MAX_TEXT_CHARS + 1_000);
    insta::assert_snapshot!(
        "merge_request_head",
        mr.content.lines().take(9).collect::<Vec<_>>().join("\n")
    );
    assert_eq!(missing, None);
}
