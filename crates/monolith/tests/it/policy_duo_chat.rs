//! Every row of the `access_duo_chat` table (user outside any container, in a
//! group, in a project) on both realms, plus the seat rule and the chat authorizer.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use contracts::DuoErrorCode;
use monolith::config::Realm;
use monolith::policy::{Ability, Subject, access};
use support::Fx;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Context {
    Global,
    Group,
    Project,
}

/// One world: a root group (with a subgroup holding a project) and a user.
#[derive(Clone, Copy, Debug)]
struct World {
    realm: Realm,
    instance_tier: &'static str,
    instance_duo: bool,
    root_plan: &'static str,
    root_duo: bool,
    root_experiments: bool,
    subgroup_duo: bool,
    project_duo: bool,
    project_visibility: &'static str,
    /// Visibility of the root group and the subgroup.
    group_visibility: &'static str,
    /// The user's membership in the root group (None: not a member).
    membership: Option<i32>,
    /// The user's membership in the subgroup only (None: not a member).
    subgroup_membership: Option<i32>,
    /// The user is also a member of an unrelated paid group with Duo and
    /// experiment features on (isolates the container's own conditions on GitLab.com).
    paid_elsewhere: bool,
    seat: Option<&'static str>,
    seat_expired: bool,
}

const SM: World = World {
    realm: Realm::SelfManaged,
    instance_tier: "ultimate",
    instance_duo: true,
    root_plan: "free",
    root_duo: true,
    root_experiments: false,
    subgroup_duo: true,
    project_duo: true,
    project_visibility: "private",
    group_visibility: "private",
    membership: Some(access::GUEST),
    subgroup_membership: None,
    paid_elsewhere: false,
    seat: Some("duo_pro"),
    seat_expired: false,
};

const SAAS: World = World {
    realm: Realm::Saas,
    instance_tier: "free",
    instance_duo: true,
    root_plan: "premium",
    root_duo: true,
    root_experiments: true,
    subgroup_duo: true,
    project_duo: true,
    project_visibility: "private",
    group_visibility: "private",
    membership: Some(access::GUEST),
    subgroup_membership: None,
    paid_elsewhere: false,
    seat: Some("duo_pro"),
    seat_expired: false,
};

async fn allowed(world: World, context: Context) -> bool {
    let fx = Fx::new().await;
    fx.instance(world.realm, world.instance_tier, world.instance_duo)
        .await;
    let root = fx
        .group(None, "root", world.group_visibility, world.root_plan)
        .await;
    fx.group_flag(root, "duo_features_enabled", world.root_duo)
        .await;
    fx.group_flag(root, "experiment_and_beta_features", world.root_experiments)
        .await;
    let sub = fx
        .group(Some(root), "sub", world.group_visibility, "free")
        .await;
    fx.group_flag(sub, "duo_features_enabled", world.subgroup_duo)
        .await;
    let project = fx.project(sub, "proj", world.project_visibility).await;
    fx.project_duo(project, world.project_duo).await;
    let user = fx.user("u").await;
    if let Some(level) = world.membership {
        fx.group_member(root, user, level).await;
    }
    if let Some(level) = world.subgroup_membership {
        fx.group_member(sub, user, level).await;
    }
    if world.paid_elsewhere {
        let other = fx.group(None, "elsewhere", "private", "ultimate").await;
        fx.group_flag(other, "experiment_and_beta_features", true)
            .await;
        fx.group_member(other, user, access::DEVELOPER).await;
    }
    if let Some(add_on) = world.seat {
        fx.seat(user, add_on, world.seat_expired).await;
    }
    let subject = match context {
        Context::Global => Subject::Global,
        Context::Group => Subject::Group(sub),
        Context::Project => Subject::Project(project),
    };
    let client = fx.pool.get().await.unwrap();
    fx.policy()
        .can(&**client, Some(user), Ability::AccessDuoChat, subject)
        .await
        .unwrap()
}

struct Row {
    name: &'static str,
    world: World,
    context: Context,
    expected: bool,
}

