//! The REST write rules: which role each change needs, inherited roles, admins,
//! unreadable containers, and how far a member manager reaches.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use monolith::policy::{Ability, Actor, Subject, WriteAbility, access};
use support::Fx;

async fn can_write(fx: &Fx, user: Option<Actor>, ability: WriteAbility, subject: Subject) -> bool {
    let db = fx.pool.get().await.unwrap();
    fx.policy()
        .can_write(&**db, user, ability, subject)
        .await
        .unwrap()
}

#[tokio::test]
async fn each_change_needs_its_role() {
    let fx = Fx::new().await;
    let root = fx.group(None, "root", "private", "free").await;
    let sub = fx.group(Some(root), "sub", "private", "free").await;
    let project = fx.project(sub, "p", "private").await;
    let mut by_level = Vec::new();
    for (name, level) in [
        ("guest", access::GUEST),
        ("planner", access::PLANNER),
        ("reporter", access::REPORTER),
        ("developer", access::DEVELOPER),
        ("maintainer", access::MAINTAINER),
        ("owner", access::OWNER),
    ] {
        let user = fx.user(name).await;
        // Granted on the root group: every role is inherited below it.
        fx.group_member(root, user, level).await;
        by_level.push((name, level, user));
    }
    let group_rules = [
        (WriteAbility::AdminGroup, access::OWNER),
        (WriteAbility::AdminGroupMember, access::OWNER),
        (WriteAbility::CreateProject, access::MAINTAINER),
        (WriteAbility::CreateEpic, access::PLANNER),
        (WriteAbility::CreateInternalNote, access::REPORTER),
    ];
    let project_rules = [
        (WriteAbility::AdminProject, access::MAINTAINER),
        (WriteAbility::RenameProject, access::OWNER),
        (WriteAbility::ChangeProjectVisibility, access::OWNER),
        (WriteAbility::AdminProjectMember, access::MAINTAINER),
        (WriteAbility::ImportJob, access::MAINTAINER),
        (WriteAbility::CreateMergeRequest, access::DEVELOPER),
        (WriteAbility::CreateInternalNote, access::REPORTER),
    ];
    for (name, level, user) in &by_level {
        for (ability, needed) in group_rules {
            assert_eq!(
                can_write(&fx, Some(*user), ability, Subject::Group(sub)).await,
                *level >= needed,
                "{name} {ability:?} on the subgroup"
            );
        }
        for (ability, needed) in project_rules {
            assert_eq!(
                can_write(&fx, Some(*user), ability, Subject::Project(project)).await,
                *level >= needed,
                "{name} {ability:?} on the project"
            );
        }
    }
}

#[tokio::test]
async fn admins_strangers_and_mismatched_subjects() {
    let fx = Fx::new().await;
    let group = fx.group(None, "g", "private", "free").await;
    let public_group = fx.group(None, "pub", "public", "free").await;
    let project = fx.project(group, "p", "private").await;
    let public_project = fx.project(public_group, "open", "public").await;
    let admin = fx.admin("admin").await;
    let stranger = fx.user("stranger").await;
    let project_owner = fx.user("projectowner").await;
    fx.project_member(project, project_owner, access::OWNER)
        .await;

    use WriteAbility::{
        AdminGroup, AdminProjectMember, CreateEpic, CreateMergeRequest, CreateProject, ImportJob,
        RenameProject,
    };
    // (who, change, where, granted)
    let cases = [
        // Admins make any change.
        (Some(admin), AdminGroup, Subject::Group(group), true),
        (Some(admin), RenameProject, Subject::Project(project), true),
        // Anonymous visitors make none.
        (None, CreateEpic, Subject::Group(public_group), false),
        // Reading a public project grants no writes.
        (
            Some(stranger),
            CreateMergeRequest,
            Subject::Project(public_project),
            false,
        ),
        // A project role says nothing about the group above.
        (
            Some(project_owner),
            AdminProjectMember,
            Subject::Project(project),
            true,
        ),
        (
            Some(project_owner),
            CreateProject,
            Subject::Group(group),
            false,
        ),
        // Group-only changes never apply to projects, and the reverse.
        (Some(admin), AdminGroup, Subject::Project(project), false),
        (Some(admin), ImportJob, Subject::Group(group), false),
        // Nor do changes to a group that does not exist.
        (Some(admin), AdminGroup, Subject::Group(i64::MAX), false),
    ];
    for (user, ability, subject, granted) in cases {
        assert_eq!(
            can_write(&fx, user, ability, subject).await,
            granted,
            "{user:?} {ability:?} on {subject:?}"
        );
    }
}

#[tokio::test]
async fn managers_reach_roles_up_to_their_own_and_ci_reads_follow_reporter() {
    let fx = Fx::new().await;
    let group = fx.group(None, "g", "private", "free").await;
    let project = fx.project(group, "p", "private").await;
    let maint = fx.user("maint").await;
    let owner = fx.user("owner").await;
    let guest = fx.user("guest").await;
    let reporter = fx.user("reporter").await;
    let admin = fx.admin("admin").await;
    fx.group_member(group, maint, access::MAINTAINER).await;
    fx.project_member(project, owner, access::OWNER).await;
    fx.project_member(project, guest, access::GUEST).await;
    fx.project_member(project, reporter, access::REPORTER).await;
    let policy = fx.policy();
    let db = fx.pool.get().await.unwrap();
    let subject = Subject::Project(project);

    assert_eq!(
        policy
            .access_level(&**db, Some(maint), subject)
            .await
            .unwrap(),
        access::MAINTAINER,
        "inherited from the group"
    );
    assert_eq!(
        policy.access_level(&**db, None, subject).await.unwrap(),
        access::NO_ACCESS
    );
    for (user, level, expected) in [
        (maint, access::MAINTAINER, true),
        (maint, access::OWNER, false),
        (owner, access::OWNER, true),
        (admin, access::OWNER, true),
        (guest, access::REPORTER, false),
    ] {
        assert_eq!(
            policy
                .may_manage_role(&**db, Some(user), subject, level)
                .await
                .unwrap(),
            expected,
            "{user:?} managing level {level}"
        );
    }

    // `read_build` on the project as a whole: reporter in a private project.
    for (user, expected) in [(guest, false), (reporter, true), (admin, true)] {
        assert_eq!(
            policy
                .can(&**db, Some(user), Ability::ReadBuild, subject)
                .await
                .unwrap(),
            expected,
            "{user:?}"
        );
    }
    assert!(
        !policy
            .can(&**db, None, Ability::ReadBuild, subject)
            .await
            .unwrap()
    );
}
