//! `ai_workflows` tokens: minted by `direct_access` (with a token from the
//! workflow service), two hours long, hashed at rest, revocable, accepted on
//! the workflow endpoints only; composite identity needs both identities.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};

use crate::rest_support::{get, post};
use crate::workflows_rest::normalize;
use crate::workflows_support::{fake_service, setup, world};

const INSUFFICIENT: &str = "insufficient_scope";

#[tokio::test]
async fn direct_access_mints_a_workflow_token_and_a_service_token() {
    let service = fake_service::start(fake_service::Script::Relay).await;
    let w = setup().await.start(Some(service), &[]).await;
    let (status, access) = post(
        &w.server,
        "/ai/duo_workflows/direct_access",
        &w.dev_token,
        json!({ "workflow_definition": "software_development", "project_id": w.project }),
    )
    .await;
    assert_eq!(status, 201, "{access}");
    let token = access["gitlab_rails"]["token"].as_str().unwrap().to_owned();
    let global_user = access["duo_workflow_service"]["headers"]["X-Gitlab-Global-User-Id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        access["duo_workflow_service"]["token"],
        format!("service-token-for-{global_user}")
    );
    // The service was asked with the user's cloud-connector headers.
    let seen = w
        .service
        .as_ref()
        .unwrap()
        .seen
        .lock()
        .unwrap()
        .token_calls
        .clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0]["authorization"].starts_with("Bearer ey"));
    assert_eq!(seen[0]["x-gitlab-authentication-type"], "oidc");
    assert_eq!(seen[0]["x-gitlab-realm"], "self-managed");
    // Two hours, as GitLab's.
    let expires: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(access["gitlab_rails"]["token_expires_at"].clone()).unwrap();
    let lifetime = expires - chrono::Utc::now();
    assert!(lifetime > chrono::Duration::minutes(119) && lifetime <= chrono::Duration::hours(2));
    // Stored as a digest only.
    let c = w.fx.pool.get().await.unwrap();
    let rows = c
        .query("SELECT token_digest, scopes FROM oauth_access_tokens", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let digest: Vec<u8> = rows[0].get(0);
    assert_ne!(digest, token.as_bytes());
    assert_eq!(rows[0].get::<_, Vec<String>>(1), vec!["ai_workflows"]);

    insta::assert_json_snapshot!("direct_access", normalize_access(access));

    // Accepted on the workflow endpoints...
    let id = w.workflow(&w.dev_token, json!({})).await;
    let (status, _) = get(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}"),
        &token,
    )
    .await;
    assert_eq!(status, 200);
    // ...and refused elsewhere with GitLab's insufficient-scope answer.
    for path in [
        "/user",
        &format!("/projects/{}", w.project),
        "/ai/duo_workflows/workflows",
    ] {
        let (status, body) = get(&w.server, path, &token).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (403, Some(INSUFFICIENT)),
            "{path}"
        );
    }
    let (status, body) = post(
        &w.server,
        "/ai/duo_workflows/workflows",
        &token,
        json!({"project_id": w.project}),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (403, Some(INSUFFICIENT)));
    let graphql = reqwest::Client::new()
        .post(w.server.url("/api/graphql"))
        .bearer_auth(&token)
        .json(&json!({"query": "{ currentUser { username } }"}))
        .send()
        .await
        .unwrap();
    assert_eq!(graphql.status(), 403);

    // Revoked: 401 from then on; revoking again finds nothing.
    let (status, _) = post(
        &w.server,
        "/ai/duo_workflows/revoke_token",
        &token,
        json!({"token": token}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = get(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}"),
        &token,
    )
    .await;
    assert_eq!(
        (status, body),
        (401, json!({"message": "401 Unauthorized"}))
    );
    let (status, _) = post(
        &w.server,
        "/ai/duo_workflows/revoke_token",
        &w.dev_token,
        json!({"token": token}),
    )
    .await;
    assert_eq!(status, 401);
}

fn normalize_access(mut v: Value) -> Value {
    if let Some(h) = v["duo_workflow_service"]["headers"].as_object_mut() {
        for key in ["X-Gitlab-Global-User-Id", "X-Gitlab-Instance-Id"] {
            h.insert(key.into(), json!(format!("[{key}]")));
        }
    }
    normalize(v)
}

