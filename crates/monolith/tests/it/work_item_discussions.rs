//! The discussions and reviewers domain as the review job calls it: threads
//! started with and without a position, replies that take their thread's
//! kind, resolution of every note of a thread, and reviewer lists replaced
//! with the newly added ids returned.

use crate::support::Fx;

use monolith::work_items::Author;
use monolith::work_items::discussions::{self, NewThreadNote, Noteable, Position};
use monolith::work_items::{notes, reviewers};

fn position(line: i32) -> Position {
    Position {
        base_sha: "a".repeat(40),
        start_sha: "b".repeat(40),
        head_sha: "c".repeat(40),
        old_path: "src/lib.rs".into(),
        new_path: "src/lib.rs".into(),
        position_type: "text".into(),
        old_line: None,
        new_line: Some(line),
    }
}

fn by(id: i64) -> Author {
    Author {
        id,
        on_behalf_of: None,
    }
}

#[tokio::test]
async fn threads_replies_and_resolution() {
    let fx = Fx::new().await;
    let dev = fx.user("dev").await;
    let group = fx.group(None, "acme", "private", "free").await;
    let project = fx.project(group, "api", "private").await;
    let mr = Noteable::merge_request(fx.merge_request(project, dev).await);
    let issue = Noteable::issue(fx.issue(project, dev, false).await);
    let db = fx.pool.get().await.unwrap();

    let plain = fx.note("MergeRequest", mr.id, dev, false).await;
    let diff = discussions::start(
        &*db,
        NewThreadNote {
            noteable: mr,
            author: by(dev.id),
            body: "Off by one?".into(),
            internal: false,
            position: Some(position(7)),
            resolvable: true,
        },
    )
    .await
    .unwrap();
    assert_eq!(diff.note_type.as_deref(), Some("DiffNote"));
    assert_eq!(diff.position, Some(position(7)));
    assert!(diff.resolvable);
    assert_eq!(diff.discussion_id.len(), 40);

    let reply = discussions::reply(&*db, mr, &diff.discussion_id, by(dev.id), "Yes.")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.discussion_id, diff.discussion_id);
    assert_eq!(reply.note_type.as_deref(), Some("DiffNote"));
    assert_eq!(reply.position, Some(position(7)), "a reply keeps the line");
    assert!(reply.resolvable);
    // Not on another item.
    assert!(
        discussions::reply(&*db, issue, &diff.discussion_id, by(dev.id), "x")
            .await
            .unwrap()
            .is_none()
    );

    let resolved = discussions::resolve(&*db, mr, &diff.discussion_id, true, dev.id)
        .await
        .unwrap()
        .unwrap();
    assert!(resolved.resolved());
    assert!(
        resolved
            .notes
            .iter()
            .all(|n| n.resolved_by.as_ref().map(|u| u.id) == Some(dev.id))
    );
    let reopened = discussions::resolve(&*db, mr, &diff.discussion_id, false, dev.id)
        .await
        .unwrap()
        .unwrap();
    assert!(!reopened.resolved());
    assert!(reopened.notes.iter().all(|n| n.resolved_at.is_none()));

    // A plain comment is its own discussion until someone replies.
    let list = discussions::list(&*db, mr).await.unwrap();
    assert_eq!(list.len(), 2);
    assert!(list[0].individual_note);
    assert_eq!(list[0].notes[0].id, plain);
    assert!(!list[0].resolvable());
    assert!(
        discussions::resolve(&*db, mr, &list[0].id, true, dev.id)
            .await
            .is_err()
    );
    assert_eq!(list[1].notes.len(), 2);
    discussions::reply(&*db, mr, &list[0].id, by(dev.id), "Agreed")
        .await
        .unwrap()
        .unwrap();
    let thread = discussions::find(&*db, mr, &list[0].id)
        .await
        .unwrap()
        .unwrap();
    assert!(!thread.individual_note);
    assert!(thread.resolvable(), "a thread on a merge request resolves");
    assert!(
        thread
            .notes
            .iter()
            .all(|n| n.note_type.as_deref() == Some("DiscussionNote"))
    );

    // Issue threads do not resolve; internal ones stay internal.
    let internal = discussions::start(
        &*db,
        NewThreadNote {
            noteable: issue,
            author: by(dev.id),
            body: "Internal".into(),
            internal: true,
            position: None,
            resolvable: true,
        },
    )
    .await
    .unwrap();
    assert!(!internal.resolvable);
    let reply = discussions::reply(&*db, issue, &internal.discussion_id, by(dev.id), "ok")
        .await
        .unwrap()
        .unwrap();
    assert!(reply.internal);
    // The notes list still reads every note.
    let all = notes::list(
        &*db,
        monolith::work_items::Kind::MergeRequest,
        mr.id,
        monolith::work_items::SortOrder::Asc,
    )
    .await
    .unwrap();
    assert_eq!(all.len(), 4);
}

#[tokio::test]
async fn reviewer_lists_are_replaced_and_states_set() {
    let fx = Fx::new().await;
    let [a, b, c] = [fx.user("a").await, fx.user("b").await, fx.user("c").await];
    let group = fx.group(None, "acme", "private", "free").await;
    let project = fx.project(group, "api", "private").await;
    let mr = fx.merge_request(project, a).await;
    let db = fx.pool.get().await.unwrap();

    let added = reviewers::set(&*db, mr, &[b.id, c.id, b.id]).await.unwrap();
    assert_eq!(added, vec![b.id, c.id]);
    assert!(
        reviewers::set_state(&*db, mr, b.id, "reviewed")
            .await
            .unwrap()
    );
    let added = reviewers::set(&*db, mr, &[a.id, b.id]).await.unwrap();
    assert_eq!(added, vec![a.id], "b stays, c goes");
    let list = reviewers::list(&*db, mr).await.unwrap();
    let states: Vec<(&str, &str)> = list
        .iter()
        .map(|r| (r.user.username.as_str(), r.state.as_str()))
        .collect();
    assert_eq!(states, vec![("b", "reviewed"), ("a", "unreviewed")]);
    assert!(
        !reviewers::set_state(&*db, mr, c.id, "reviewed")
            .await
            .unwrap()
    );
    assert!(
        reviewers::set_state(&*db, mr, a.id, "nonsense")
            .await
            .is_err()
    );
    reviewers::request(&*db, mr, b.id).await.unwrap();
    assert_eq!(
        reviewers::list(&*db, mr).await.unwrap()[0].state,
        "unreviewed"
    );
    assert!(reviewers::set(&*db, mr, &[i64::MAX]).await.is_err());
    assert!(reviewers::set(&*db, mr, &[]).await.unwrap().is_empty());
    assert!(reviewers::list(&*db, mr).await.unwrap().is_empty());
}