async fn check(rows: Vec<Row>) {
    let mut failures = Vec::new();
    for row in rows {
        let got = allowed(row.world, row.context).await;
        if got != row.expected {
            failures.push(format!(
                "{} ({:?}): expected {}, got {got}",
                row.name, row.context, row.expected
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "policy rows failed:\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn self_managed_rows() {
    use Context::*;
    check(vec![
        Row {
            name: "ultimate instance, duo on, seat",
            world: SM,
            context: Global,
            expected: true,
        },
        Row {
            name: "premium instance",
            world: World {
                instance_tier: "premium",
                ..SM
            },
            context: Global,
            expected: true,
        },
        Row {
            name: "free instance",
            world: World {
                instance_tier: "free",
                ..SM
            },
            context: Global,
            expected: false,
        },
        Row {
            name: "instance duo off",
            world: World {
                instance_duo: false,
                ..SM
            },
            context: Global,
            expected: false,
        },
        Row {
            name: "no seat",
            world: World { seat: None, ..SM },
            context: Global,
            expected: false,
        },
        Row {
            name: "expired seat",
            world: World {
                seat_expired: true,
                ..SM
            },
            context: Global,
            expected: false,
        },
        Row {
            name: "enterprise seat",
            world: World {
                seat: Some("duo_enterprise"),
                ..SM
            },
            context: Global,
            expected: true,
        },
        Row {
            name: "no membership needed outside containers",
            world: World {
                membership: None,
                ..SM
            },
            context: Global,
            expected: true,
        },
        Row {
            name: "group member, premium instance",
            world: World {
                instance_tier: "premium",
                ..SM
            },
            context: Group,
            expected: true,
        },
        Row {
            name: "group not readable",
            world: World {
                membership: None,
                ..SM
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "group duo off",
            world: World {
                subgroup_duo: false,
                ..SM
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "ancestor duo off",
            world: World {
                root_duo: false,
                ..SM
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "group, free instance",
            world: World {
                instance_tier: "free",
                ..SM
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "group, no seat",
            world: World { seat: None, ..SM },
            context: Group,
            expected: false,
        },
        Row {
            name: "project, ultimate instance",
            world: SM,
            context: Project,
            expected: true,
        },
        Row {
            name: "project, premium instance",
            world: World {
                instance_tier: "premium",
                ..SM
            },
            context: Project,
            expected: false,
        },
        Row {
            name: "project duo off",
            world: World {
                project_duo: false,
                ..SM
            },
            context: Project,
            expected: false,
        },
        Row {
            name: "project not readable",
            world: World {
                membership: None,
                ..SM
            },
            context: Project,
            expected: false,
        },
        Row {
            name: "public project, no membership",
            world: World {
                membership: None,
                project_visibility: "public",
                ..SM
            },
            context: Project,
            expected: true,
        },
        Row {
            name: "project, instance duo off",
            world: World {
                instance_duo: false,
                ..SM
            },
            context: Project,
            expected: false,
        },
        Row {
            name: "group, ultimate instance",
            world: SM,
            context: Group,
            expected: true,
        },
        Row {
            name: "group, instance duo off",
            world: World {
                instance_duo: false,
                ..SM
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "public group, no membership",
            world: World {
                membership: None,
                group_visibility: "public",
                ..SM
            },
            context: Group,
            expected: true,
        },
        Row {
            name: "member of the subgroup only",
            world: World {
                membership: None,
                subgroup_membership: Some(access::GUEST),
                ..SM
            },
            context: Project,
            expected: true,
        },
    ])
    .await;
}

#[tokio::test]
async fn saas_rows() {
    use Context::*;
    check(vec![
        Row {
            name: "member of premium group with duo on",
            world: SAAS,
            context: Global,
            expected: true,
        },
        Row {
            name: "member of ultimate group",
            world: World {
                root_plan: "ultimate",
                ..SAAS
            },
            context: Global,
            expected: true,
        },
        Row {
            name: "member of free group only",
            world: World {
                root_plan: "free",
                ..SAAS
            },
            context: Global,
            expected: false,
        },
        Row {
            name: "paid group with duo off",
            world: World {
                root_duo: false,
                ..SAAS
            },
            context: Global,
            expected: false,
        },
        Row {
            name: "no membership",
            world: World {
                membership: None,
                ..SAAS
            },
            context: Global,
            expected: false,
        },
        Row {
            name: "no seat",
            world: World { seat: None, ..SAAS },
            context: Global,
            expected: false,
        },
        Row {
            name: "instance tier is irrelevant",
            world: World {
                instance_tier: "free",
                ..SAAS
            },
            context: Global,
            expected: true,
        },
        Row {
            name: "group: paid root, experiments on",
            world: SAAS,
            context: Group,
            expected: true,
        },
        Row {
            name: "group: experiments off everywhere",
            world: World {
                root_experiments: false,
                ..SAAS
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "group: free root, paid elsewhere",
            world: World {
                root_plan: "free",
                paid_elsewhere: true,
                ..SAAS
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "group: duo off on group",
            world: World {
                subgroup_duo: false,
                ..SAAS
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "group: not readable",
            world: World {
                membership: None,
                paid_elsewhere: true,
                ..SAAS
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "group: experiments only elsewhere",
            world: World {
                root_experiments: false,
                paid_elsewhere: true,
                ..SAAS
            },
            context: Group,
            expected: true,
        },
        Row {
            name: "project: paid root, experiments on",
            world: SAAS,
            context: Project,
            expected: true,
        },
        Row {
            name: "project: premium root is enough",
            world: World {
                root_plan: "premium",
                ..SAAS
            },
            context: Project,
            expected: true,
        },
        Row {
            name: "project: duo off",
            world: World {
                project_duo: false,
                ..SAAS
            },
            context: Project,
            expected: false,
        },
        Row {
            name: "project: free root, paid elsewhere",
            world: World {
                root_plan: "free",
                paid_elsewhere: true,
                ..SAAS
            },
            context: Project,
            expected: false,
        },
        Row {
            name: "project: not readable",
            world: World {
                membership: None,
                paid_elsewhere: true,
                ..SAAS
            },
            context: Project,
            expected: false,
        },
        Row {
            name: "project: public, paid elsewhere",
            world: World {
                membership: None,
                paid_elsewhere: true,
                project_visibility: "public",
                ..SAAS
            },
            context: Project,
            expected: true,
        },
        Row {
            name: "project: no seat",
            world: World { seat: None, ..SAAS },
            context: Project,
            expected: false,
        },
        Row {
            name: "project: experiments off everywhere",
            world: World {
                root_experiments: false,
                ..SAAS
            },
            context: Project,
            expected: false,
        },
        Row {
            name: "project: experiments only elsewhere",
            world: World {
                root_experiments: false,
                paid_elsewhere: true,
                ..SAAS
            },
            context: Project,
            expected: true,
        },
        Row {
            // Paid elsewhere keeps the user-level rule true: only the ancestor's
            // switch can deny here.
            name: "group: ancestor duo off",
            world: World {
                root_duo: false,
                paid_elsewhere: true,
                ..SAAS
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "project: ancestor duo off",
            world: World {
                root_duo: false,
                paid_elsewhere: true,
                ..SAAS
            },
            context: Project,
            expected: false,
        },
        Row {
            name: "group: ultimate root",
            world: World {
                root_plan: "ultimate",
                ..SAAS
            },
            context: Group,
            expected: true,
        },
        Row {
            name: "project: ultimate root",
            world: World {
                root_plan: "ultimate",
                ..SAAS
            },
            context: Project,
            expected: true,
        },
        Row {
            name: "group: public, no membership, paid elsewhere",
            world: World {
                membership: None,
                paid_elsewhere: true,
                group_visibility: "public",
                ..SAAS
            },
            context: Group,
            expected: true,
        },
        Row {
            name: "group: public, no paid membership anywhere",
            world: World {
                membership: None,
                group_visibility: "public",
                ..SAAS
            },
            context: Group,
            expected: false,
        },
        Row {
            name: "only paid membership is in a subgroup",
            world: World {
                membership: None,
                subgroup_membership: Some(access::GUEST),
                ..SAAS
            },
            context: Global,
            expected: true,
        },
        Row {
            name: "group: only paid membership is in the subgroup",
            world: World {
                membership: None,
                subgroup_membership: Some(access::GUEST),
                ..SAAS
            },
            context: Group,
            expected: true,
        },
        Row {
            name: "project: only paid membership is in its subgroup",
            world: World {
                membership: None,
                subgroup_membership: Some(access::GUEST),
                ..SAAS
            },
            context: Project,
            expected: true,
        },
    ])
    .await;
}

#[tokio::test]
async fn chat_authorizer_codes() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let policy = fx.policy();
    let root = fx.group(None, "acme", "private", "ultimate").await;
    let project = fx.project(root, "api", "private").await;
    let off = fx.project(root, "legacy", "private").await;
    fx.project_duo(off, false).await;
    let hidden_group = fx.group(None, "hidden", "private", "ultimate").await;
    let hidden = fx.project(hidden_group, "secret", "private").await;

    let seated = fx.user("seated").await;
    fx.seat(seated, "duo_pro", false).await;
    fx.group_member(root, seated, access::GUEST).await;
    let no_seat = fx.user("noseat").await;
    fx.group_member(root, no_seat, access::DEVELOPER).await;
    let author = fx.user("author").await;
    fx.group_member(root, author, access::DEVELOPER).await;
    let confidential = fx.issue(project, author, true).await;
    let open = fx.issue(project, author, false).await;

    let db = fx.pool.get().await.unwrap();
    let db = &**db;
    let code = |r: Result<(), monolith::policy::ChatAuthError>| r.err().and_then(|e| e.code());

    assert_eq!(
        code(policy.authorize_chat_user(db, Some(seated)).await),
        None
    );
    assert_eq!(
        code(policy.authorize_chat_user(db, Some(no_seat)).await),
        Some(DuoErrorCode::M3004)
    );
    assert_eq!(
        code(policy.authorize_chat_user(db, None).await),
        Some(DuoErrorCode::M3004)
    );
    assert_eq!(
        code(
            policy
                .authorize_chat_container(db, Some(seated), Subject::Project(project))
                .await
        ),
        None
    );
    assert_eq!(
        code(
            policy
                .authorize_chat_container(db, Some(seated), Subject::Project(off))
                .await
        ),
        Some(DuoErrorCode::M3002)
    );
    assert_eq!(
        code(
            policy
                .authorize_chat_container(db, Some(seated), Subject::Project(hidden))
                .await
        ),
        Some(DuoErrorCode::M3003)
    );
    assert_eq!(
        code(
            policy
                .authorize_chat_resource(db, Some(seated), Subject::Issue(open))
                .await
        ),
        None
    );
    // A guest cannot read a confidential issue: answered as if it did not exist.
    assert_eq!(
        code(
            policy
                .authorize_chat_resource(db, Some(seated), Subject::Issue(confidential))
                .await
        ),
        Some(DuoErrorCode::M3003)
    );
    assert_eq!(
        code(
            policy
                .authorize_chat_resource(db, Some(seated), Subject::Issue(i64::MAX))
                .await
        ),
        Some(DuoErrorCode::M3003)
    );
    // Readable resource, but the user has no seat.
    assert_eq!(
        code(
            policy
                .authorize_chat_resource(db, Some(no_seat), Subject::Issue(open))
                .await
        ),
        Some(DuoErrorCode::M3004)
    );

    // Facts read ahead (the worker's pipelined reads) decide for their own
    // user only: handed another user's, or a composite identity, the policy
    // reads again instead of answering with the wrong user's seats.
    let scopes = |r: Result<_, monolith::policy::ChatAuthError>| r.map_err(|e| e.code());
    let seated_facts = policy.chat_access_facts(db, seated.id).await.unwrap();
    let no_seat_facts = policy.chat_access_facts(db, no_seat.id).await.unwrap();
    // The same statement reads the account and the instance's gateway setting.
    assert_eq!(seated_facts.actor(), Some(seated));
    assert_eq!(
        policy
            .chat_access_facts(db, i64::MAX)
            .await
            .unwrap()
            .actor(),
        None
    );
    assert_eq!(seated_facts.gateway_settings().1, None);
    assert!(
        scopes(
            policy
                .authorize_chat_user_scopes_with(db, Some(seated), seated_facts.clone())
                .await
        )
        .unwrap()
        .contains(&contracts::UnitPrimitive::DuoChat)
    );
    assert_eq!(
        scopes(
            policy
                .authorize_chat_user_scopes_with(db, Some(no_seat), no_seat_facts)
                .await
        ),
        Err(Some(DuoErrorCode::M3004))
    );
    assert_eq!(
        scopes(
            policy
                .authorize_chat_user_scopes_with(db, Some(no_seat), seated_facts.clone())
                .await
        ),
        Err(Some(DuoErrorCode::M3004))
    );
    let on_behalf_of_no_seat = monolith::policy::Actor {
        service_account: Some(monolith::policy::ServiceAccountActor {
            id: no_seat.id,
            admin: false,
        }),
        ..seated
    };
    assert_eq!(
        scopes(
            policy
                .authorize_chat_user_scopes_with(db, Some(on_behalf_of_no_seat), seated_facts)
                .await
        ),
        Err(Some(DuoErrorCode::M3004))
    );
}

#[tokio::test]
async fn available_features_follow_the_seat() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let policy = fx.policy();
    let pro = fx.user("pro").await;
    fx.seat(pro, "duo_pro", false).await;
    let ent = fx.user("ent").await;
    fx.seat(ent, "duo_enterprise", false).await;
    let none = fx.user("none").await;
    let db = fx.pool.get().await.unwrap();
    let pro_features = policy
        .duo_chat_available_features(&**db, Some(pro))
        .await
        .unwrap();
    let ent_features = policy
        .duo_chat_available_features(&**db, Some(ent))
        .await
        .unwrap();
    assert!(pro_features.contains(&"include_file_context".to_string()));
    assert!(!pro_features.contains(&"include_issue_context".to_string()));
    assert!(ent_features.contains(&"include_issue_context".to_string()));
    assert!(
        policy
            .duo_chat_available_features(&**db, Some(none))
            .await
            .unwrap()
            .is_empty()
    );
}
