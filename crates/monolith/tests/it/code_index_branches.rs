//! Codebase search on branches other than the default (seed 002, phase 2):
//! `metadata.branch` on repository and directory context, indexed on demand
//! by the real job worker, bounded per project, reusing embedded blobs.
//! Real bare repositories, the real gateway over HTTP, the fake provider's
//! embeddings (every call recorded), PostgreSQL with pgvector.

use std::time::Duration;

use contracts::{AdditionalContext, DuoErrorCode};
use monolith::chat::CompletionJob;
use monolith::code_index::IndexState;
use monolith::code_index::branches::{self, BranchIndex};
use monolith::code_index::chat_context::branch_being_indexed;
use monolith::code_index::indexer::{index_branch, index_project};
use monolith::repositories::pushes::{self, RefUpdate};
use monolith::repositories::writer::{self, CommitRequest, FileAction, Signature};
use serde_json::json;
use uuid::Uuid;

use crate::agent_support::{Bench, World};

const BRANCH: &str = "feature/coupons";
/// Only on the branch.
const COUPONS: &str = "src/billing/coupon_codes.rs";
/// Only on the default branch (committed after the branch was cut).
const LEDGER: &str = "src/billing/voucher_ledger.rs";

fn author() -> Signature {
    Signature {
        name: "Dev".into(),
        email: "dev@example.com".into(),
        when: None,
    }
}

fn create(path: &str, content: &str) -> FileAction {
    FileAction::Create {
        path: path.to_owned(),
        content: content.as_bytes().to_vec(),
        executable: false,
    }
}

async fn commit_on(bench: &Bench, project: i64, branch: &str, actions: Vec<FileAction>) -> String {
    let path = bench.repositories().ensure(project, "main").await.unwrap();
    writer::commit(
        &path,
        &CommitRequest {
            branch: branch.into(),
            start: (branch != "main").then(|| "main".into()),
            message: format!("change on {branch}"),
            author: author(),
            actions,
        },
    )
    .await
    .unwrap()
    .commit_id
}

/// `gl/app` with a few files on `main`, `secrets/` excluded from AI, its
/// default branch indexed; then [`BRANCH`] cut from it with [`COUPONS`] and
/// an excluded file, and [`LEDGER`] added to `main` only (indexed too).
async fn seeded(bench: &Bench) -> World {
    let world = bench.world().await;
    let mut files = vec![
        create(
            "src/billing/refund_window.rs",
            "/// Customers may ask for their money back within this many days.\n\
             pub const REFUND_WINDOW_DAYS: u32 = 17;\n",
        ),
        create(
            "src/http/throttle.rs",
            "/// Stops one client from hammering the API.\npub struct Throttle { per_minute: u32 }\n",
        ),
    ];
    for i in 0..4 {
        files.push(create(
            &format!("src/util/helper_{i}.py"),
            &format!("def helper_{i}(value):\n    return str(value) + '{i}'\n"),
        ));
    }
    commit_on(bench, world.project, "main", files).await;
    bench
        .fx
        .exec(
            "UPDATE projects SET duo_context_exclusion_rules = '{secrets/}' WHERE id = $1",
            &[&world.project],
        )
        .await;
    commit_on(
        bench,
        world.project,
        BRANCH,
        vec![
            create(
                COUPONS,
                "/// Voucher coupon codes: a voucher takes PERCENT_OFF off the basket.\n\
                 pub const PERCENT_OFF: u32 = 23;\n",
            ),
            create(
                "secrets/branch.env",
                "VOUCHER_SIGNING_KEY=voucher-hunter3\n",
            ),
        ],
    )
    .await;
    commit_on(
        bench,
        world.project,
        "main",
        vec![create(
            LEDGER,
            "/// The voucher ledger records every voucher redeemed.\npub struct VoucherLedger;\n",
        )],
    )
    .await;
    index_project(&bench.responder.services().code_index, world.project)
        .await
        .unwrap();
    world
}

