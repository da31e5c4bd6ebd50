//! Visibility, inherited membership and confidentiality matrix of the read abilities.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use monolith::policy::{Ability, Actor, Subject, access};
use support::Fx;

async fn can(fx: &Fx, user: Option<Actor>, ability: Ability, subject: Subject) -> bool {
    let db = fx.pool.get().await.unwrap();
    fx.policy()
        .can(&**db, user, ability, subject)
        .await
        .unwrap()
}

#[tokio::test]
async fn project_visibility_matrix() {
    let fx = Fx::new().await;
    let group = fx.group(None, "g", "public", "free").await;
    let private = fx.project(group, "private", "private").await;
    let internal = fx.project(group, "internal", "internal").await;
    let public = fx.project(group, "public", "public").await;
    let outsider = fx.user("outsider").await;
    let guest = fx.user("guest").await;
    let minimal = fx.user("minimal").await;
    let admin = fx.admin("admin").await;
    fx.project_member(private, guest, access::GUEST).await;
    fx.group_member(group, minimal, access::MINIMAL).await;

    // (user, project, expected)
    let rows: Vec<(&str, Option<Actor>, i64, bool)> = vec![
        ("anonymous/private", None, private, false),
        ("anonymous/internal", None, internal, false),
        ("anonymous/public", None, public, true),
        ("outsider/private", Some(outsider), private, false),
        ("outsider/internal", Some(outsider), internal, true),
        ("outsider/public", Some(outsider), public, true),
        ("guest/private", Some(guest), private, true),
        ("minimal access/private", Some(minimal), private, false),
        ("admin/private", Some(admin), private, true),
    ];
    for (name, user, project, expected) in rows {
        assert_eq!(
            can(&fx, user, Ability::ReadProject, Subject::Project(project)).await,
            expected,
            "{name}"
        );
    }
    assert!(
        !can(
            &fx,
            Some(admin),
            Ability::ReadProject,
            Subject::Project(i64::MAX)
        )
        .await,
        "unknown id"
    );
}

#[tokio::test]
async fn membership_is_inherited_down_the_group_tree() {
    let fx = Fx::new().await;
    let root = fx.group(None, "root", "private", "ultimate").await;
    let mid = fx.group(Some(root), "mid", "private", "free").await;
    let leaf = fx.group(Some(mid), "leaf", "private", "free").await;
    let project = fx.project(leaf, "deep", "private").await;
    let sibling = fx.group(None, "other", "private", "free").await;
    let root_member = fx.user("rootmember").await;
    let project_member = fx.user("projectmember").await;
    let stranger = fx.user("stranger").await;
    fx.group_member(root, root_member, access::REPORTER).await;
    fx.project_member(project, project_member, access::DEVELOPER)
        .await;

    assert!(
        can(
            &fx,
            Some(root_member),
            Ability::ReadProject,
            Subject::Project(project)
        )
        .await
    );
    assert!(
        can(
            &fx,
            Some(root_member),
            Ability::ReadGroup,
            Subject::Group(leaf)
        )
        .await
    );
    // A project member can see the private groups above the project ...
    assert!(
        can(
            &fx,
            Some(project_member),
            Ability::ReadGroup,
            Subject::Group(root)
        )
        .await
    );
    // ... but not an unrelated group.
    assert!(
        !can(
            &fx,
            Some(project_member),
            Ability::ReadGroup,
            Subject::Group(sibling)
        )
        .await
    );
    assert!(!can(&fx, Some(stranger), Ability::ReadGroup, Subject::Group(mid)).await);
    assert!(
        !can(
            &fx,
            Some(stranger),
            Ability::ReadProject,
            Subject::Project(project)
        )
        .await
    );
}

