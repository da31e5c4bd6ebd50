//! The code index end to end inside the monolith: real bare repositories,
//! the real gateway's code-embedding endpoints over HTTP, the fake
//! provider's bag-of-words embeddings (every call recorded), PostgreSQL with
//! pgvector, and the real job worker.

use std::time::Duration;

use contracts::{AdditionalContext, DuoErrorCode};
use monolith::chat::CompletionJob;
use monolith::code_index::chat_context::BEING_INDEXED;
use monolith::code_index::indexer::index_project;
use monolith::code_index::{IndexState, store};
use monolith::repositories::writer::{self, CommitRequest, FileAction, Signature};
use serde_json::json;
use uuid::Uuid;

use crate::agent_support::{Bench, World};

const NEEDLE: &str = "src/billing/refund_window.rs";

fn files() -> Vec<(&'static str, String)> {
    let mut files = vec![
        (
            NEEDLE,
            "/// Customers may ask for their money back within this many days.\n\
             pub const REFUND_WINDOW_DAYS: u32 = 17;\n\n\
             pub fn refund_allowed(days_since_purchase: u32) -> bool {\n    days_since_purchase <= REFUND_WINDOW_DAYS\n}\n"
                .to_owned(),
        ),
        (
            "src/http/throttle.rs",
            "/// Stops one client from hammering the API.\npub struct Throttle { per_minute: u32 }\n\n\
             impl Throttle {\n    pub fn allow(&self, seen: u32) -> bool { seen < self.per_minute }\n}\n"
                .to_owned(),
        ),
        (
            "src2/notes.md",
            "# Notes\nThe refund window is documented in the billing module.\n".to_owned(),
        ),
        (
            "secrets/production.env",
            "DATABASE_PASSWORD=refund-window-hunter2\n".to_owned(),
        ),
        (
            "vendor/left_pad.js",
            "module.exports = function leftPad(s) { return ' ' + s; } // refund window\n".to_owned(),
        ),
        ("assets/logo.png", "\u{0}PNG binary refund window".to_owned()),
    ];
    for i in 0..6 {
        files.push((
            Box::leak(format!("src/util/helper_{i}.py").into_boxed_str()),
            format!("def helper_{i}(value):\n    \"\"\"Formats value number {i}.\"\"\"\n    return str(value) + '{i}'\n"),
        ));
    }
    files
}

fn author() -> Signature {
    Signature {
        name: "Dev".into(),
        email: "dev@example.com".into(),
        when: None,
    }
}

async fn commit(bench: &Bench, project: i64, actions: Vec<FileAction>) -> String {
    let repos = bench.repositories();
    let path = repos.ensure(project, "main").await.unwrap();
    let done = writer::commit(
        &path,
        &CommitRequest {
            branch: "main".into(),
            start: None,
            message: "change".into(),
            author: author(),
            actions,
        },
    )
    .await
    .unwrap();
    done.commit_id
}

async fn seeded(bench: &Bench) -> World {
    let world = bench.world().await;
    let actions = files()
        .into_iter()
        .map(|(path, content)| FileAction::Create {
            path: path.to_owned(),
            content: content.into_bytes(),
            executable: false,
        })
        .collect();
    commit(bench, world.project, actions).await;
    bench
        .fx
        .exec(
            "UPDATE projects SET duo_context_exclusion_rules = '{secrets/}' WHERE id = $1",
            &[&world.project],
        )
        .await;
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

async fn indexed_paths(bench: &Bench, project: i64) -> Vec<String> {
    let db = bench.fx.pool.get().await.unwrap();
    db.query(
        "SELECT DISTINCT path FROM code_chunks WHERE project_id = $1 ORDER BY path",
        &[&project],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
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
                resource_id: None,
                current_file: None,
                additional_context: context,
                ..Default::default()
            },
            tx.into(),
        )
        .await
        .expect("no transient failure")
}

fn repository_item(project: i64) -> AdditionalContext {
    serde_json::from_value(json!({
        "category": "repository",
        "id": format!("gid://gitlab/Project/{project}"),
        "content": "",
        "metadata": {"name": "app", "pathWithNamespace": "gl/app"}
    }))
    .unwrap()
}

