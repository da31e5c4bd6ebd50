//! The completion worker against a real PostgreSQL: questions become queue jobs in
//! the same transaction, failures are retried, the last failure still answers, and
//! crashes or lease expiry never store a second answer.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests fail loudly"
)]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use monolith::chat::completion::{
    ChatAnswer, ChatResponder, ChunkSender, CompletionJob, ResponderError,
};
use monolith::chat::{ChatRequest, ChatService, PgCompletionQueue, jobs};
use monolith::config::Realm;
use monolith::policy::Actor;
use monolith::worker::{self, WorkerSettings};
use support::Fx;
use tokio::sync::{Notify, mpsc};

const DEADLINE: Duration = Duration::from_secs(20);

async fn world(max_attempts: i32) -> (Fx, Actor, ChatService) {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let user = fx.user("alice").await;
    fx.seat(user, "duo_pro", false).await;
    let chat = ChatService {
        pool: fx.pool.clone(),
        policy: fx.policy(),
        queue: Arc::new(PgCompletionQueue { max_attempts }),
        rate_limit: 1000,
        rate_window: Duration::from_secs(3600),
        docs_base_url: "https://docs.example.com".into(),
    };
    (fx, user, chat)
}

fn settings(lease: Duration, heartbeat: Duration, grace: Duration) -> WorkerSettings {
    WorkerSettings {
        queue: job_queue::WorkerConfig {
            concurrency: 1,
            lease,
            heartbeat,
            poll_interval: Duration::from_millis(100),
            shutdown_grace: grace,
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            ..Default::default()
        },
        retention_every: Duration::from_secs(3600),
        workflows: None,
        code_index: None,
        workflow_runs: None,
        review: None,
    }
}

fn fast() -> WorkerSettings {
    settings(
        Duration::from_secs(30),
        Duration::from_secs(5),
        Duration::from_secs(5),
    )
}

fn start(
    fx: &Fx,
    responder: Arc<dyn ChatResponder>,
    settings: WorkerSettings,
) -> job_queue::WorkerHandle {
    worker::spawn(
        fx.pool.clone(),
        fx.db.url(),
        responder,
        "https://docs.example.com".into(),
        settings,
    )
    .unwrap()
}