#[tokio::test]
async fn tokens_expire_and_belong_to_their_owner() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;
    let path = format!("/ai/duo_workflows/workflows/{id}");
    assert_eq!(get(&w.server, &path, &token).await.0, 200);
    // Someone else cannot revoke it.
    let (status, body) = post(
        &w.server,
        "/ai/duo_workflows/revoke_token",
        &w.other_token,
        json!({"token": token}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    w.fx.exec(
        "UPDATE oauth_access_tokens SET expires_at = now() - interval '1 second'",
        &[],
    )
    .await;
    assert_eq!(get(&w.server, &path, &token).await.0, 401);
    // Missing token parameter.
    let (status, body) = post(
        &w.server,
        "/ai/duo_workflows/revoke_token",
        &w.dev_token,
        json!({}),
    )
    .await;
    assert_eq!((status, body), (400, json!({"error": "token is missing"})));
}

#[tokio::test]
async fn direct_access_without_a_service_is_a_bad_gateway_and_mints_nothing() {
    let w = world().await;
    let (status, body) = post(
        &w.server,
        "/ai/duo_workflows/direct_access",
        &w.dev_token,
        json!({}),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(
        w.fx.id("SELECT count(*) FROM oauth_access_tokens", &[])
            .await,
        0
    );
    // No seat: refused before the service is asked.
    let seatless = w.fx.user("seatless").await;
    let t = w.fx.token(seatless, &["api"]).await;
    let (status, _) = post(&w.server, "/ai/duo_workflows/direct_access", &t, json!({})).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn composite_identity_needs_both_the_user_and_the_service_account() {
    let w = world().await;
    let bot = w.fx.user("duo-developer").await;
    w.fx.exec(
        "UPDATE users SET service_account = true WHERE id = $1",
        &[&bot.id],
    )
    .await;
    w.fx.project_member(w.project, bot, 30).await;
    w.fx.exec(
        "UPDATE instance_settings SET duo_workflow_service_account_id = $1",
        &[&bot.id],
    )
    .await;
    // A remote (ambient) flow runs as the service account for the user.
    let id = w
        .workflow(&w.dev_token, json!({"environment": "ambient"}))
        .await;
    let sa: Option<i64> =
        w.fx.pool
            .get()
            .await
            .unwrap()
            .query_one(
                "SELECT service_account_id FROM duo_workflows_workflows WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get(0);
    assert_eq!(sa, Some(bot.id));
    let c = w.fx.pool.get().await.unwrap();
    let composite = monolith::identity::oauth::mint_composite(
        &**c,
        bot.id,
        w.dev.id,
        monolith::identity::oauth::COMPOSITE_TOKEN_LIFETIME,
    )
    .await
    .unwrap();
    let scopes: Vec<String> = c
        .query_one(
            "SELECT scopes FROM oauth_access_tokens WHERE id = $1",
            &[&composite.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        scopes,
        vec!["ai_workflows".to_owned(), format!("user:{}", w.dev.id)]
    );
    let path = format!("/ai/duo_workflows/workflows/{id}");
    // Both allowed: the request runs as the user (their workflow is found).
    let (status, _) = post(
        &w.server,
        &format!("{path}/events"),
        &composite.token,
        json!({"event_type": "message", "message": "from the bot"}),
    )
    .await;
    assert_eq!(status, 201);
    let audit = c
        .query(
            "SELECT user_id, service_account_id FROM duo_workflows_audit_events WHERE workflow_id = $1 AND action = 'duo_session_created'",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(audit[0].get::<_, i64>(0), w.dev.id);
    assert_eq!(audit[0].get::<_, Option<i64>>(1), Some(bot.id));
    let (status, body) = send_patch(&w, &path, &composite.token, "start").await;
    assert_eq!(status, 200, "{body}");
    let changed = c
        .query_one(
            "SELECT user_id, service_account_id FROM duo_workflows_audit_events WHERE workflow_id = $1 AND action = 'duo_session_status_changed'",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (changed.get::<_, i64>(0), changed.get::<_, Option<i64>>(1)),
        (w.dev.id, Some(bot.id))
    );

    // The service account loses its access: refused although the user may.
    w.fx.exec("DELETE FROM project_members WHERE user_id = $1", &[&bot.id])
        .await;
    assert_eq!(get(&w.server, &path, &composite.token).await.0, 403);
    assert_eq!(get(&w.server, &path, &w.dev_token).await.0, 200);
    // The service account may again, the user loses their seat: refused.
    w.fx.project_member(w.project, bot, 30).await;
    assert_eq!(get(&w.server, &path, &composite.token).await.0, 200);
    w.fx.exec(
        "DELETE FROM add_on_seat_assignments WHERE user_id = $1",
        &[&w.dev.id],
    )
    .await;
    assert_eq!(get(&w.server, &path, &composite.token).await.0, 403);
}

async fn send_patch(
    w: &crate::workflows_support::World,
    path: &str,
    token: &str,
    event: &str,
) -> (u16, Value) {
    let reply = crate::rest_support::send(
        &w.server,
        reqwest::Method::PATCH,
        path,
        Some(token),
        Some(json!({ "status_event": event })),
    )
    .await;
    (reply.status, reply.body)
}

#[tokio::test]
async fn direct_access_is_rate_limited_per_user() {
    let w = crate::workflows_support::setup()
        .await
        .start(None, &[("DUO_WORKFLOW_DIRECT_ACCESS_RATE_LIMIT", "2")])
        .await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(
            post(
                &w.server,
                "/ai/duo_workflows/direct_access",
                &w.dev_token,
                json!({}),
            )
            .await,
        );
    }
    // The service is down here: the first two reach it (502), the third is refused first.
    assert_eq!(statuses[0].0, 502);
    assert_eq!(statuses[1].0, 502);
    assert_eq!(
        statuses[2],
        (
            429,
            json!({"message": {"error": "This endpoint has been requested too many times. Try again later."}})
        )
    );
    // Another user has their own budget.
    let (status, _) = post(
        &w.server,
        "/ai/duo_workflows/direct_access",
        &w.other_token,
        json!({}),
    )
    .await;
    assert_eq!(status, 502);
}

/// A composite identity reads only what both identities may read, and what
/// it writes is authored by the service account on behalf of the human.
#[tokio::test]
async fn composite_identity_reads_what_both_may_and_writes_as_the_service_account() {
    let w = world().await;
    let bot = w.fx.user("duo-developer").await;
    w.fx.exec(
        "UPDATE users SET service_account = true WHERE id = $1",
        &[&bot.id],
    )
    .await;
    w.fx.project_member(w.project, bot, 30).await;
    // A second private project the human is in and the service account is not.
    let secret = w.fx.project(w.group, "secret", "private").await;
    w.fx.project_member(secret, w.dev, 30).await;
    let secret_issue = w.fx.issue(secret, w.dev, false).await;
    let issue = w.fx.issue(w.project, w.dev, false).await;
    let c = w.fx.pool.get().await.unwrap();
    let mut iids = Vec::new();
    for id in [issue, secret_issue] {
        let row = c
            .query_one("SELECT iid FROM issues WHERE id = $1", &[&id])
            .await
            .unwrap();
        iids.push(row.get::<_, i32>(0));
    }
    let (issue_iid, secret_iid) = (iids[0], iids[1]);
    let composite = monolith::identity::oauth::mint_composite(
        &**c,
        bot.id,
        w.dev.id,
        monolith::identity::oauth::COMPOSITE_TOKEN_LIFETIME,
    )
    .await
    .unwrap();

    // The human may read the secret issue; the composite identity may not,
    // and the answer does not say it exists.
    let secret_path = format!("/projects/{secret}/issues/{secret_iid}");
    let own = w.fx.token(w.dev, &["api"]).await;
    assert_eq!(get(&w.server, &secret_path, &own).await.0, 200);
    let (status, _) = get(&w.server, &secret_path, &composite.token).await;
    assert_eq!(status, 404);
    let (status, _) = post(
        &w.server,
        &format!("{secret_path}/notes"),
        &composite.token,
        json!({"body": "should not land"}),
    )
    .await;
    assert_eq!(status, 404);

    // Where both may, the note is written by the service account for the human.
    let (status, note) = post(
        &w.server,
        &format!("/projects/{}/issues/{issue_iid}/notes", w.project),
        &composite.token,
        json!({"body": "Found the cause."}),
    )
    .await;
    assert_eq!(status, 201, "{note}");
    assert_eq!(note["author"]["username"], "duo-developer");
    let stored = c
        .query_one(
            "SELECT author_id, on_behalf_of_user_id FROM notes WHERE id = $1",
            &[&note["id"].as_i64().unwrap()],
        )
        .await
        .unwrap();
    assert_eq!(
        (stored.get::<_, i64>(0), stored.get::<_, Option<i64>>(1)),
        (bot.id, Some(w.dev.id))
    );
    let notes_left: i64 = c
        .query_one(
            "SELECT count(*) FROM notes WHERE body = 'should not land'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(notes_left, 0);
}