/// The texts the fake provider was asked to embed, in order.
fn embedded_texts(bench: &Bench) -> Vec<String> {
    bench
        .fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/embeddings"))
        .flat_map(|r| {
            r.body["input"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

async fn ask(
    bench: &Bench,
    world: &World,
    question: &str,
    context: Vec<AdditionalContext>,
) -> monolith::chat::completion::ChatAnswer {
    let thread_id = bench
        .fx
        .id(
            "INSERT INTO ai_conversation_threads (user_id, conversation_type) VALUES ($1, 1) RETURNING id",
            &[&world.user.id],
        )
        .await;
    let request_id = Uuid::new_v4();
    bench
        .fx
        .exec(
            "INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid)
             VALUES ($1, 1, $2, $3, $4)",
            &[&thread_id, &question, &Uuid::new_v4(), &request_id],
        )
        .await;
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    bench
        .responder
        .answer(
            &CompletionJob {
                request_id,
                user_id: world.user.id,
                thread_id,
                content: question.to_owned(),
                additional_context: context,
                ..Default::default()
            },
            tx.into(),
        )
        .await
        .expect("no transient failure")
}

fn repository_item(project: i64, branch: Option<&str>) -> AdditionalContext {
    let mut metadata = json!({"name": "app", "pathWithNamespace": "gl/app"});
    if let Some(branch) = branch {
        metadata["branch"] = json!(branch);
    }
    serde_json::from_value(json!({
        "category": "repository",
        "id": format!("gid://gitlab/Project/{project}"),
        "content": "",
        "metadata": metadata
    }))
    .unwrap()
}

fn directory_item(project: i64, dir: &str, branch: &str) -> AdditionalContext {
    serde_json::from_value(json!({
        "category": "directory",
        "id": format!("dir:///gl/app/{dir}"),
        "content": "",
        "metadata": {"relativePath": dir, "projectId": format!("gid://gitlab/Project/{project}"),
            "branch": branch}
    }))
    .unwrap()
}

async fn branch_row(bench: &Bench, project: i64, branch: &str) -> Option<BranchIndex> {
    let db = bench.fx.pool.get().await.unwrap();
    branches::find(&**db, project, branch).await.unwrap()
}

async fn count(
    bench: &Bench,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> i64 {
    let db = bench.fx.pool.get().await.unwrap();
    db.query_one(sql, params).await.unwrap().get(0)
}

/// Paths in the branch's index.
async fn branch_paths(bench: &Bench, branch_id: i64) -> Vec<String> {
    let db = bench.fx.pool.get().await.unwrap();
    db.query(
        "SELECT DISTINCT path FROM code_chunks WHERE branch_id = $1 ORDER BY path",
        &[&branch_id],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The question's prompt (every POST the provider saw, embeddings included).
async fn prompt_for(
    bench: &Bench,
    world: &World,
    question: &str,
    item: AdditionalContext,
) -> String {
    bench.fake.reset();
    bench.fake.set_default_text("Final Answer: ok.");
    let answer = ask(bench, world, question, vec![item]).await;
    assert!(answer.error.is_none(), "{answer:?}");
    bench.provider_bodies().join("\n")
}

#[tokio::test]
async fn a_branch_is_indexed_on_demand_from_the_default_branch_and_searched_alone() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    let index = &bench.responder.services().code_index;

    // Not indexed yet: queued once, answered "being indexed", nothing embedded.
    bench.fake.reset();
    for _ in 0..3 {
        let answer = ask(
            &bench,
            &world,
            "voucher",
            vec![repository_item(world.project, Some(BRANCH))],
        )
        .await;
        assert!(answer.error.is_none(), "{answer:?}");
        assert_eq!(answer.content, branch_being_indexed(BRANCH));
    }
    assert!(bench.fake.requests().is_empty());
    let jobs = count(
        &bench,
        "SELECT count(*) FROM background_jobs WHERE kind = 'code_index_branch'
         AND payload->>'branch' = $1",
        &[&BRANCH],
    )
    .await;
    assert_eq!(jobs, 1);
    let row = branch_row(&bench, world.project, BRANCH).await.unwrap();
    assert_eq!(row.state, IndexState::Pending);

    // The run embeds only the file the branch added; the rest is copied
    // from the default branch by blob id; the excluded file is never sent.
    let chunks_before = count(
        &bench,
        "SELECT count(*) FROM code_chunks WHERE project_id = $1 AND branch_id IS NULL",
        &[&world.project],
    )
    .await;
    bench.fake.reset();
    let run = index_branch(index, world.project, BRANCH).await.unwrap();
    assert_eq!(run.files_embedded, 1, "{run:?}");
    let texts = embedded_texts(&bench);
    assert!(!texts.is_empty());
    assert!(texts.iter().all(|t| t.starts_with(COUPONS)), "{texts:?}");
    let row = branch_row(&bench, world.project, BRANCH).await.unwrap();
    assert_eq!(row.state, IndexState::Ready);
    let head =
        monolith::repositories::reader::resolve(&bench.repositories().path(world.project), BRANCH)
            .unwrap();
    assert_eq!(row.indexed_commit.as_deref(), Some(head.as_str()));
    let paths = branch_paths(&bench, row.id).await;
    assert!(paths.contains(&COUPONS.to_owned()), "{paths:?}");
    assert!(paths.contains(&"src/billing/refund_window.rs".to_owned()));
    assert!(!paths.contains(&LEDGER.to_owned()), "{paths:?}");
    assert!(
        !paths.iter().any(|p| p.starts_with("secrets/")),
        "{paths:?}"
    );
    assert_eq!(row.file_count as usize, paths.len());
    // The default branch's index is untouched.
    let chunks_after = count(
        &bench,
        "SELECT count(*) FROM code_chunks WHERE project_id = $1 AND branch_id IS NULL",
        &[&world.project],
    )
    .await;
    assert_eq!(chunks_before, chunks_after);

    // Nothing changed: a second run embeds nothing.
    bench.fake.reset();
    index_branch(index, world.project, BRANCH).await.unwrap();
    assert!(embedded_texts(&bench).is_empty());

    // The branch's question finds the branch's file, not the default's.
    let prompt = prompt_for(
        &bench,
        &world,
        "voucher",
        repository_item(world.project, Some(BRANCH)),
    )
    .await;
    assert!(
        prompt.contains(&format!("<file_path>{COUPONS}</file_path>")),
        "{prompt}"
    );
    assert!(prompt.contains("PERCENT_OFF"));
    assert!(prompt.contains(&format!("Branch: {BRANCH}")));
    assert!(
        !prompt.contains(LEDGER),
        "a default-only file on the branch"
    );
    assert!(
        !prompt.contains("hunter3"),
        "an excluded file reached the prompt"
    );

    // The default branch answers as before.
    let prompt = prompt_for(
        &bench,
        &world,
        "voucher",
        repository_item(world.project, None),
    )
    .await;
    assert!(
        prompt.contains(&format!("<file_path>{LEDGER}</file_path>")),
        "{prompt}"
    );
    assert!(
        !prompt.contains(COUPONS),
        "a branch-only file on the default branch"
    );
    // Naming the default branch is the default branch.
    let prompt = prompt_for(
        &bench,
        &world,
        "voucher",
        repository_item(world.project, Some("main")),
    )
    .await;
    assert!(prompt.contains(LEDGER) && !prompt.contains(COUPONS));

    // A directory on the branch (small: sent whole from the branch's files).
    let prompt = prompt_for(
        &bench,
        &world,
        "what is here?",
        directory_item(world.project, "src/billing", BRANCH),
    )
    .await;
    assert!(
        prompt.contains(&format!("<file_path>{COUPONS}</file_path>")),
        "{prompt}"
    );
    assert!(!prompt.contains(LEDGER));
}

#[tokio::test]
async fn bad_or_missing_branches_are_refused_and_strangers_learn_nothing() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    index_branch(
        &bench.responder.services().code_index,
        world.project,
        BRANCH,
    )
    .await
    .unwrap();
    let row = branch_row(&bench, world.project, BRANCH).await;
    assert!(
        row.is_none(),
        "a job for a branch nobody asked about does nothing"
    );

    // Bad names are refused at the edge, before any lookup.
    for bad in ["a..b", "x\u{0}y", "-rf", "refs/heads/", &"b".repeat(300)] {
        bench.fake.reset();
        let answer = ask(
            &bench,
            &world,
            "voucher",
            vec![repository_item(world.project, Some(bad))],
        )
        .await;
        let error = answer
            .error
            .as_ref()
            .unwrap_or_else(|| panic!("{bad:?}: {answer:?}"));
        assert_eq!(error.code, DuoErrorCode::M4001, "{bad:?}");
        assert!(bench.fake.requests().is_empty());
    }
    // A branch that does not exist, for a member: said so.
    let answer = ask(
        &bench,
        &world,
        "voucher",
        vec![repository_item(world.project, Some("no-such-branch"))],
    )
    .await;
    let error = answer.error.as_ref().unwrap();
    assert_eq!(error.code, DuoErrorCode::M4001);
    assert!(error.detail.contains("does not exist"), "{}", error.detail);

    // Someone who cannot read the project: the same answer for an existing
    // branch, a missing branch and a missing project; nothing queued.
    let outsider = bench.fx.user("outsider").await;
    bench.fx.seat(outsider, "duo_enterprise", false).await;
    let stranger = World {
        user: outsider,
        group: world.group,
        project: world.project,
    };
    let mut codes = Vec::new();
    for item in [
        repository_item(world.project, Some(BRANCH)),
        repository_item(world.project, Some("no-such-branch")),
        repository_item(999_999, Some(BRANCH)),
        directory_item(world.project, "src/billing", BRANCH),
    ] {
        let answer = ask(&bench, &stranger, "voucher", vec![item]).await;
        codes.push(answer.error.as_ref().map(|e| e.code));
    }
    assert!(
        codes.iter().all(|c| *c == Some(DuoErrorCode::M3003)),
        "{codes:?}"
    );
    assert!(branch_row(&bench, world.project, BRANCH).await.is_none());

    // Once the branch is indexed for a member, a stranger still gets nothing.
    ask(
        &bench,
        &world,
        "voucher",
        vec![repository_item(world.project, Some(BRANCH))],
    )
    .await;
    index_branch(
        &bench.responder.services().code_index,
        world.project,
        BRANCH,
    )
    .await
    .unwrap();
    assert!(
        branch_row(&bench, world.project, BRANCH)
            .await
            .is_some_and(|r| r.state == IndexState::Ready)
    );
    bench.fake.reset();
    let answer = ask(
        &bench,
        &stranger,
        "voucher",
        vec![repository_item(world.project, Some(BRANCH))],
    )
    .await;
    assert_eq!(
        answer.error.as_ref().map(|e| e.code),
        Some(DuoErrorCode::M3003)
    );
    assert!(
        bench.fake.requests().is_empty(),
        "nothing embedded or asked"
    );
}

#[tokio::test]
async fn at_most_the_configured_branches_are_kept_least_recently_searched_first() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    let index = &bench.responder.services().code_index;
    let keep = index.settings.max_branches;
    assert_eq!(keep, 3, "the documented default");
    let repo = bench.repositories().path(world.project);
    let names: Vec<String> = (0..=keep).map(|i| format!("topic-{i}")).collect();
    for name in &names {
        writer::create_branch(&repo, name, "main").await.unwrap();
    }
    let mut ids = Vec::new();
    for name in &names[..keep] {
        let answer = ask(
            &bench,
            &world,
            "voucher",
            vec![repository_item(world.project, Some(name))],
        )
        .await;
        assert_eq!(answer.content, branch_being_indexed(name));
        bench.fake.reset();
        let run = index_branch(index, world.project, name).await.unwrap();
        assert_eq!(run.files_embedded, 0, "same blobs as the default: {run:?}");
        assert!(embedded_texts(&bench).is_empty());
        ids.push(branch_row(&bench, world.project, name).await.unwrap().id);
    }
    // The first is searched again: the second is now the least recent.
    let prompt = prompt_for(
        &bench,
        &world,
        "voucher",
        repository_item(world.project, Some(&names[0])),
    )
    .await;
    assert!(prompt.contains(LEDGER), "{prompt}");
    let answer = ask(
        &bench,
        &world,
        "voucher",
        vec![repository_item(world.project, Some(&names[keep]))],
    )
    .await;
    assert_eq!(answer.content, branch_being_indexed(&names[keep]));
    let db = bench.fx.pool.get().await.unwrap();
    let kept: Vec<String> = branches::of_project(&**db, world.project)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.branch)
        .collect();
    assert_eq!(kept.len(), keep, "{kept:?}");
    assert!(!kept.contains(&names[1]), "{kept:?}");
    assert!(
        kept.contains(&names[0]) && kept.contains(&names[keep]),
        "{kept:?}"
    );
    let evicted_chunks = count(
        &bench,
        "SELECT count(*) FROM code_chunks WHERE branch_id = $1",
        &[&ids[1]],
    )
    .await;
    assert_eq!(
        evicted_chunks, 0,
        "the evicted branch's chunks went with it"
    );
    assert!(
        branch_paths(&bench, ids[0])
            .await
            .contains(&LEDGER.to_owned())
    );
}

#[tokio::test]
async fn the_worker_follows_pushes_to_an_indexed_branch_and_drops_a_deleted_one() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    let worker = monolith::worker::spawn(
        bench.fx.pool.clone(),
        bench.fx.db.url(),
        std::sync::Arc::new(monolith::chat::jobs::NotYetAvailableResponder),
        "https://docs.gitlab.com".into(),
        monolith::worker::WorkerSettings {
            queue: job_queue::WorkerConfig {
                poll_interval: Duration::from_millis(50),
                backoff_base: Duration::from_millis(50),
                backoff_max: Duration::from_millis(200),
                ..Default::default()
            },
            retention_every: Duration::from_secs(3600),
            workflows: None,
            code_index: Some(bench.responder.services().code_index.clone()),
            workflow_runs: None,
            review: None,
        },
    )
    .unwrap();
    let wait_for = |wanted: Option<String>| {
        let pool = bench.fx.pool.clone();
        let project = world.project;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let db = pool.get().await.unwrap();
                let row = branches::find(&**db, project, BRANCH).await.unwrap();
                let reached = match (&row, &wanted) {
                    (Some(r), Some(commit)) => {
                        r.state == IndexState::Ready && r.indexed_commit.as_ref() == Some(commit)
                    }
                    (None, None) => true,
                    _ => false,
                };
                if reached {
                    return row;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never reached {wanted:?}: {row:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let push = |update: RefUpdate| {
        let pool = bench.fx.pool.clone();
        let project = world.project;
        async move {
            let db = pool.get().await.unwrap();
            pushes::record(&**db, project, None, &[update])
                .await
                .unwrap();
        }
    };
    let repo = bench.repositories().path(world.project);
    let head = monolith::repositories::reader::resolve(&repo, BRANCH).unwrap();

    // Asked about: the worker indexes it.
    let answer = ask(
        &bench,
        &world,
        "voucher",
        vec![repository_item(world.project, Some(BRANCH))],
    )
    .await;
    assert_eq!(answer.content, branch_being_indexed(BRANCH));
    let row = wait_for(Some(head.clone())).await.unwrap();
    let prompt = prompt_for(
        &bench,
        &world,
        "voucher",
        repository_item(world.project, Some(BRANCH)),
    )
    .await;
    assert!(
        prompt.contains(&format!("<file_path>{COUPONS}</file_path>")),
        "{prompt}"
    );

    // A push to the branch: only the new file is embedded.
    bench.fake.reset();
    let moved = commit_on(
        &bench,
        world.project,
        BRANCH,
        vec![create(
            "src/billing/gift_cards.rs",
            "/// Gift cards are vouchers with a balance.\npub struct GiftCard;\n",
        )],
    )
    .await;
    push(RefUpdate {
        name: format!("refs/heads/{BRANCH}"),
        before: head,
        after: moved.clone(),
    })
    .await;
    wait_for(Some(moved.clone())).await;
    let texts = embedded_texts(&bench);
    assert!(!texts.is_empty());
    assert!(
        texts
            .iter()
            .all(|t| t.starts_with("src/billing/gift_cards.rs")),
        "{texts:?}"
    );
    assert!(
        branch_paths(&bench, row.id)
            .await
            .contains(&"src/billing/gift_cards.rs".to_owned())
    );

    // The branch is deleted: its index goes.
    let deleted = writer::delete_branch(&repo, BRANCH, &moved).await.unwrap();
    push(deleted).await;
    wait_for(None).await;
    let left = count(
        &bench,
        "SELECT count(*) FROM code_chunks WHERE branch_id = $1",
        &[&row.id],
    )
    .await;
    assert_eq!(left, 0);
    worker.shutdown().await;
}

// ---- the same branch path from the chat tool, the REST endpoint and MCP ------------

/// What the provider was asked after the tool ran (the observation).
fn tool_prompts(bench: &Bench) -> Vec<String> {
    bench
        .fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/messages"))
        .map(|r| r.body.to_string())
        .collect()
}

#[tokio::test]
async fn the_codebase_search_tool_searches_the_branch_its_question_context_names() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    let index = &bench.responder.services().code_index;
    // The context names a small directory on the branch (sent whole: no
    // voucher file in it), so a voucher file in the prompt comes from the tool.
    let on_branch = || directory_item(world.project, "src/http", BRANCH);
    let answer = ask(&bench, &world, "voucher", vec![on_branch()]).await;
    assert_eq!(answer.content, branch_being_indexed(BRANCH));
    index_branch(index, world.project, BRANCH).await.unwrap();

    // No project named in the input: the context's project, on its branch.
    bench.fake.reset();
    bench
        .fake
        .push_text(" Search the code.\nAction: codebase_search\nAction Input: voucher");
    bench
        .fake
        .push_text(" Found it.\nFinal Answer: 23 percent.");
    let answer = ask(
        &bench,
        &world,
        "What does a voucher take off?",
        vec![on_branch()],
    )
    .await;
    assert!(answer.error.is_none(), "{answer:?}");
    let prompts = tool_prompts(&bench);
    assert_eq!(prompts.len(), 2, "{prompts:?}");
    assert!(
        !prompts[0].contains(COUPONS),
        "the context alone has no voucher file"
    );
    assert!(
        prompts[1].contains(&format!("<file_path>{COUPONS}</file_path>")),
        "{}",
        prompts[1]
    );
    assert!(prompts[1].contains(&format!("Branch: {BRANCH}")));
    assert!(
        !prompts[1].contains(LEDGER),
        "a default-only file on the branch"
    );
    assert!(
        prompts.iter().all(|p| !p.contains("hunter3")),
        "an excluded file reached the prompt"
    );

    // The project named in the input, with the context on the same project: its branch too.
    bench.fake.reset();
    bench
        .fake
        .push_text(" Search.\nAction: codebase_search\nAction Input: gl/app voucher");
    bench.fake.push_text(" Done.\nFinal Answer: ok.");
    ask(&bench, &world, "voucher in gl/app?", vec![on_branch()]).await;
    let prompts = tool_prompts(&bench);
    assert!(prompts[1].contains(COUPONS) && !prompts[1].contains(LEDGER));

    // Without branch context: the default branch.
    bench.fake.reset();
    bench
        .fake
        .push_text(" Search.\nAction: codebase_search\nAction Input: gl/app voucher");
    bench.fake.push_text(" Done.\nFinal Answer: ok.");
    let answer = ask(&bench, &world, "voucher in gl/app?", vec![]).await;
    assert!(answer.error.is_none(), "{answer:?}");
    let prompts = tool_prompts(&bench);
    assert!(
        prompts[1].contains(&format!("<file_path>{LEDGER}</file_path>")),
        "{}",
        prompts[1]
    );
    assert!(
        !prompts[1].contains(COUPONS),
        "a branch-only file on the default branch"
    );

    // A stranger with the same context: refused before any model call or embedding.
    let outsider = bench.fx.user("outsider").await;
    bench.fx.seat(outsider, "duo_enterprise", false).await;
    let stranger = World {
        user: outsider,
        group: world.group,
        project: world.project,
    };
    bench.fake.reset();
    bench
        .fake
        .push_text(" Search.\nAction: codebase_search\nAction Input: voucher");
    let answer = ask(&bench, &stranger, "voucher", vec![on_branch()]).await;
    assert_eq!(
        answer.error.as_ref().map(|e| e.code),
        Some(DuoErrorCode::M3003)
    );
    assert!(
        bench.fake.requests().is_empty(),
        "nothing asked or embedded"
    );
}

/// GET `/projects/:id/semantic_code_search` with these query parameters.
async fn rest_search(
    server: &crate::support::Server,
    project: i64,
    token: &str,
    params: &str,
) -> (u16, serde_json::Value) {
    crate::rest_support::get(
        server,
        &format!("/projects/{project}/semantic_code_search?semantic_query=voucher{params}"),
        token,
    )
    .await
}

fn result_paths(body: &serde_json::Value) -> Vec<String> {
    body["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {body}"))
        .iter()
        .map(|r| r["path"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn rest_semantic_code_search_takes_a_ref_with_the_same_checks() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    let index = &bench.responder.services().code_index;
    let server = crate::rest_code_search::server(&bench).await;
    let api = bench.fx.token(world.user, &["api"]).await;
    let on_branch = "&ref=feature%2Fcoupons";

    // Not indexed yet: queued once, answered "indexing", nothing embedded.
    bench.fake.reset();
    for _ in 0..2 {
        let (status, body) = rest_search(&server, world.project, &api, on_branch).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body, json!({"status": "indexing", "results": []}));
    }
    assert!(bench.fake.requests().is_empty());
    let jobs = count(
        &bench,
        "SELECT count(*) FROM background_jobs WHERE kind = 'code_index_branch'
         AND payload->>'branch' = $1",
        &[&BRANCH],
    )
    .await;
    assert_eq!(jobs, 1);
    index_branch(index, world.project, BRANCH).await.unwrap();

    // The branch's file on the branch, never the excluded one; the default's on the default.
    let (status, body) = rest_search(&server, world.project, &api, on_branch).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready");
    let found = result_paths(&body);
    assert_eq!(found.first().map(String::as_str), Some(COUPONS), "{body}");
    assert!(!found.contains(&LEDGER.to_owned()), "{body}");
    assert!(found.iter().all(|p| !p.starts_with("secrets/")), "{body}");
    assert!(!body.to_string().contains("hunter3"), "{body}");
    for default in ["", "&ref=main"] {
        let (status, body) = rest_search(&server, world.project, &api, default).await;
        assert_eq!(status, 200, "{body}");
        let found = result_paths(&body);
        assert!(found.contains(&LEDGER.to_owned()), "{default}: {body}");
        assert!(!found.contains(&COUPONS.to_owned()), "{default}: {body}");
    }

    // A bad name: 400 before anything is looked up; a missing branch: 404.
    bench.fake.reset();
    for bad in ["a..b", "-rf", "refs%2Fheads%2F", "a%20b", "x~1"] {
        let (status, body) =
            rest_search(&server, world.project, &api, &format!("&ref={bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("ref is invalid"),
            "{body}"
        );
    }
    // A NUL is refused for every parameter before the endpoint runs.
    let (status, body) = rest_search(&server, world.project, &api, "&ref=x%00y").await;
    assert_eq!(status, 400, "{body}");
    assert!(bench.fake.requests().is_empty());
    let (status, body) = rest_search(&server, world.project, &api, "&ref=no-such-branch").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["message"], "404 Branch Not Found");

    // A stranger: the same 404 whatever the branch, and nothing queued.
    let repo = bench.repositories().path(world.project);
    writer::create_branch(&repo, "topic-stranger", "main")
        .await
        .unwrap();
    let outsider = bench.fx.user("outsider").await;
    bench.fx.seat(outsider, "duo_enterprise", false).await;
    let theirs = bench.fx.token(outsider, &["api"]).await;
    let mut answers = Vec::new();
    for params in [
        on_branch,
        "&ref=no-such-branch",
        "&ref=topic-stranger",
        "&ref=a..b",
        "",
    ] {
        answers.push(rest_search(&server, world.project, &theirs, params).await);
    }
    assert!(
        answers
            .iter()
            .all(|a| *a == (404, json!({"message": "404 Project Not Found"}))),
        "{answers:?}"
    );
    assert!(
        branch_row(&bench, world.project, "topic-stranger")
            .await
            .is_none()
    );
    assert!(
        bench.fake.requests().is_empty(),
        "nothing embedded for them"
    );
}

#[tokio::test]
async fn the_mcp_semantic_code_search_tool_takes_a_ref_with_the_same_checks() {
    use crate::mcp_server::{Mcp, texts};
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    let index = &bench.responder.services().code_index;
    let server = crate::rest_code_search::server(&bench).await;
    let token = bench.fx.token(world.user, &["mcp"]).await;
    let mut mcp = Mcp::connect(&server, &token).await;
    let search = |branch: Option<&str>| {
        let mut args = json!({"project_id": world.project, "semantic_query": "voucher"});
        if let Some(branch) = branch {
            args["ref"] = json!(branch);
        }
        args
    };

    // Not indexed yet: said so (as for the default branch), queued.
    let first = mcp.call("semantic_code_search", search(Some(BRANCH))).await;
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(texts(&first), vec![branch_being_indexed(BRANCH)]);
    index_branch(index, world.project, BRANCH).await.unwrap();

    let on_branch = mcp.call("semantic_code_search", search(Some(BRANCH))).await;
    assert_eq!(on_branch["isError"], false, "{on_branch}");
    let text = texts(&on_branch).join("\n");
    assert!(
        text.contains(&format!("<file_path>{COUPONS}</file_path>")),
        "{text}"
    );
    assert!(!text.contains(LEDGER), "{text}");
    assert!(
        !text.contains("hunter3") && !text.contains("secrets/"),
        "{text}"
    );
    let default = mcp.call("semantic_code_search", search(None)).await;
    let text = texts(&default).join("\n");
    assert!(text.contains(LEDGER) && !text.contains(COUPONS), "{text}");

    // Bad and missing names: tool errors; an overlong one breaks the schema.
    bench.fake.reset();
    let bad = mcp
        .call_refused("semantic_code_search", search(Some("a..b")))
        .await;
    assert!(bad.contains("M4001"), "{bad}");
    assert!(bench.fake.requests().is_empty());
    let missing = mcp
        .call_refused("semantic_code_search", search(Some("no-such-branch")))
        .await;
    assert!(missing.contains("does not exist"), "{missing}");
    let error = mcp
        .call_error("semantic_code_search", search(Some(&"b".repeat(256))))
        .await;
    assert_eq!(error["code"], -32602, "{error}");

    // A stranger: the same refusal whatever the branch, nothing queued or embedded.
    let repo = bench.repositories().path(world.project);
    writer::create_branch(&repo, "topic-stranger", "main")
        .await
        .unwrap();
    let outsider = bench.fx.user("outsider").await;
    bench.fx.seat(outsider, "duo_enterprise", false).await;
    let theirs = bench.fx.token(outsider, &["mcp"]).await;
    let mut stranger = Mcp::connect(&server, &theirs).await;
    let mut refusals = Vec::new();
    for branch in [
        Some(BRANCH),
        Some("no-such-branch"),
        Some("topic-stranger"),
        Some("a..b"),
        None,
    ] {
        refusals.push(
            stranger
                .call_refused("semantic_code_search", search(branch))
                .await,
        );
    }
    assert!(refusals.iter().all(|r| *r == refusals[0]), "{refusals:?}");
    assert!(
        refusals[0].contains("404 Project Not Found"),
        "{refusals:?}"
    );
    assert!(
        branch_row(&bench, world.project, "topic-stranger")
            .await
            .is_none()
    );
    assert!(bench.fake.requests().is_empty());
}