async fn ask(chat: &ChatService, user: Actor, content: &str) -> uuid::Uuid {
    chat.submit(
        Some(user),
        ChatRequest {
            content: content.into(),
            client_subscription_id: Some("tab-1".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap()
    .request_id
}

/// (content, errors, error code) of every stored answer to the request.
async fn answers(fx: &Fx, request: uuid::Uuid) -> Vec<(String, serde_json::Value)> {
    let db = fx.pool.get().await.unwrap();
    db.query(
        "SELECT content, coalesce(error_details, 'null'::jsonb) FROM ai_conversation_messages
         WHERE request_xid = $1 AND role = 2 ORDER BY id",
        &[&request],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

async fn wait_for_answer(fx: &Fx, request: uuid::Uuid) -> Vec<(String, serde_json::Value)> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let found = answers(fx, request).await;
        if !found.is_empty() {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no answer stored in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn job_of(fx: &Fx, request: uuid::Uuid) -> job_queue::JobRow {
    let db = fx.pool.get().await.unwrap();
    let id: i64 = db
        .query_one(
            "SELECT id FROM background_jobs WHERE dedupe_key = $1",
            &[&format!("chat_completion:{request}")],
        )
        .await
        .unwrap()
        .get(0);
    job_queue::job_by_id(&**db, id).await.unwrap().unwrap()
}

async fn wait_for_job_state(
    fx: &Fx,
    request: uuid::Uuid,
    state: job_queue::JobState,
) -> job_queue::JobRow {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let job = job_of(fx, request).await;
        if job.state == state {
            return job;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job stuck in {:?}",
            job.state
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Answers with the text it was built with; counts its calls.
struct Fixed {
    text: &'static str,
    calls: AtomicUsize,
}

impl Fixed {
    fn new(text: &'static str) -> Arc<Self> {
        Arc::new(Self {
            text,
            calls: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl ChatResponder for Fixed {
    async fn respond(
        &self,
        _job: &CompletionJob,
        _chunks: ChunkSender,
    ) -> Result<ChatAnswer, ResponderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(ChatAnswer::text(self.text))
    }
}

/// Fails `failures` times with a transient error, then answers.
struct Flaky {
    failures: usize,
    calls: AtomicUsize,
}

#[async_trait]
impl ChatResponder for Flaky {
    async fn respond(
        &self,
        _job: &CompletionJob,
        _chunks: ChunkSender,
    ) -> Result<ChatAnswer, ResponderError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if call < self.failures {
            return Err(ResponderError::Transient("gateway restarting".into()));
        }
        Ok(ChatAnswer::text("answer after a retry"))
    }
}

/// Tells the test it started, then waits for the test's go-ahead before answering.
struct Gated {
    started: mpsc::UnboundedSender<()>,
    go: Arc<Notify>,
    text: &'static str,
}

#[async_trait]
impl ChatResponder for Gated {
    async fn respond(
        &self,
        _job: &CompletionJob,
        _chunks: ChunkSender,
    ) -> Result<ChatAnswer, ResponderError> {
        let _ = self.started.send(());
        self.go.notified().await;
        Ok(ChatAnswer::text(self.text))
    }
}

#[tokio::test]
async fn question_and_job_are_written_together_and_slash_commands_enqueue_nothing() {
    let (fx, user, chat) = world(3).await;
    let request = ask(&chat, user, "What is a pipeline?").await;
    let job = job_of(&fx, request).await;
    assert_eq!(job.kind, "chat_completion");
    assert_eq!(job.max_attempts, 3);
    let payload: CompletionJob = serde_json::from_value(job.payload).unwrap();
    assert_eq!(payload.request_id, request);
    assert_eq!(payload.user_id, user.id);
    assert_eq!(payload.content, "What is a pipeline?");
    assert_eq!(payload.client_subscription_id.as_deref(), Some("tab-1"));

    ask(&chat, user, "/reset").await;
    ask(&chat, user, "/clear").await;
    let db = fx.pool.get().await.unwrap();
    let jobs: i64 = db
        .query_one(
            "SELECT count(*) FROM background_jobs WHERE kind = 'chat_completion'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 1, "/reset and /clear must not enqueue a completion");
}

#[tokio::test]
async fn the_default_responder_answers_not_yet_available_with_a_code() {
    let (fx, user, chat) = world(3).await;
    let worker = start(&fx, Arc::new(jobs::NotYetAvailableResponder), fast());
    let request = ask(&chat, user, "hello?").await;
    let stored = wait_for_answer(&fx, request).await;
    worker.shutdown().await;
    assert_eq!(stored.len(), 1);
    let (content, details) = &stored[0];
    assert_eq!(content, "");
    assert_eq!(details["code"], "A9999");
    let error = details["errors"][0].as_str().unwrap();
    assert!(error.starts_with(jobs::NOT_YET_AVAILABLE), "{error}");
    assert!(
        error.contains("Error code: [A9999](https://docs.example.com"),
        "{error}"
    );
}

#[tokio::test]
async fn a_failed_first_run_is_retried_and_answered_exactly_once() {
    let (fx, user, chat) = world(3).await;
    let responder = Arc::new(Flaky {
        failures: 1,
        calls: AtomicUsize::new(0),
    });
    let worker = start(&fx, responder.clone(), fast());
    let request = ask(&chat, user, "retry me").await;
    let job = wait_for_job_state(&fx, request, job_queue::JobState::Done).await;
    worker.shutdown().await;
    assert_eq!(job.attempts, 2);
    assert_eq!(responder.calls.load(Ordering::SeqCst), 2);
    let stored = answers(&fx, request).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].0, "answer after a retry");
    assert_eq!(stored[0].1, serde_json::Value::Null);
}

#[tokio::test]
async fn the_last_failed_attempt_still_stores_an_a9999_answer() {
    let (fx, user, chat) = world(2).await;
    let responder = Arc::new(Flaky {
        failures: usize::MAX,
        calls: AtomicUsize::new(0),
    });
    let worker = start(&fx, responder.clone(), fast());
    let request = ask(&chat, user, "never works").await;
    let stored = wait_for_answer(&fx, request).await;
    let job = wait_for_job_state(&fx, request, job_queue::JobState::Done).await;
    worker.shutdown().await;
    assert_eq!(job.attempts, 2);
    assert_eq!(responder.calls.load(Ordering::SeqCst), 2);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].1["code"], "A9999");
    let error = stored[0].1["errors"][0].as_str().unwrap();
    assert!(error.contains("Error code: [A9999]"), "{error}");
}

#[tokio::test]
async fn an_answered_request_is_not_answered_again() {
    let (fx, user, chat) = world(3).await;
    let request = ask(&chat, user, "twice?").await;
    let first = Fixed::new("first");
    let worker = start(&fx, first.clone(), fast());
    wait_for_job_state(&fx, request, job_queue::JobState::Done).await;
    worker.shutdown().await;

    // The same job enqueued again (a duplicate delivery) is skipped without calling the responder.
    let db = fx.pool.get().await.unwrap();
    let job = job_of(&fx, request).await;
    job_queue::enqueue_raw(
        &**db,
        "chat_completion",
        &job.payload,
        job_queue::EnqueueOptions::default(),
    )
    .await
    .unwrap();
    let second = Fixed::new("second");
    let worker = start(&fx, second.clone(), fast());
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let pending: i64 = db
            .query_one(
                "SELECT count(*) FROM background_jobs WHERE kind = 'chat_completion' AND state <> 'done'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if pending == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "duplicate job never ran"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;
    assert_eq!(second.calls.load(Ordering::SeqCst), 0);
    let stored = answers(&fx, request).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].0, "first");
}

#[tokio::test]
async fn a_worker_stopped_mid_answer_hands_the_job_to_another() {
    let (fx, user, chat) = world(3).await;
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let blocked = Arc::new(Gated {
        started,
        go: Arc::new(Notify::new()),
        text: "never stored",
    });
    let first = start(
        &fx,
        blocked,
        settings(
            Duration::from_secs(30),
            Duration::from_secs(5),
            Duration::from_millis(50),
        ),
    );
    let request = ask(&chat, user, "long question").await;
    tokio::time::timeout(DEADLINE, started_rx.recv())
        .await
        .unwrap()
        .unwrap();
    // Shutdown gives the running job 50 ms, then releases it.
    first.shutdown().await;
    assert_eq!(
        job_of(&fx, request).await.state,
        job_queue::JobState::Pending
    );
    assert!(answers(&fx, request).await.is_empty());

    let second = start(&fx, Fixed::new("from the second worker"), fast());
    wait_for_job_state(&fx, request, job_queue::JobState::Done).await;
    second.shutdown().await;
    let stored = answers(&fx, request).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].0, "from the second worker");
}

#[tokio::test]
async fn a_run_whose_lease_expired_cannot_store_a_second_answer() {
    let (fx, user, chat) = world(3).await;
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let go = Arc::new(Notify::new());
    let stale = Arc::new(Gated {
        started,
        go: go.clone(),
        text: "stale answer",
    });
    // No heartbeat before the lease runs out: as if this worker had hung.
    let hung = start(
        &fx,
        stale,
        settings(
            Duration::from_millis(300),
            Duration::from_secs(3600),
            Duration::from_secs(10),
        ),
    );
    let request = ask(&chat, user, "who answers?").await;
    tokio::time::timeout(DEADLINE, started_rx.recv())
        .await
        .unwrap()
        .unwrap();

    let rescuer = start(&fx, Fixed::new("rescued answer"), fast());
    let stored = wait_for_answer(&fx, request).await;
    assert_eq!(stored[0].0, "rescued answer");
    rescuer.shutdown().await;

    // The hung run wakes up and finishes; its answer must not be stored.
    go.notify_one();
    hung.shutdown().await;
    let stored = answers(&fx, request).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].0, "rescued answer");
}

#[tokio::test]
async fn the_worker_deletes_idle_threads_periodically() {
    let (fx, user, chat) = world(3).await;
    ask(&chat, user, "an old conversation").await;
    let db = fx.pool.get().await.unwrap();
    db.execute(
        "UPDATE ai_conversation_threads SET last_updated_at = now() - interval '31 days'",
        &[],
    )
    .await
    .unwrap();
    let mut every_tick = fast();
    every_tick.retention_every = Duration::from_millis(200);
    // The question's own completion would refresh the thread: drop that job.
    db.execute("DELETE FROM background_jobs", &[])
        .await
        .unwrap();
    let worker = start(&fx, Fixed::new("unused"), every_tick);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let threads: i64 = db
            .query_one("SELECT count(*) FROM ai_conversation_threads", &[])
            .await
            .unwrap()
            .get(0);
        if threads == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "idle thread never deleted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;
}

#[tokio::test]
async fn two_roles_migrating_a_fresh_database_at_once_both_succeed() {
    let db = devdb::TestDb::with_sql("SELECT 1").await.unwrap();
    let web = monolith::db::pool_for_url(db.url(), 4).unwrap();
    let worker_pool = monolith::db::pool_for_url(db.url(), 4).unwrap();
    let (a, b) = tokio::join!(
        monolith::db::migrate_exclusively(&web),
        monolith::db::migrate_exclusively(&worker_pool)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.min(b) == 0 && a.max(b) > 0, "applied {a} and {b}");
}

/// The next message on `topic`'s receiver, within the deadline.
async fn next_live(
    receiver: &mut tokio::sync::broadcast::Receiver<serde_json::Value>,
) -> monolith::chat::live::LiveMessage {
    let value = tokio::time::timeout(DEADLINE, receiver.recv())
        .await
        .expect("a message in time")
        .unwrap();
    serde_json::from_value(value).unwrap()
}

/// A pub/sub subscriber following `user`'s chats and the `tab-1` client's
/// topic, as a web process does.
struct Listening {
    _subscriber: job_queue::pubsub::Subscriber,
    on_user: tokio::sync::broadcast::Receiver<serde_json::Value>,
    on_client: tokio::sync::broadcast::Receiver<serde_json::Value>,
}

async fn listen(fx: &support::Fx, user: Actor) -> Listening {
    use monolith::chat::live;
    let subscriber = job_queue::pubsub::Subscriber::connect(fx.db.url(), 64)
        .await
        .unwrap();
    Listening {
        on_user: subscriber.subscribe(&live::user_topic(user.id)),
        on_client: subscriber.subscribe(&live::client_topic(user.id, "tab-1")),
        _subscriber: subscriber,
    }
}

/// Submits `question` from the `tab-1` client; its acceptance and the job
/// the worker would run for it.
async fn submitted(
    chat: &ChatService,
    user: Actor,
    question: &str,
) -> (monolith::chat::ChatAccepted, CompletionJob) {
    let accepted = chat
        .submit(
            Some(user),
            ChatRequest {
                content: question.into(),
                client_subscription_id: Some("tab-1".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let job = CompletionJob {
        request_id: accepted.request_id,
        user_id: user.id,
        thread_id: accepted.thread_id,
        content: question.into(),
        client_subscription_id: Some("tab-1".into()),
        ..Default::default()
    };
    (accepted, job)
}

#[tokio::test]
async fn questions_and_answers_are_announced_once_with_the_id_and_time_they_were_stored_with() {
    use monolith::chat::live::{self, LiveMessage};
    let (fx, user, chat) = world(3).await;
    // The subscriber is bound (not `..`): dropping it would end its topics.
    let Listening {
        _subscriber,
        mut on_user,
        mut on_client,
    } = listen(&fx, user).await;
    // A short message is stored and announced by one statement; one too
    // large for a notification goes through a stored payload.
    let long = "a long answer ".repeat(700);
    for (i, content) in ["A short answer.", long.as_str()].into_iter().enumerate() {
        let question = format!("question {i}: {}", &content[..content.len() / 2]);
        let (accepted, job) = submitted(&chat, user, &question).await;
        let echo = next_live(&mut on_user).await;
        let db = fx.pool.get().await.unwrap();
        let asked = db
            .query_one(
                "SELECT id, created_at FROM ai_conversation_messages WHERE request_xid = $1 AND role = 1",
                &[&accepted.request_id],
            )
            .await
            .unwrap();
        assert_eq!(echo.message.content, question);
        assert_eq!(echo.message.id, asked.get::<_, i64>(0), "question {i}");
        assert_eq!(
            echo.message.created_at,
            asked.get::<_, chrono::DateTime<chrono::Utc>>(1),
            "question {i}"
        );
        // A second run of the same job stores and announces nothing.
        for _ in 0..2 {
            jobs::store_and_broadcast(
                &fx.pool,
                &job,
                ChatAnswer::text(content),
                "https://docs.example.com",
                Vec::new(),
            )
            .await
            .unwrap();
        }
        let rows = db
            .query(
                "SELECT id, created_at, message_xid FROM ai_conversation_messages
                 WHERE request_xid = $1 AND role = 2",
                &[&accepted.request_id],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "answer {i}");
        let (id, created_at, xid): (i64, chrono::DateTime<chrono::Utc>, uuid::Uuid) =
            (rows[0].get(0), rows[0].get(1), rows[0].get(2));
        for receiver in [&mut on_user, &mut on_client] {
            let answer = next_live(receiver).await;
            assert_eq!(answer.chunk_id, None);
            assert_eq!(answer.message.id, id, "answer {i}");
            assert_eq!(answer.message.created_at, created_at, "answer {i}");
            assert_eq!(answer.message.message_xid, xid, "answer {i}");
            assert_eq!(answer.message.content, content, "answer {i}");
            assert_eq!(answer.message.request_xid, Some(accepted.request_id));
            assert_eq!(answer.message.thread_id, accepted.thread_id);
        }
        // Nothing else was announced: the next message is this marker.
        let marker =
            LiveMessage::chunk(accepted.thread_id, accepted.request_id, 9, "marker".into());
        live::publish_to_user(&**db, user.id, &marker)
            .await
            .unwrap();
        assert_eq!(next_live(&mut on_user).await.message.content, "marker");
    }
}

#[tokio::test]
async fn the_last_streamed_chunks_reach_the_client_before_the_answer() {
    use monolith::chat::live::LiveMessage;
    let (fx, user, chat) = world(3).await;
    // The subscriber is bound (not `..`): dropping it would end its topics.
    let Listening {
        _subscriber,
        mut on_user,
        mut on_client,
    } = listen(&fx, user).await;
    let long = "a long answer ".repeat(700);
    // One last chunk goes out in the answer's own statement, two or a large
    // answer's go out first: in every case, in order and before the answer.
    for (i, (content, pieces)) in [
        ("A short answer.", 1),
        ("A short answer.", 2),
        (long.as_str(), 1),
    ]
    .into_iter()
    .enumerate()
    {
        let (accepted, job) = submitted(&chat, user, &format!("question {i}")).await;
        next_live(&mut on_user).await;
        let chunks: Vec<LiveMessage> = (1..=pieces)
            .map(|n| {
                LiveMessage::chunk(
                    accepted.thread_id,
                    accepted.request_id,
                    n,
                    format!("piece {n}"),
                )
            })
            .collect();
        jobs::store_and_broadcast(
            &fx.pool,
            &job,
            ChatAnswer::text(content),
            "https://docs.example.com",
            chunks,
        )
        .await
        .unwrap();
        for n in 1..=pieces {
            let chunk = next_live(&mut on_client).await;
            assert_eq!(chunk.chunk_id, Some(n), "answer {i}");
            assert_eq!(chunk.message.content, format!("piece {n}"));
        }
        let answer = next_live(&mut on_client).await;
        assert_eq!(answer.chunk_id, None, "answer {i}");
        assert_eq!(answer.message.content, content);
        // The user's chats get the answer, never a chunk.
        let answer = next_live(&mut on_user).await;
        assert_eq!(answer.chunk_id, None, "answer {i}");
        assert_eq!(answer.message.content, content);
    }
}

#[tokio::test]
async fn a_question_whose_job_cannot_be_queued_is_neither_stored_nor_announced() {
    use monolith::chat::live;
    use monolith::chat::{CompletionQueue, Role, StoredMessage};
    let (fx, user, chat) = world(3).await;
    let Listening {
        _subscriber,
        mut on_user,
        ..
    } = listen(&fx, user).await;
    let (first, _) = submitted(&chat, user, "first question").await;
    let echo = next_live(&mut on_user).await;
    assert_eq!(echo.message.request_xid, Some(first.request_id));

    // A live job already holds the dedupe key the question's job would take.
    let request = uuid::Uuid::new_v4();
    let job = CompletionJob {
        request_id: request,
        user_id: user.id,
        thread_id: first.thread_id,
        content: "second question".into(),
        ..Default::default()
    };
    let queue = PgCompletionQueue { max_attempts: 3 };
    let db = fx.pool.get().await.unwrap();
    monolith::db::enqueue(&*db, &job, queue.options(&job))
        .await
        .unwrap();
    let question = StoredMessage::draft(
        first.thread_id,
        Role::User,
        "second question".into(),
        Some(request),
        None,
        serde_json::json!({}),
    );
    let echo = live::Announcement::to_user(user.id, &question)
        .unwrap()
        .unwrap();
    let stored = monolith::chat::store_question_with_job(
        &*db,
        &question,
        &echo,
        &queue.job_values(&job).unwrap(),
    )
    .await;
    assert!(stored.is_err(), "the duplicate job fails the statement");

    let kept: i64 = db
        .query_one(
            "SELECT count(*) FROM ai_conversation_messages WHERE request_xid = $1",
            &[&request],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 0, "no question stored without its job");
    let jobs: i64 = db
        .query_one(
            "SELECT count(*) FROM background_jobs WHERE dedupe_key = $1",
            &[&format!("chat_completion:{request}")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 1, "only the job that was there");
    // Notifications arrive in commit order: the next one is the third
    // question's, so the failed statement announced nothing.
    let (third, _) = submitted(&chat, user, "third question").await;
    let next = next_live(&mut on_user).await;
    assert_eq!(next.message.request_xid, Some(third.request_id));
}

#[tokio::test]
async fn the_answers_statements_stay_prepared_on_the_workers_connection() {
    use monolith::chat::live::LiveMessage;
    let (fx, user, chat) = world(3).await;
    // One connection, so what the answer left prepared is on the one we ask.
    let pool = monolith::db::pool_for_url(fx.db.url(), 1).unwrap();
    // One last chunk travels in the answer's statement; two go out first,
    // each its own notification.
    for last_chunks in [1, 2] {
        let (_, job) = submitted(&chat, user, "a question").await;
        let chunks = (1..=last_chunks)
            .map(|i| LiveMessage::chunk(job.thread_id, job.request_id, i, "piece".into()))
            .collect();
        jobs::store_and_broadcast(
            &pool,
            &job,
            ChatAnswer::text("piece piece"),
            "https://docs.example.com",
            chunks,
        )
        .await
        .unwrap();
    }
    // A statement prepared per use is closed after it; a cached one stays:
    // an answer's statements are parsed and planned once per connection.
    let statements: Vec<String> = pool
        .get()
        .await
        .unwrap()
        .query("SELECT statement FROM pg_prepared_statements", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.get(0))
        .collect();
    assert!(
        statements
            .iter()
            .any(|s| s.contains("pg_notify") && s.contains("INSERT INTO ai_conversation_messages")),
        "the answer's statement is kept prepared: {statements:?}"
    );
    assert!(
        statements
            .iter()
            .any(|s| s.trim() == "SELECT pg_notify($1, $2)"),
        "the chunks' statement is kept prepared: {statements:?}"
    );
}

/// Streams the pieces its question names (`fast`: three at once; `slow`:
/// one, then another after a pause), then answers with their text.
struct Streaming;

#[async_trait]
impl ChatResponder for Streaming {
    async fn respond(
        &self,
        job: &CompletionJob,
        chunks: ChunkSender,
    ) -> Result<ChatAnswer, ResponderError> {
        let script: &[(u64, &str)] = if job.content == "fast" {
            &[(0, "a"), (0, "b"), (0, "c")]
        } else {
            &[(0, "first "), (400, "second")]
        };
        let mut text = String::new();
        for (pause_ms, piece) in script {
            tokio::time::sleep(Duration::from_millis(*pause_ms)).await;
            let _ = chunks.send((*piece).to_owned());
            text.push_str(piece);
        }
        Ok(ChatAnswer::text(text))
    }
}

#[tokio::test]
async fn a_fast_answer_goes_out_whole_and_a_slow_ones_first_chunk_goes_out_early() {
    let (fx, user, chat) = world(3).await;
    let Listening {
        _subscriber,
        mut on_user,
        mut on_client,
    } = listen(&fx, user).await;
    let worker = start(&fx, Arc::new(Streaming), fast());

    // Made within the first chunk's hold: one chunk with all of it, then
    // the answer (before, the first piece went out alone at once).
    let fast = ask(&chat, user, "fast").await;
    let chunk = next_live(&mut on_client).await;
    assert_eq!(chunk.message.request_xid, Some(fast));
    assert_eq!(chunk.chunk_id, Some(1));
    assert_eq!(chunk.message.content, "abc");
    let answer = next_live(&mut on_client).await;
    assert_eq!(answer.chunk_id, None);
    assert_eq!(answer.message.content, "abc");

    // A model that pauses after its first piece: that piece is not held
    // until the answer is done.
    let slow = ask(&chat, user, "slow").await;
    let first = next_live(&mut on_client).await;
    let first_at = tokio::time::Instant::now();
    assert_eq!(first.message.request_xid, Some(slow));
    assert_eq!(
        (first.chunk_id, first.message.content.as_str()),
        (Some(1), "first ")
    );
    let second = next_live(&mut on_client).await;
    assert_eq!(
        (second.chunk_id, second.message.content.as_str()),
        (Some(2), "second")
    );
    let answer = next_live(&mut on_client).await;
    assert_eq!(answer.chunk_id, None);
    assert_eq!(answer.message.content, "first second");
    assert!(
        first_at.elapsed() >= Duration::from_millis(200),
        "the first chunk came {:?} before the answer",
        first_at.elapsed()
    );
    // The user's chats saw the two questions and answers only.
    for _ in 0..4 {
        assert_eq!(next_live(&mut on_user).await.chunk_id, None);
    }
    worker.shutdown().await;
}

#[tokio::test]
async fn touching_a_thread_leaves_its_indexes_alone() {
    // Every question and answer sets its thread's `last_updated_at`: with
    // that column in no index, PostgreSQL can make the touch a heap-only
    // update (no new index entries, twice per answer).
    let (fx, user, chat) = world(3).await;
    let db = fx.pool.get().await.unwrap();
    let indexed: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_index i
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
             WHERE i.indrelid = 'ai_conversation_threads'::regclass
               AND a.attname = 'last_updated_at'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(indexed, 0);
    // The user's newest thread is still the one a question continues.
    let first = ask(&chat, user, "first").await;
    let second = ask(&chat, user, "second").await;
    let threads: Vec<i64> = db
        .query(
            "SELECT DISTINCT thread_id FROM ai_conversation_messages WHERE request_xid = ANY($1)",
            &[&vec![first, second]],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(threads.len(), 1, "{threads:?}");
}

/// The usage record a recording attaches to an answer, for `job` (no page
/// resource).
fn usage_of(
    job: &CompletionJob,
    total_ms: i32,
    error_code: Option<&str>,
    slash_command: Option<&str>,
    categorize: bool,
) -> Arc<monolith::ai_usage::UsageRecord> {
    let facts = monolith::ai_usage::store::QuestionFacts {
        request_id: job.request_id,
        thread_id: job.thread_id,
        user_id: job.user_id,
        container: None,
        at: chrono::Utc::now(),
        slash_command: slash_command.map(str::to_owned),
        tools: vec!["issue_reader".into()],
        error_code: error_code.map(str::to_owned),
        input_tokens: 3,
        output_tokens: 4,
        tokens_estimated: true,
        first_token_ms: Some(1),
        total_ms,
    };
    let categorize =
        categorize.then(|| monolith::ai_usage::categorize::job_values(job.request_id).unwrap());
    Arc::new(monolith::ai_usage::UsageRecord::new(facts, categorize))
}

/// An answer's usage record is written by the run whose answer is stored, in the
/// answer's own statement when the answer travels in one (the same
/// transaction id on both rows), after it otherwise; a run whose answer
/// lost leaves the record alone; a failed attempt's record is updated, not
/// doubled, and queues no second categorisation; a record the table refuses
/// never costs the answer.
#[tokio::test]
async fn an_answers_usage_is_recorded_by_the_run_that_stores_it() {
    use monolith::chat::live::LiveMessage;
    let (fx, user, chat) = world(3).await;
    let Listening {
        _subscriber,
        mut on_client,
        ..
    } = listen(&fx, user).await;
    let db = fx.pool.get().await.unwrap();
    let long = "a long answer ".repeat(700);
    // (answer, an inline last chunk, categorised, a failed attempt's record first)
    let cases = [
        ("A short answer.", false, true, false),
        ("A short answer.", true, false, false),
        (long.as_str(), false, true, false),
        ("A short answer.", false, true, true),
        ("A short answer.", true, true, true),
    ];
    for (i, (content, with_chunk, categorize, failed_first)) in cases.into_iter().enumerate() {
        let (accepted, job) = submitted(&chat, user, &format!("question {i}")).await;
        if failed_first {
            use monolith::chat::completion::AnswerRecord;
            usage_of(&job, 5, Some("A9999"), None, categorize)
                .write_alone(&fx.pool)
                .await;
        }
        for run in 0..2 {
            let mut answer = ChatAnswer::text(content);
            answer.record = Some(usage_of(&job, 100 + run, None, None, categorize));
            let chunks = if with_chunk {
                vec![LiveMessage::chunk(
                    accepted.thread_id,
                    accepted.request_id,
                    1,
                    "piece".into(),
                )]
            } else {
                Vec::new()
            };
            jobs::store_and_broadcast(&fx.pool, &job, answer, "https://docs.example.com", chunks)
                .await
                .unwrap();
            // A losing run's chunk still goes out; its answer does not.
            if with_chunk {
                assert_eq!(
                    next_live(&mut on_client).await.chunk_id,
                    Some(1),
                    "case {i}"
                );
            }
            if run == 0 {
                let stored = next_live(&mut on_client).await;
                assert_eq!(stored.chunk_id, None, "case {i}");
                assert_eq!(stored.message.content, content, "case {i}");
            }
        }
        let row = db
            .query_one(
                "SELECT (SELECT count(*) FROM ai_conversation_messages WHERE request_xid = $1 AND role = 2),
                        (SELECT count(*) FROM ai_chat_question_usage WHERE request_id = $1),
                        (SELECT count(*) FROM ai_usage_events e JOIN ai_chat_question_usage q ON q.event_id = e.id
                          WHERE q.request_id = $1),
                        (SELECT total_ms FROM ai_chat_question_usage WHERE request_id = $1),
                        (SELECT error_code FROM ai_chat_question_usage WHERE request_id = $1),
                        (SELECT xmin::text FROM ai_conversation_messages WHERE request_xid = $1 AND role = 2)
                          = (SELECT xmin::text FROM ai_chat_question_usage WHERE request_id = $1),
                        (SELECT count(*) FROM background_jobs
                          WHERE kind = 'ai_categorize_question' AND dedupe_key = 'ai_categorize:' || $1::text)",
                &[&accepted.request_id],
            )
            .await
            .unwrap();
        let (answers, records, events, total_ms, error_code, same_transaction, categorisations): (
            i64,
            i64,
            i64,
            i32,
            Option<String>,
            bool,
            i64,
        ) = (
            row.get(0),
            row.get(1),
            row.get(2),
            row.get(3),
            row.get(4),
            row.get(5),
            row.get(6),
        );
        assert_eq!((answers, records, events), (1, 1, 1), "case {i}");
        assert_eq!(total_ms, 100, "case {i}: the stored answer's run wrote it");
        assert_eq!(
            error_code, None,
            "case {i}: the answer's facts replaced the failure's"
        );
        assert_eq!(
            same_transaction,
            content.len() < 1000,
            "case {i}: a small answer and its record are one statement"
        );
        assert_eq!(categorisations, i64::from(categorize), "case {i}");
    }

    // A record the table refuses (a slash command of a shape it does not
    // take): the answer is stored and announced all the same, unrecorded.
    let (accepted, job) = submitted(&chat, user, "refused record").await;
    let mut answer = ChatAnswer::text("Still answered.");
    answer.record = Some(usage_of(&job, 7, None, Some("/Not A Command"), true));
    jobs::store_and_broadcast(
        &fx.pool,
        &job,
        answer,
        "https://docs.example.com",
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        next_live(&mut on_client).await.message.content,
        "Still answered."
    );
    let row = db
        .query_one(
            "SELECT (SELECT count(*) FROM ai_conversation_messages WHERE request_xid = $1 AND role = 2),
                    (SELECT count(*) FROM ai_chat_question_usage WHERE request_id = $1),
                    (SELECT count(*) FROM background_jobs WHERE kind = 'ai_categorize_question'
                      AND dedupe_key = 'ai_categorize:' || $1::text)",
            &[&accepted.request_id],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2)
        ),
        (1, 0, 0)
    );
}
