//! `file` context items without content (what the web pages' "Ask Duo about
//! this file" sends): the agent reads the file from the repository only when
//! the policy lets the user send that project's code to AI, with the real
//! gateway and the fake provider.

use contracts::{AdditionalContext, DuoErrorCode};
use monolith::chat::CompletionJob;
use monolith::repositories::writer::{self, CommitRequest, FileAction, Signature};
use serde_json::json;
use uuid::Uuid;

use crate::agent_support::{Answered, Bench, gid};

async fn commit_file(bench: &Bench, project: i64, file: &str, content: &str) {
    let path = bench.repositories().ensure(project, "main").await.unwrap();
    writer::commit(
        &path,
        &CommitRequest {
            branch: "main".into(),
            start: None,
            message: "Add a file".into(),
            author: Signature {
                name: "Dev".into(),
                email: "dev@example.com".into(),
                when: None,
            },
            actions: vec![FileAction::Upsert {
                path: file.into(),
                content: content.as_bytes().to_vec(),
            }],
        },
    )
    .await
    .unwrap();
}

fn file_item(project: i64, path: &str, content: &str) -> AdditionalContext {
    serde_json::from_value(json!({
        "category": "file",
        "id": format!("http://localhost/x/-/blob/main/{path}"),
        "content": content,
        "metadata": {"projectId": gid("Project", project), "relativePath": path, "ref": "main"},
    }))
    .unwrap()
}

async fn ask_about(
    bench: &Bench,
    user: monolith::policy::Actor,
    item: AdditionalContext,
) -> Answered {
    let thread_id = bench
        .fx
        .id(
            "INSERT INTO ai_conversation_threads (user_id, conversation_type) VALUES ($1, 1) RETURNING id",
            &[&user.id],
        )
        .await;
    let request_id = Uuid::new_v4();
    let content = "What does this file do?";
    bench
        .fx
        .exec(
            "INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid)
             VALUES ($1, 1, $2, $3, $4)",
            &[&thread_id, &content, &Uuid::new_v4(), &request_id],
        )
        .await;
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let answer = bench
        .responder_ref()
        .answer(
            &CompletionJob {
                request_id,
                user_id: user.id,
                thread_id,
                content: content.into(),
                resource_id: None,
                current_file: None,
                additional_context: vec![item],
                ..Default::default()
            },
            tx.into(),
        )
        .await
        .expect("no transient failure");
    Answered {
        answer,
        chunks: Vec::new(),
        tools: Vec::new(),
    }
}

#[tokio::test]
async fn a_named_file_is_read_for_the_prompt_only_when_the_user_may_send_it() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    commit_file(
        &bench,
        world.project,
        "src/limit.rs",
        "// FILE_MARKER\npub fn limit() {}\n",
    )
    .await;
    bench
        .fake
        .push_text(" I know.\nFinal Answer: It limits requests.");
    let answered = ask_about(
        &bench,
        world.user,
        file_item(world.project, "src/limit.rs", ""),
    )
    .await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), 1);
    assert!(bodies[0].contains("FILE_MARKER"), "{}", bodies[0]);

    // An editor's file arrives with its content: kept as sent.
    bench.fake.push_text(" I know.\nFinal Answer: Sent text.");
    let answered = ask_about(
        &bench,
        world.user,
        file_item(world.project, "src/limit.rs", "EDITOR_TEXT"),
    )
    .await;
    assert_eq!(answered.answer.error, None);
    let last = bench.provider_bodies().pop().unwrap();
    assert!(last.contains("EDITOR_TEXT") && !last.contains("FILE_MARKER"));

    // A project the user is not a member of, a missing file, and a project
    // with Duo turned off: refused before the model is asked, nothing read.
    let secret = bench.fx.project(world.group, "secret", "private").await;
    commit_file(&bench, secret, "s.rs", "// SECRET_MARKER\n").await;
    let quiet = bench.fx.project(world.group, "quiet", "private").await;
    bench.fx.project_member(quiet, world.user, 30).await;
    bench.fx.project_duo(quiet, false).await;
    commit_file(&bench, quiet, "q.rs", "// QUIET_MARKER\n").await;
    let before = bench.provider_bodies().len();
    for item in [
        file_item(secret, "s.rs", ""),
        file_item(world.project, "src/missing.rs", ""),
        file_item(quiet, "q.rs", ""),
    ] {
        let answered = ask_about(&bench, world.user, item).await;
        assert_eq!(
            answered.answer.error.as_ref().map(|e| e.code),
            Some(DuoErrorCode::M3003),
            "{:?}",
            answered.answer
        );
    }
    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), before);
    assert!(
        bodies
            .iter()
            .all(|b| !b.contains("SECRET_MARKER") && !b.contains("QUIET_MARKER"))
    );
}