fn directory_item(project: i64, dir: &str) -> AdditionalContext {
    serde_json::from_value(json!({
        "category": "directory",
        "id": format!("dir:///gl/app/{dir}"),
        "content": "",
        "metadata": {"relativePath": dir, "projectId": format!("gid://gitlab/Project/{project}")}
    }))
    .unwrap()
}

#[tokio::test]
async fn indexing_skips_what_must_not_be_sent_and_re_embeds_only_what_changed() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    let index = &bench.responder.services().code_index;

    let first = index_project(index, world.project).await.unwrap();
    let paths = indexed_paths(&bench, world.project).await;
    assert!(paths.contains(&NEEDLE.to_owned()), "{paths:?}");
    for never in [
        "secrets/production.env",
        "vendor/left_pad.js",
        "assets/logo.png",
    ] {
        assert!(!paths.contains(&never.to_owned()), "{never} was indexed");
    }
    let texts = embedded_texts(&bench);
    assert_eq!(texts.len(), first.chunks_embedded);
    assert!(
        texts.iter().all(|t| !t.contains("hunter2")),
        "an excluded file reached the embedder"
    );
    assert!(
        texts.iter().any(|t| t.starts_with(NEEDLE)),
        "chunks are embedded with their path first"
    );
    let db = bench.fx.pool.get().await.unwrap();
    let status = store::status(&**db, world.project).await.unwrap().unwrap();
    assert_eq!(status.state, IndexState::Ready);
    assert_eq!(status.embedding_model.as_deref(), Some("fake-bow-minilm"));
    assert_eq!(status.embedding_dimensions, Some(384));
    assert_eq!(status.file_count as usize, paths.len());

    // One file changes, one is renamed unchanged, one is deleted.
    bench.fake.reset();
    let head = commit(
        &bench,
        world.project,
        vec![
            FileAction::Update {
                path: "src/http/throttle.rs".into(),
                content: b"/// Stops one client from hammering the API: 40 calls a minute.\npub struct Throttle;\n".to_vec(),
            },
            FileAction::Move {
                previous_path: "src/util/helper_0.py".into(),
                path: "src/util/renamed_helper.py".into(),
                content: None,
            },
            FileAction::Delete {
                path: "src/util/helper_1.py".into(),
            },
        ],
    )
    .await;
    let second = index_project(index, world.project).await.unwrap();
    let texts = embedded_texts(&bench);
    assert_eq!(second.files_embedded, 1, "{second:?}");
    assert_eq!(
        second.files_reused, 1,
        "the renamed file keeps its vectors: {second:?}"
    );
    assert!(
        texts.iter().all(|t| t.starts_with("src/http/throttle.rs")),
        "{texts:?}"
    );
    let paths = indexed_paths(&bench, world.project).await;
    assert!(paths.contains(&"src/util/renamed_helper.py".to_owned()));
    assert!(!paths.contains(&"src/util/helper_0.py".to_owned()));
    assert!(!paths.contains(&"src/util/helper_1.py".to_owned()));
    let status = store::status(&**db, world.project).await.unwrap().unwrap();
    assert_eq!(status.indexed_commit.as_deref(), Some(head.as_str()));

    // Nothing changed: no embedding at all.
    bench.fake.reset();
    index_project(index, world.project).await.unwrap();
    assert!(embedded_texts(&bench).is_empty());
}

#[tokio::test]
async fn repository_context_puts_the_needle_file_in_the_prompt() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    index_project(&bench.responder.services().code_index, world.project)
        .await
        .unwrap();
    bench.fake.set_default_text("Final Answer: 17 days.");
    let answer = ask(
        &bench,
        &world,
        "How many days do customers have to get their money back (refund window)?",
        vec![repository_item(world.project)],
    )
    .await;
    assert!(answer.error.is_none(), "{answer:?}");
    let prompt = bench.provider_bodies().join("\n");
    assert!(
        prompt.contains(&format!("<file_path>{NEEDLE}</file_path>")),
        "the needle file is not in the prompt"
    );
    assert!(prompt.contains("REFUND_WINDOW_DAYS"));
    assert!(
        !prompt.contains("hunter2"),
        "an excluded file reached the prompt"
    );

    // A directory: only files below it (`src` never matches `src2/`).
    bench.fake.reset();
    bench.fake.set_default_text("Final Answer: ok.");
    ask(
        &bench,
        &world,
        "refund window notes",
        vec![directory_item(world.project, "src")],
    )
    .await;
    let prompt = bench.provider_bodies().join("\n");
    assert!(prompt.contains("<file_path>src/"), "{prompt}");
    assert!(
        !prompt.contains("<file_path>src2/"),
        "a file outside the directory"
    );

    // A small directory is sent whole, without a search.
    bench.fake.reset();
    bench.fake.set_default_text("Final Answer: ok.");
    ask(
        &bench,
        &world,
        "what is here?",
        vec![directory_item(world.project, "src/billing")],
    )
    .await;
    let prompt = bench.provider_bodies().join("\n");
    assert!(prompt.contains(&format!("<file_path>{NEEDLE}</file_path>")));
    assert!(
        bench
            .fake
            .requests()
            .iter()
            .all(|r| !r.path.ends_with("/embeddings")),
        "a small directory needs no embedding"
    );
}

