//! Feature flags: GitLab's Features API (admins only, GitLab's shapes, bad
//! input refused), gates deciding per actor, the admin page, and a flag
//! turned off through the API taking a tool away from the next question.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use contracts::AgentEvent;
use monolith::features::{self, FlagActor};
use monolith::policy::access;
use serde_json::{Value, json};

use crate::agent_support::Bench;
use crate::rest_support::{delete, get, post, send};
use crate::support::{Fx, Server};
use crate::web_sign_in::{set_password, signed_in};

const COMMIT_FLAG: &str = "ai_commit_reader_for_chat";

/// A world with an admin, a user, a group `acme` and its project `acme/site`.
struct World {
    fx: Fx,
    server: Server,
    admin_token: String,
    user_token: String,
    alice: i64,
    group: i64,
    project: i64,
}

async fn world() -> World {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let alice = fx.user("alice").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    let project = fx.project(group, "site", "private").await;
    fx.group_member(group, alice, access::DEVELOPER).await;
    let server = Server::start(&fx).await;
    let admin_token = fx.token(root, &["api"]).await;
    let user_token = fx.token(alice, &["api"]).await;
    World {
        fx,
        server,
        admin_token,
        user_token,
        alice: alice.id,
        group,
        project,
    }
}

#[tokio::test]
async fn only_admins_may_read_or_change_flags() {
    let w = world().await;
    let s = &w.server;
    for (method, path) in [
        (reqwest::Method::GET, "/features"),
        (reqwest::Method::POST, "/features/some_flag"),
        (reqwest::Method::DELETE, "/features/some_flag"),
    ] {
        let body = (method == reqwest::Method::POST).then(|| json!({"value": true}));
        let anonymous = send(s, method.clone(), path, None, body.clone()).await;
        assert_eq!(anonymous.status, 401, "{method} {path} anonymous");
        let user = send(s, method.clone(), path, Some(&w.user_token), body.clone()).await;
        assert_eq!(user.status, 403, "{method} {path} non-admin");
    }
    // Nothing was set by the refused calls.
    let (status, list) = get(s, "/features", &w.admin_token).await;
    assert_eq!((status, list), (200, json!([])));
    // An admin's read-only token reads but does not write.
    let root = w.fx.admin("root2").await;
    let read_only = w.fx.token(root, &["read_api"]).await;
    assert_eq!(get(s, "/features", &read_only).await.0, 200);
    let (status, _) = post(s, "/features/some_flag", &read_only, json!({"value": true})).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn admins_set_list_and_delete_flags_in_gitlabs_shapes() {
    let w = world().await;
    let (s, t) = (&w.server, w.admin_token.as_str());

    let (status, on) = post(s, "/features/new_library", t, json!({"value": true})).await;
    assert_eq!(status, 201, "{on}");
    insta::assert_json_snapshot!("set_boolean", on);

    // A percentage of time (the default key), as form parameters too.
    let res = reqwest::Client::new()
        .post(s.url("/api/v4/features/slow_rollout"))
        .bearer_auth(t)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("value=30")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let time: Value = res.json().await.unwrap();
    assert_eq!(time["state"], "conditional");
    assert_eq!(
        time["gates"],
        json!([{"key": "boolean", "value": false}, {"key": "percentage_of_time", "value": 30}])
    );

    let body = json!({"value": 25, "key": "percentage_of_actors"});
    let (status, actors) = post(s, "/features/by_actor", t, body).await;
    assert_eq!(
        (status, actors["state"].as_str()),
        (201, Some("conditional"))
    );

    let body = json!({"value": "true", "user": "alice", "project": "acme/site", "group": "acme"});
    let (status, targeted) = post(s, "/features/ai_commit_reader_for_chat", t, body).await;
    assert_eq!(status, 201, "{targeted}");
    insta::assert_json_snapshot!("set_actors", targeted);

    let (status, list) = get(s, "/features", t).await;
    assert_eq!(status, 200);
    insta::assert_json_snapshot!("list", list);

    // Removing one actor keeps the others; `false` without actors clears all.
    let body = json!({"value": false, "user": "alice"});
    let (_, fewer) = post(s, "/features/ai_commit_reader_for_chat", t, body).await;
    assert_eq!(
        fewer["gates"][1],
        json!({"key": "actors", "value": [format!("Group:{}", w.group), format!("Project:{}", w.project)]})
    );
    let (_, off) = post(
        s,
        "/features/ai_commit_reader_for_chat",
        t,
        json!({"value": false}),
    )
    .await;
    assert_eq!(off["state"], "off");
    assert_eq!(off["gates"], json!([{"key": "boolean", "value": false}]));
    // 0 is off too, as GitLab reads it.
    let (_, zero) = post(s, "/features/new_library", t, json!({"value": 0})).await;
    assert_eq!(zero["state"], "off");

    let (status, _) = delete(s, "/features/new_library", t).await;
    assert_eq!(status, 204);
    let (status, _) = delete(s, "/features/never_set", t).await;
    assert_eq!(status, 204);
    let (_, list) = get(s, "/features", t).await;
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec!["ai_commit_reader_for_chat", "by_actor", "slow_rollout"]
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_a_reason() {
    let w = world().await;
    let (s, t) = (&w.server, w.admin_token.as_str());
    let cases = [
        (
            "Bad-Name",
            json!({"value": true}),
            "feature flag name is invalid",
        ),
        (
            "1flag",
            json!({"value": true}),
            "feature flag name is invalid",
        ),
        ("ok_flag", json!({}), "value is missing"),
        ("ok_flag", json!({"value": "maybe"}), "value must be"),
        ("ok_flag", json!({"value": 101}), "value must be"),
        ("ok_flag", json!({"value": -5}), "value must be"),
        ("ok_flag", json!({"value": 2.5}), "value must be"),
        (
            "ok_flag",
            json!({"value": 10, "key": "percentage_of_things"}),
            "key does not have a valid value",
        ),
        (
            "ok_flag",
            json!({"value": true, "key": "boolean"}),
            "key does not have a valid value",
        ),
        (
            "ok_flag",
            json!({"value": true, "user": "nobody"}),
            "user nobody is not found",
        ),
        (
            "ok_flag",
            json!({"value": true, "group": "nowhere"}),
            "group nowhere is not found",
        ),
        (
            "ok_flag",
            json!({"value": true, "namespace": "nowhere"}),
            "namespace nowhere is not found",
        ),
        (
            "ok_flag",
            json!({"value": true, "project": "acme/nothing"}),
            "project acme/nothing is not found",
        ),
        (
            "ok_flag",
            json!({"value": true, "feature_group": "everyone_nice"}),
            "unknown feature group: everyone_nice",
        ),
        (
            "ok_flag",
            json!({"value": 10, "user": "alice"}),
            "a percentage applies to every actor",
        ),
    ];
    for (name, body, reason) in cases {
        let (status, answer) = post(s, &format!("/features/{name}"), t, body.clone()).await;
        assert_eq!(status, 400, "{name} {body}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains(reason), "{name} {body}: {error}");
    }
    let (status, _) = delete(s, "/features/Bad-Name", t).await;
    assert_eq!(status, 400);
    // Nothing was stored by the refused calls.
    assert_eq!(get(s, "/features", t).await.1, json!([]));
}

#[tokio::test]
async fn gates_decide_per_actor_and_percentage_of_actors_is_stable() {
    let w = world().await;
    let (s, t) = (&w.server, w.admin_token.as_str());
    let bob = w.fx.user("bob").await;
    let db = w.fx.pool.get().await.unwrap();
    let alice = FlagActor::User {
        id: w.alice,
        admin: false,
    };
    let bob = FlagActor::User {
        id: bob.id,
        admin: false,
    };

    // Defaults until set: known flags as the registry says, unknown ones off.
    assert!(
        features::enabled(&**db, COMMIT_FLAG, &[alice])
            .await
            .unwrap()
    );
    assert!(
        !features::enabled(&**db, "beta_thing", &[alice])
            .await
            .unwrap()
    );

    post(
        s,
        "/features/beta_thing",
        t,
        json!({"value": true, "user": "alice"}),
    )
    .await;
    assert!(
        features::enabled(&**db, "beta_thing", &[alice])
            .await
            .unwrap()
    );
    assert!(
        !features::enabled(&**db, "beta_thing", &[bob])
            .await
            .unwrap()
    );
    // A project gate: on for anyone asking about that project.
    post(
        s,
        "/features/beta_thing",
        t,
        json!({"value": true, "project": "acme/site"}),
    )
    .await;
    let about_project = [bob, FlagActor::Project(w.project)];
    assert!(
        features::enabled(&**db, "beta_thing", &about_project)
            .await
            .unwrap()
    );
    assert_eq!(
        features::enabled_flags(&**db, &about_project)
            .await
            .unwrap(),
        vec![
            "ai_codebase_search_for_chat",
            "ai_commit_reader_for_chat",
            "beta_thing"
        ]
    );
    // A feature group.
    post(
        s,
        "/features/admins_only",
        t,
        json!({"value": true, "feature_group": "instance_admins"}),
    )
    .await;
    let root = FlagActor::User { id: 1, admin: true };
    assert!(
        features::enabled(&**db, "admins_only", &[root])
            .await
            .unwrap()
    );
    assert!(
        !features::enabled(&**db, "admins_only", &[alice])
            .await
            .unwrap()
    );

    // Half of the actors, always the same half.
    post(
        s,
        "/features/half",
        t,
        json!({"value": 50, "key": "percentage_of_actors"}),
    )
    .await;
    let actors: Vec<FlagActor> = (1..=200)
        .map(|id| FlagActor::User { id, admin: false })
        .collect();
    let mut first = Vec::new();
    for actor in &actors {
        first.push(features::enabled(&**db, "half", &[*actor]).await.unwrap());
    }
    for _ in 0..3 {
        for (actor, was) in actors.iter().zip(&first) {
            assert_eq!(
                features::enabled(&**db, "half", &[*actor]).await.unwrap(),
                *was
            );
        }
    }
    let on = first.iter().filter(|b| **b).count();
    assert!((60..=140).contains(&on), "{on} of 200");

    // Deleting returns a known flag to its default.
    post(
        s,
        "/features/ai_commit_reader_for_chat",
        t,
        json!({"value": false}),
    )
    .await;
    assert!(
        !features::enabled(&**db, COMMIT_FLAG, &[alice])
            .await
            .unwrap()
    );
    delete(s, "/features/ai_commit_reader_for_chat", t).await;
    assert!(
        features::enabled(&**db, COMMIT_FLAG, &[alice])
            .await
            .unwrap()
    );
}

const FLAGS_PAGE: &str = "/admin/feature_flags";

#[tokio::test]
async fn the_admin_page_lists_flags_and_turns_them_on_and_off() {
    let w = world().await;
    let root = w.fx.admin("pageadmin").await;
    set_password(&w.fx, root.id, "correct horse battery").await;
    set_password(&w.fx, w.alice, "correct horse battery").await;
    let admin = signed_in(&w.server, "pageadmin", "correct horse battery").await;
    let (status, html) = admin.page(FLAGS_PAGE).await;
    assert_eq!(status, 200);
    assert!(
        html.contains("href=\"/admin/feature_flags\""),
        "in the admin navigation"
    );
    assert!(
        html.contains("data-flag=\"ai_commit_reader_for_chat\" data-state=\"on\""),
        "{html}"
    );
    assert!(html.contains("not set (default)"));
    assert!(html.contains("Duo Chat may read commits"));
    assert!(
        html.contains(&format!("value=\"{}\"", admin.csrf)),
        "the form carries the session's token"
    );
    // Without the form token, or with a wrong one: refused, nothing changed.
    for token in [None, Some("wrong")] {
        let mut fields = vec![("name", COMMIT_FLAG), ("action", "off")];
        fields.extend(token.map(|t| ("authenticity_token", t)));
        let res = admin
            .browser
            .post(admin.url(FLAGS_PAGE))
            .form(&fields)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 403, "token {token:?}");
    }
    assert_eq!(
        get(&w.server, "/features", &w.admin_token).await.1,
        json!([])
    );

    let res = admin
        .post_form(FLAGS_PAGE, &[("name", COMMIT_FLAG), ("action", "off")])
        .await;
    assert_eq!(res.status(), 303);
    let (_, html) = admin.page(FLAGS_PAGE).await;
    assert!(html.contains("data-flag=\"ai_commit_reader_for_chat\" data-state=\"off\""));
    let back = res.headers()["location"].to_str().unwrap().to_owned();
    assert_eq!(back, "/admin/feature_flags?notice=switched");
    assert!(admin.page(&back).await.1.contains("Switch changed."));
    let (_, list) = get(&w.server, "/features", &w.admin_token).await;
    assert_eq!(list[0]["state"], "off");

    // Back to the default, and an unknown flag turned on by name.
    admin
        .post_form(FLAGS_PAGE, &[("name", COMMIT_FLAG), ("action", "reset")])
        .await;
    admin
        .post_form(FLAGS_PAGE, &[("name", "my_experiment"), ("action", "on")])
        .await;
    let (_, html) = admin.page(FLAGS_PAGE).await;
    assert!(html.contains("data-flag=\"ai_commit_reader_for_chat\" data-state=\"on\""));
    assert!(html.contains("data-flag=\"my_experiment\" data-state=\"on\""));
    assert!(html.contains("unknown flag: off"));
    let res = admin
        .post_form(FLAGS_PAGE, &[("name", "Not A Flag"), ("action", "on")])
        .await;
    assert_eq!(res.status(), 422);

    // Anyone else: not found, as the whole admin area.
    let other = signed_in(&w.server, "alice", "correct horse battery").await;
    assert_eq!(other.page(FLAGS_PAGE).await.0, 404);
}

#[tokio::test]
async fn a_flag_turned_off_takes_commit_reader_from_the_next_question() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let server = Server::start(&bench.fx).await;
    let root = bench.fx.admin("root").await;
    let token = bench.fx.token(root, &["api"]).await;

    bench.fake.push_text(" I know.\nFinal Answer: Nothing new.");
    let answered = bench.ask(world.user, "What changed lately?", None).await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    assert!(
        bench.provider_bodies()[0].contains("commit_reader"),
        "offered while on"
    );

    let (status, _) = post(
        &server,
        &format!("/features/{COMMIT_FLAG}"),
        &token,
        json!({"value": false}),
    )
    .await;
    assert_eq!(status, 201);
    bench
        .fake
        .push_text(" I know.\nFinal Answer: Still nothing.");
    let answered = bench.ask(world.user, "What changed lately?", None).await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let bodies = bench.provider_bodies();
    assert!(
        !bodies[1].contains("commit_reader"),
        "not offered while off: {}",
        bodies[1]
    );
    assert!(bodies[1].contains("issue_reader"), "the other tools stay");

    // On for this user only: offered to them again.
    let body = json!({"value": true, "user": "dev"});
    assert_eq!(
        post(&server, &format!("/features/{COMMIT_FLAG}"), &token, body)
            .await
            .0,
        201
    );
    bench.fake.push_text(" I know.\nFinal Answer: Yes.");
    bench.ask(world.user, "What changed lately?", None).await;
    assert!(bench.provider_bodies()[2].contains("commit_reader"));
}

type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// A gateway that ignores the flags: it always asks for `commit_reader`
/// first, then answers.
async fn skewed_gateway(
    req: HttpRequest,
    body: web::Json<Value>,
    seen: web::Data<Seen>,
) -> HttpResponse {
    let flags = req
        .headers()
        .get("x-gitlab-enabled-feature-flags")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let first = body["options"].is_null();
    seen.lock().unwrap().push((flags, body.into_inner()));
    let event = if first {
        AgentEvent::Action {
            tool: "commit_reader".into(),
            tool_input: "What does commit abcdef12 in gl/app change?".into(),
            thought: "I should read that commit.".into(),
        }
    } else {
        AgentEvent::delta("Done.")
    };
    HttpResponse::Ok()
        .content_type("application/x-ndjson")
        .body(event.to_ndjson_line())
}

#[tokio::test]
async fn the_monolith_announces_the_flags_and_runs_no_tool_a_flag_turned_off() {
    let seen: Seen = Arc::default();
    let data = web::Data::new(seen.clone());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stub = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .default_service(web::to(skewed_gateway))
    })
    .workers(1)
    .listen(listener)
    .unwrap()
    .run();
    let handle = stub.handle();
    tokio::spawn(stub);

    let bench = Bench::start_with_gateway(Some(url)).await;
    let world = bench.world().await;
    let server = Server::start(&bench.fx).await;
    let root = bench.fx.admin("root").await;
    let token = bench.fx.token(root, &["api"]).await;

    // On (the default): announced, and the tool runs (the commit does not
    // exist, so it answers M3003 like any unreadable commit).
    let answered = bench
        .ask(
            world.user,
            "What does commit abcdef12 in gl/app change?",
            None,
        )
        .await;
    {
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen[0].0,
            "ai_codebase_search_for_chat,ai_commit_reader_for_chat"
        );
    }
    assert_eq!(
        answered.answer.error.as_ref().map(|e| e.code),
        Some(contracts::DuoErrorCode::M3003),
        "the tool ran: {:?}",
        answered.answer
    );

    post(
        &server,
        &format!("/features/{COMMIT_FLAG}"),
        &token,
        json!({"value": false}),
    )
    .await;
    seen.lock().unwrap().clear();
    let answered = bench
        .ask(
            world.user,
            "What does commit abcdef12 in gl/app change?",
            None,
        )
        .await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "the agent went on after the refused tool");
    for (flags, _) in seen.iter() {
        assert_eq!(
            flags, "ai_codebase_search_for_chat",
            "every call of the question"
        );
    }
    let observation = seen[1].1["options"]["agent_scratchpad"]["steps"][0]["observation"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        observation,
        monolith::agent::tools::flag_off_observation("commit_reader"),
        "{}",
        seen[1].1
    );
    handle.stop(false).await;
}
