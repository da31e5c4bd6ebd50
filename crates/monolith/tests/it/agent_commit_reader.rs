//! `commit_reader` end to end: the agent loop, the real gateway and the fake
//! provider, over a real repository; and the refusals that keep a commit the
//! user may not read out of every prompt.

use contracts::DuoErrorCode;
use monolith::repositories::writer::{self, CommitRequest, FileAction, Signature};

use crate::agent_support::{Bench, gid};

fn action(tool: &str, input: &str) -> String {
    format!(" I should read that commit.\nAction: {tool}\nAction Input: {input}")
}

fn final_answer(text: &str) -> String {
    format!(" I know now.\nFinal Answer: {text}")
}

/// One commit on `main` of the project's repository; its id.
async fn commit(bench: &Bench, project: i64, title: &str, file: &str, content: &str) -> String {
    let repos = bench.repositories();
    let path = repos.ensure(project, "main").await.unwrap();
    writer::commit(
        &path,
        &CommitRequest {
            branch: "main".into(),
            start: None,
            message: format!("{title}\n\nWhy it changed."),
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
    .unwrap()
    .commit_id
}

#[tokio::test]
async fn a_commit_named_by_id_and_project_or_by_link_reaches_the_model() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    commit(&bench, world.project, "Start", "README.md", "hello\n").await;
    let sha = commit(
        &bench,
        world.project,
        "Add a rate limiter",
        "src/limit.rs",
        "// LIMITER_MARKER\npub fn limit() {}\n",
    )
    .await;

    let question = format!("What does commit {} in gl/app change?", &sha[..8]);
    bench.fake.push_text(action("commit_reader", &question));
    bench
        .fake
        .push_text(final_answer("It adds a rate limiter."));
    let answered = bench.ask(world.user, &question, None).await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let bodies = bench.provider_bodies();
    // No identifier prompt was needed; the observation carries the commit.
    assert_eq!(bodies.len(), 2);
    assert!(bodies[1].contains("LIMITER_MARKER"), "{}", bodies[1]);
    assert!(bodies[1].contains("Add a rate limiter"));
    assert!(bodies[1].contains("additions"), "{}", bodies[1]);

    let link = format!("{}/gl/app/-/commit/{sha}", bench.external_url);
    bench.fake.push_text(action("commit_reader", &link));
    bench.fake.push_text(final_answer("Same commit."));
    let answered = bench
        .ask(world.user, &format!("Explain {link}"), None)
        .await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let bodies = bench.provider_bodies();
    assert!(bodies[3].contains("LIMITER_MARKER"));

    // An id alone is read in the project of the page the user is on.
    bench.fake.push_text(action(
        "commit_reader",
        &format!("what changed in {}", &sha[..10]),
    ));
    bench.fake.push_text(final_answer("Still the limiter."));
    let answered = bench
        .ask(
            world.user,
            "what changed here?",
            Some(gid("Project", world.project)),
        )
        .await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    assert!(bench.provider_bodies()[5].contains("LIMITER_MARKER"));
}

#[tokio::test]
async fn a_commit_the_user_may_not_read_never_reaches_a_prompt() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    // A private project of the same group the user is not a member of, and one
    // where they are only a guest (they see the project, not its code).
    let secret = bench.fx.project(world.group, "secret", "private").await;
    let guarded = bench.fx.project(world.group, "guarded", "private").await;
    bench.fx.project_member(guarded, world.user, 10).await;
    let hidden = commit(&bench, secret, "Secret work", "s.txt", "SECRET_MARKER\n").await;
    let guest_only = commit(&bench, guarded, "Guarded work", "g.txt", "GUARDED_MARKER\n").await;

    for (project, sha) in [("gl/secret", &hidden), ("gl/guarded", &guest_only)] {
        let question = format!("What does commit {} in {project} change?", &sha[..8]);
        let before = bench.provider_bodies().len();
        bench.fake.push_text(action("commit_reader", &question));
        let answered = bench.ask(world.user, &question, None).await;
        assert_eq!(
            answered.answer.error.as_ref().map(|e| e.code),
            Some(DuoErrorCode::M3003),
            "{project}"
        );
        let bodies = bench.provider_bodies();
        // Only the agent's first step reached the model; no content leaked.
        assert_eq!(bodies.len(), before + 1, "{project}");
        assert!(
            bodies
                .iter()
                .all(|b| !b.contains("SECRET_MARKER") && !b.contains("GUARDED_MARKER"))
        );
    }

    // A commit that does not exist answers exactly the same way.
    let question = "What does commit abcdef1234 in gl/app change?";
    bench.fake.push_text(action("commit_reader", question));
    let answered = bench.ask(world.user, question, None).await;
    assert_eq!(
        answered.answer.error.as_ref().map(|e| e.code),
        Some(DuoErrorCode::M3003)
    );
}