#[tokio::test]
async fn confidential_issues_need_author_assignee_or_reporter() {
    let fx = Fx::new().await;
    let group = fx.group(None, "g", "private", "free").await;
    let project = fx.project(group, "p", "public").await;
    let author = fx.user("author").await;
    let assignee = fx.user("assignee").await;
    let guest = fx.user("guest").await;
    let reporter = fx.user("reporter").await;
    let inherited_reporter = fx.user("inherited").await;
    let outsider = fx.user("outsider").await;
    let admin = fx.admin("admin").await;
    fx.project_member(project, guest, access::GUEST).await;
    fx.project_member(project, reporter, access::REPORTER).await;
    fx.group_member(group, inherited_reporter, access::REPORTER)
        .await;
    let confidential = fx.issue(project, author, true).await;
    fx.assign(confidential, assignee).await;
    let open = fx.issue(project, author, false).await;

    let rows: Vec<(&str, Option<Actor>, bool)> = vec![
        ("author", Some(author), true),
        ("assignee", Some(assignee), true),
        ("guest", Some(guest), false),
        ("reporter", Some(reporter), true),
        ("reporter via group", Some(inherited_reporter), true),
        ("outsider", Some(outsider), false),
        ("anonymous", None, false),
        ("admin", Some(admin), true),
    ];
    for (name, user, expected) in rows {
        assert_eq!(
            can(&fx, user, Ability::ReadIssue, Subject::Issue(confidential)).await,
            expected,
            "{name}"
        );
        assert!(
            can(&fx, user, Ability::ReadIssue, Subject::Issue(open)).await,
            "{name} reads a public issue"
        );
    }
}

#[tokio::test]
async fn merge_requests_builds_epics_and_notes() {
    let fx = Fx::new().await;
    let group = fx.group(None, "g", "private", "ultimate").await;
    let private = fx.project(group, "private", "private").await;
    let public_group = fx.group(None, "pub", "public", "free").await;
    let public = fx.project(public_group, "public", "public").await;
    let guest = fx.user("guest").await;
    let reporter = fx.user("reporter").await;
    let outsider = fx.user("outsider").await;
    fx.group_member(group, guest, access::GUEST).await;
    fx.group_member(group, reporter, access::REPORTER).await;

    let private_mr = fx.merge_request(private, reporter).await;
    let public_mr = fx.merge_request(public, reporter).await;
    let private_build = fx.build(private).await;
    let public_build = fx.build(public).await;
    // Private project code needs reporter access; guests only see issues.
    assert!(
        !can(
            &fx,
            Some(guest),
            Ability::ReadMergeRequest,
            Subject::MergeRequest(private_mr)
        )
        .await
    );
    assert!(
        can(
            &fx,
            Some(reporter),
            Ability::ReadMergeRequest,
            Subject::MergeRequest(private_mr)
        )
        .await
    );
    assert!(
        can(
            &fx,
            Some(outsider),
            Ability::ReadMergeRequest,
            Subject::MergeRequest(public_mr)
        )
        .await
    );
    assert!(
        !can(
            &fx,
            Some(guest),
            Ability::ReadBuild,
            Subject::Build(private_build)
        )
        .await
    );
    assert!(
        can(
            &fx,
            Some(reporter),
            Ability::ReadBuild,
            Subject::Build(private_build)
        )
        .await
    );
    assert!(can(&fx, None, Ability::ReadBuild, Subject::Build(public_build)).await);

    let epic = fx.epic(group, reporter, false).await;
    let secret_epic = fx.epic(group, reporter, true).await;
    assert!(can(&fx, Some(guest), Ability::ReadEpic, Subject::Epic(epic)).await);
    assert!(!can(&fx, Some(outsider), Ability::ReadEpic, Subject::Epic(epic)).await);
    assert!(
        !can(
            &fx,
            Some(guest),
            Ability::ReadEpic,
            Subject::Epic(secret_epic)
        )
        .await
    );
    assert!(
        can(
            &fx,
            Some(reporter),
            Ability::ReadEpic,
            Subject::Epic(secret_epic)
        )
        .await
    );

    let issue = fx.issue(private, reporter, false).await;
    let note = fx.note("Issue", issue, reporter, false).await;
    let internal = fx.note("Issue", issue, reporter, true).await;
    let epic_note = fx.note("Epic", secret_epic, reporter, false).await;
    assert!(can(&fx, Some(guest), Ability::ReadNote, Subject::Note(note)).await);
    assert!(!can(&fx, Some(guest), Ability::ReadNote, Subject::Note(internal)).await);
    assert!(
        can(
            &fx,
            Some(reporter),
            Ability::ReadNote,
            Subject::Note(internal)
        )
        .await
    );
    assert!(!can(&fx, Some(outsider), Ability::ReadNote, Subject::Note(note)).await);
    assert!(
        !can(
            &fx,
            Some(guest),
            Ability::ReadNote,
            Subject::Note(epic_note)
        )
        .await
    );
    // Abilities never apply to a subject of the wrong kind.
    assert!(
        !can(
            &fx,
            Some(reporter),
            Ability::ReadIssue,
            Subject::Project(private)
        )
        .await
    );
}