#[tokio::test]
async fn another_users_private_project_is_never_searched_or_revealed() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    index_project(&bench.responder.services().code_index, world.project)
        .await
        .unwrap();
    let outsider = bench.fx.user("outsider").await;
    bench.fx.seat(outsider, "duo_enterprise", false).await;
    let stranger = World {
        user: outsider,
        group: world.group,
        project: world.project,
    };
    bench.fake.reset();
    let answer = ask(
        &bench,
        &stranger,
        "refund window",
        vec![repository_item(world.project)],
    )
    .await;
    assert_eq!(
        answer.error.as_ref().map(|e| e.code),
        Some(DuoErrorCode::M3003)
    );
    let missing = ask(
        &bench,
        &stranger,
        "refund window",
        vec![repository_item(999_999)],
    )
    .await;
    assert_eq!(
        missing.error.as_ref().map(|e| e.code),
        answer.error.as_ref().map(|e| e.code),
        "a missing project answers like a forbidden one"
    );
    assert!(
        bench.fake.requests().is_empty(),
        "nothing was embedded or asked"
    );
}

#[tokio::test]
async fn an_unindexed_project_answers_being_indexed_and_enqueues_exactly_one_job() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    let asks = (0..6).map(|_| {
        ask(
            &bench,
            &world,
            "refund window?",
            vec![repository_item(world.project)],
        )
    });
    let answers = futures::future::join_all(asks).await;
    for answer in &answers {
        assert_eq!(answer.content, BEING_INDEXED);
        assert!(answer.error.is_none());
    }
    let db = bench.fx.pool.get().await.unwrap();
    let jobs: i64 = db
        .query_one(
            "SELECT count(*) FROM background_jobs WHERE kind = 'code_index' AND payload->>'project_id' = $1",
            &[&world.project.to_string()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 1);
    assert!(bench.fake.requests().is_empty());
}

#[tokio::test]
async fn a_push_is_indexed_by_the_worker_and_a_failing_embedder_ends_failed_then_recovers() {
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
    let state_of = |project: i64| {
        let pool = bench.fx.pool.clone();
        async move {
            let db = pool.get().await.unwrap();
            store::status(&**db, project).await.unwrap()
        }
    };
    let wait_for = |wanted: IndexState, commit: Option<String>| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let status = state_of(world.project).await;
            if let Some(s) = &status
                && s.state == wanted
                && (commit.is_none() || s.indexed_commit == commit)
            {
                return s.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never reached {wanted:?}: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let push = |commit_id: String| {
        let pool = bench.fx.pool.clone();
        async move {
            let db = pool.get().await.unwrap();
            monolith::repositories::pushes::record(
                &**db,
                world.project,
                None,
                &[monolith::repositories::pushes::RefUpdate {
                    name: "refs/heads/main".into(),
                    before: monolith::repositories::pushes::ZERO_SHA.into(),
                    after: commit_id,
                }],
            )
            .await
            .unwrap();
        }
    };

    let head =
        monolith::repositories::reader::resolve(&bench.repositories().path(world.project), "main")
            .unwrap();
    push(head.clone()).await;
    let ready = wait_for(IndexState::Ready, Some(head)).await;
    assert!(ready.chunk_count > 0);

    // The embedder fails: retried, then failed with the error; nothing hangs.
    bench.fake.set_embeddings_failing(true);
    let broken = commit(
        &bench,
        world.project,
        vec![FileAction::Create {
            path: "src/new.rs".into(),
            content: b"pub fn brand_new() {}\n".to_vec(),
            executable: false,
        }],
    )
    .await;
    push(broken.clone()).await;
    let failed = wait_for(IndexState::Failed, None).await;
    assert!(failed.last_error.as_deref().is_some_and(|e| !e.is_empty()));
    assert!(failed.last_error_code.is_some());
    let answer = ask(
        &bench,
        &world,
        "refund?",
        vec![repository_item(world.project)],
    )
    .await;
    assert!(answer.error.is_some(), "a failed index says so: {answer:?}");

    // The next push recovers.
    bench.fake.set_embeddings_failing(false);
    push(broken.clone()).await;
    wait_for(IndexState::Ready, Some(broken)).await;
    worker.shutdown().await;
}

#[tokio::test]
async fn the_agent_searches_a_named_project_with_codebase_search() {
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    index_project(&bench.responder.services().code_index, world.project)
        .await
        .unwrap();
    bench.fake.reset();
    bench.fake.push_text(
        " The question is about the code of gl/app, so I should search it.\n\
         Action: codebase_search\nAction Input: gl/app refund window days",
    );
    bench
        .fake
        .push_text(" I know the answer.\nFinal Answer: 17 days.");
    let answer = ask(
        &bench,
        &world,
        "How long is the refund window in gl/app?",
        vec![],
    )
    .await;
    assert!(answer.error.is_none(), "{answer:?}");
    assert!(answer.content.contains("17 days"));
    let bodies: Vec<String> = bench
        .fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/messages"))
        .map(|r| r.body.to_string())
        .collect();
    assert_eq!(bodies.len(), 2);
    let second = &bodies[1];
    assert!(
        second.contains(&format!("<file_path>{NEEDLE}</file_path>")),
        "the observation holds the hit"
    );
    assert!(bodies[0].contains("codebase_search"), "the tool is offered");

    // Someone who cannot read the project gets M3003 and no search.
    let outsider = bench.fx.user("nosy").await;
    bench.fx.seat(outsider, "duo_enterprise", false).await;
    bench.fake.reset();
    bench
        .fake
        .push_text(" Search it.\nAction: codebase_search\nAction Input: gl/app refund window");
    let stranger = World {
        user: outsider,
        group: world.group,
        project: world.project,
    };
    let answer = ask(&bench, &stranger, "refund window in gl/app?", vec![]).await;
    assert_eq!(
        answer.error.as_ref().map(|e| e.code),
        Some(DuoErrorCode::M3003)
    );
    assert!(
        bench
            .fake
            .requests()
            .iter()
            .all(|r| !r.path.ends_with("/embeddings"))
    );
}

#[tokio::test]
async fn the_admins_embedding_model_choice_is_used_and_off_sends_nothing() {
    use monolith::ai_models::{Feature, ModelInput, Provider};
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    let services = bench.responder.services();
    let index = &services.code_index;
    let db = bench.fx.pool.get().await.unwrap();

    // Switched off: nothing is embedded, and the failure says why.
    services
        .models
        .update_features(&**db, &[Feature::CodeEmbeddings], Provider::Disabled, None)
        .await
        .unwrap();
    let refused = index_project(index, world.project).await.unwrap_err();
    assert_eq!(refused.code(), DuoErrorCode::M3004, "{refused}");
    assert!(embedded_texts(&bench).is_empty());

    // A self-hosted embedding model: the gateway calls it, by its identifier.
    let model = services
        .models
        .create_model(
            &**db,
            &ModelInput {
                name: "team embeddings".into(),
                model: "mistral".into(),
                endpoint: bench.fake.openai_base_url(),
                identifier: Some("fake-bow-team".into()),
                api_token: Some("sk-team".into()),
            },
        )
        .await
        .unwrap();
    services
        .models
        .update_features(
            &**db,
            &[Feature::CodeEmbeddings],
            Provider::SelfHosted,
            Some(model.id),
        )
        .await
        .unwrap();
    index_project(index, world.project).await.unwrap();
    let calls: Vec<_> = bench
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/embeddings"))
        .collect();
    assert!(!calls.is_empty());
    assert!(
        calls.iter().all(|r| r.body["model"] == "fake-bow-team"),
        "{:?}",
        calls.iter().map(|r| &r.body["model"]).collect::<Vec<_>>()
    );
}

/// Stored chunks of a project as (embedding text, stored vector).
async fn stored_vectors(bench: &Bench, project: i64) -> Vec<(String, Vec<f32>)> {
    let db = bench.fx.pool.get().await.unwrap();
    db.query(
        "SELECT path, symbol, content, start_byte, end_byte, start_line, end_line, embedding::text
         FROM code_chunks WHERE project_id = $1 ORDER BY id",
        &[&project],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| {
        let number = |i: usize| usize::try_from(r.get::<_, i32>(i)).unwrap();
        let chunk = monolith::code_index::chunker::Chunk {
            start_byte: number(3),
            end_byte: number(4),
            start_line: number(5),
            end_line: number(6),
            symbol: r.get(1),
            content: r.get(2),
        };
        let vector: String = r.get(7);
        let vector: Vec<f32> = serde_json::from_str(&vector).unwrap();
        (
            monolith::code_index::chunker::embedding_text(r.get(0), &chunk),
            vector,
        )
    })
    .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

#[tokio::test]
async fn indexing_keeps_at_most_the_configured_calls_in_flight_and_each_chunk_gets_its_own_vector()
{
    let bench = Bench::start().await;
    let world = seeded(&bench).await;
    // Files of several chunks each, of different lengths, so calls are
    // many and chunks are reordered by length across files.
    let actions = (0..8)
        .map(|i| FileAction::Create {
            path: format!("src/ledger/book_{i}.py"),
            content: (0..4 + i)
                .map(|f| {
                    format!(
                        "def entry_{i}_{f}(amount, account):\n    \"\"\"Posts amount {f} to account {i}; {}\"\"\"\n    total = amount * {f} + {i}\n    return account.post(total)\n\n\n",
                        "balances carry over. ".repeat(f * 3)
                    )
                })
                .collect::<String>()
                .into_bytes(),
            executable: false,
        })
        .collect();
    commit(&bench, world.project, actions).await;
    let mut index = bench.responder.services().code_index.clone();
    index.settings.embed_in_flight = 2;
    index.settings.embed_batch = 2;
    index.settings.embed_batch_tokens = 400;

    bench.fake.reset();
    bench.fake.hold_embeddings(true);
    let mut in_flight = bench.fake.embeddings_in_flight();
    let project = world.project;
    let mut run = tokio::spawn(async move { index_project(&index, project).await });
    // A held call is let go once two are out, so a run that pipelines
    // reaches two; a lone last call is let go after a while.
    let mut lone_for_a_while = false;
    let summary = loop {
        let now = *in_flight.borrow_and_update();
        if now >= 2 || (now == 1 && lone_for_a_while) {
            bench.fake.release_embedding();
        }
        lone_for_a_while = false;
        tokio::select! {
            done = &mut run => break done.unwrap().unwrap(),
            changed = in_flight.changed() => changed.unwrap(),
            () = tokio::time::sleep(Duration::from_millis(300)) => lone_for_a_while = true,
        }
    };
    bench.fake.hold_embeddings(false);
    assert_eq!(
        bench.fake.embeddings_peak(),
        2,
        "two calls out at once, never more ({summary:?})"
    );
    assert!(summary.embedding_calls >= 8, "{summary:?}");

    // Sorted by length across files, every chunk still got its own vector:
    // the embedder asked directly gives the same for each stored text.
    let stored = stored_vectors(&bench, world.project).await;
    assert_eq!(stored.len(), summary.chunks_embedded);
    let texts: Vec<&str> = stored.iter().map(|(t, _)| t.as_str()).collect();
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/embeddings", bench.fake.openai_base_url()))
        .json(&json!({"model": "fake-bow-minilm", "input": texts}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for (i, (text, vector)) in stored.iter().enumerate() {
        let expected: Vec<f32> =
            serde_json::from_value(answer["data"][i]["embedding"].clone()).unwrap();
        assert!(
            cosine(vector, &expected) > 0.9999,
            "the chunk {text:?} has another chunk's vector"
        );
    }
}
