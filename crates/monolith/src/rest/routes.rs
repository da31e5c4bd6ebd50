//! Every route under `/api/v4`, in one table: which handler answers which
//! method and path. Handler modules register nothing themselves; what several
//! of them share sits a floor below them (`containers`, `item_access`,
//! `repository_access`, `workflow_access`, `pagination`, `params`), never in a
//! module that also mounts them.
//!
//! Order matters: actix tries routes in the order they are registered and the
//! first whose path and method match answers. So a fixed segment comes before
//! a placeholder that would also match it (`workflows/agent_privileges` before
//! `workflows/{id}`, `personal_access_tokens/self` before `{id}`), and a file's
//! `/raw` before the file path that would swallow it.

use actix_web::web::{ServiceConfig, delete, get, patch, post, put};

use super::{
    admin, branches, ci, code_search, discussions, duo_triggers, epics, features, groups, issues,
    item_updates, mcp, members, merge_requests, notes, projects, repository, repository_commits,
    users, workflows, workflows_internal, workflows_socket,
};

/// Mounted by the server under `/api/v4`.
pub fn api_v4(cfg: &mut ServiceConfig) {
    // ---- users and personal access tokens ----------------------------------------
    cfg.route("/user", get().to(users::current_user));
    cfg.route("/users", get().to(users::list_users));
    cfg.route("/users", post().to(users::create_user));
    cfg.route("/users/{id}", get().to(users::show_user));
    cfg.route("/users/{id}", put().to(users::update_user));
    cfg.route("/users/{id}/block", post().to(users::block_user));
    cfg.route("/users/{id}/unblock", post().to(users::unblock_user));
    cfg.route(
        "/users/{id}/personal_access_tokens",
        post().to(users::create_token),
    );
    cfg.route("/personal_access_tokens", get().to(users::list_tokens));
    cfg.route("/personal_access_tokens/self", get().to(users::token_self));
    cfg.route(
        "/personal_access_tokens/self",
        delete().to(users::revoke_token_self),
    );
    cfg.route("/personal_access_tokens/{id}", get().to(users::show_token));
    cfg.route(
        "/personal_access_tokens/{id}",
        delete().to(users::revoke_token),
    );

    // ---- groups and projects -----------------------------------------------------
    cfg.route("/groups", get().to(groups::list_groups));
    cfg.route("/groups", post().to(groups::create_group));
    cfg.route("/groups/{id}", get().to(groups::show_group));
    cfg.route("/groups/{id}", put().to(groups::update_group));
    cfg.route("/projects", get().to(projects::list_projects));
    cfg.route("/projects", post().to(projects::create_project));
    cfg.route("/projects/{id}", get().to(projects::show_project));
    cfg.route("/projects/{id}", put().to(projects::update_project));
    // Our extension: which events start Duo's work in the project.
    cfg.route("/projects/{id}/duo_triggers", get().to(duo_triggers::list));
    cfg.route(
        "/projects/{id}/duo_triggers/{event}",
        put().to(duo_triggers::update),
    );

    // ---- issues ------------------------------------------------------------------
    cfg.route("/projects/{id}/issues", get().to(issues::list_issues));
    cfg.route("/projects/{id}/issues", post().to(issues::create_issue));
    cfg.route("/projects/{id}/issues/{iid}", get().to(issues::show_issue));
    cfg.route(
        "/projects/{id}/issues/{iid}",
        put().to(item_updates::update_issue),
    );
    cfg.route(
        "/projects/{id}/issues/{iid}/notes",
        get().to(notes::list::<issues::IssueNotes>),
    );
    cfg.route(
        "/projects/{id}/issues/{iid}/notes",
        post().to(notes::create::<issues::IssueNotes>),
    );
    cfg.route(
        "/projects/{id}/issues/{iid}/discussions",
        get().to(discussions::list::<issues::IssueNotes>),
    );
    cfg.route(
        "/projects/{id}/issues/{iid}/discussions",
        post().to(discussions::create::<issues::IssueNotes>),
    );
    cfg.route(
        "/projects/{id}/issues/{iid}/discussions/{discussion_id}",
        get().to(discussions::show::<issues::IssueNotes>),
    );
    cfg.route(
        "/projects/{id}/issues/{iid}/discussions/{discussion_id}/notes",
        post().to(discussions::reply::<issues::IssueNotes>),
    );

    // ---- instance settings and seats ---------------------------------------------
    cfg.route("/application/settings", get().to(admin::show_settings));
    cfg.route("/application/settings", put().to(admin::update_settings));
    cfg.route(
        "/add_on_purchases/{add_on}/assignments",
        post().to(admin::assign_seat),
    );
    cfg.route("/projects/{id}", delete().to(projects::delete_project));

    // ---- feature flags (admins) ---------------------------------------------------
    cfg.route("/features", get().to(features::list_features));
    cfg.route("/features/{name}", post().to(features::set_feature));
    cfg.route("/features/{name}", delete().to(features::delete_feature));

    // ---- repository: tree, files, blobs ------------------------------------------
    cfg.route("/projects/{id}/repository/tree", get().to(repository::tree));
    cfg.route(
        "/projects/{id}/semantic_code_search",
        get().to(code_search::semantic_code_search),
    );
    cfg.route(
        "/projects/{id}/repository/files/{file_path:.+}/raw",
        get().to(repository::raw_file),
    );
    cfg.route(
        "/projects/{id}/repository/files/{file_path:.+}",
        get().to(repository::show_file),
    );
    cfg.route(
        "/projects/{id}/repository/files/{file_path:.+}",
        post().to(repository::create_file),
    );
    cfg.route(
        "/projects/{id}/repository/files/{file_path:.+}",
        put().to(repository::update_file),
    );
    cfg.route(
        "/projects/{id}/repository/files/{file_path:.+}",
        delete().to(repository::delete_file),
    );
    cfg.route(
        "/projects/{id}/repository/blobs/{sha}/raw",
        get().to(repository::raw_blob),
    );
    cfg.route(
        "/projects/{id}/repository/blobs/{sha}",
        get().to(repository::show_blob),
    );

    // ---- repository: commits -----------------------------------------------------
    cfg.route(
        "/projects/{id}/repository/commits",
        get().to(repository_commits::list_commits),
    );
    cfg.route(
        "/projects/{id}/repository/commits",
        post().to(repository_commits::create_commit),
    );
    cfg.route(
        "/projects/{id}/repository/commits/{sha}",
        get().to(repository_commits::show_commit),
    );
    cfg.route(
        "/projects/{id}/repository/commits/{sha}/diff",
        get().to(repository_commits::commit_diff),
    );
    cfg.route(
        "/projects/{id}/repository/compare",
        get().to(repository_commits::compare),
    );

    // ---- repository: branches and tags -------------------------------------------
    cfg.route(
        "/projects/{id}/repository/branches",
        get().to(branches::list_branches),
    );
    cfg.route(
        "/projects/{id}/repository/branches",
        post().to(branches::create_branch),
    );
    cfg.route(
        "/projects/{id}/repository/branches/{branch:.+}",
        get().to(branches::show_branch),
    );
    cfg.route(
        "/projects/{id}/repository/branches/{branch:.+}",
        delete().to(branches::delete_branch),
    );
    cfg.route(
        "/projects/{id}/repository/tags",
        get().to(branches::list_tags),
    );

    // ---- members: the same handlers for groups and projects ----------------------
    member_routes::<members::OfGroup>(cfg, "/groups/{id}/members");
    member_routes::<members::OfProject>(cfg, "/projects/{id}/members");

    // ---- epics -------------------------------------------------------------------
    cfg.route("/groups/{id}/epics", get().to(epics::list_epics));
    cfg.route("/groups/{id}/epics", post().to(epics::create_epic));
    cfg.route("/groups/{id}/epics/{iid}", get().to(epics::show_epic));
    cfg.route(
        "/groups/{id}/epics/{iid}",
        put().to(item_updates::update_epic),
    );
    cfg.route(
        "/groups/{id}/epics/{epic_id}/notes",
        get().to(notes::list::<epics::EpicNotes>),
    );
    cfg.route(
        "/groups/{id}/epics/{epic_id}/notes",
        post().to(notes::create::<epics::EpicNotes>),
    );

    // ---- merge requests ----------------------------------------------------------
    cfg.route(
        "/projects/{id}/merge_requests",
        get().to(merge_requests::list_merge_requests),
    );
    cfg.route(
        "/projects/{id}/merge_requests",
        post().to(merge_requests::create_merge_request),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}",
        get().to(merge_requests::show_merge_request),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}",
        put().to(item_updates::update_merge_request),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/changes",
        get().to(merge_requests::merge_request_changes),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/diffs",
        get().to(merge_requests::merge_request_diffs),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/commits",
        get().to(merge_requests::merge_request_commits),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/pipelines",
        get().to(merge_requests::merge_request_pipelines),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/notes",
        get().to(notes::list::<merge_requests::MergeRequestNotes>),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/notes",
        post().to(notes::create::<merge_requests::MergeRequestNotes>),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/reviewers",
        get().to(merge_requests::merge_request_reviewers),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/discussions",
        get().to(discussions::list::<merge_requests::MergeRequestNotes>),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/discussions",
        post().to(discussions::create::<merge_requests::MergeRequestNotes>),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/discussions/{discussion_id}",
        get().to(discussions::show::<merge_requests::MergeRequestNotes>),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/discussions/{discussion_id}",
        put().to(discussions::resolve::<merge_requests::MergeRequestNotes>),
    );
    cfg.route(
        "/projects/{id}/merge_requests/{iid}/discussions/{discussion_id}/notes",
        post().to(discussions::reply::<merge_requests::MergeRequestNotes>),
    );

    // ---- CI: pipelines and jobs --------------------------------------------------
    cfg.route("/projects/{id}/pipelines", get().to(ci::list_pipelines));
    cfg.route(
        "/projects/{id}/pipelines/{pipeline_id}",
        get().to(ci::show_pipeline),
    );
    cfg.route(
        "/projects/{id}/pipelines/{pipeline_id}/jobs",
        get().to(ci::pipeline_jobs),
    );
    cfg.route("/projects/{id}/jobs", get().to(ci::list_jobs));
    cfg.route("/projects/{id}/jobs/import", post().to(ci::import_job));
    cfg.route("/projects/{id}/jobs/{job_id}", get().to(ci::show_job));
    cfg.route(
        "/projects/{id}/jobs/{job_id}/trace",
        get().to(ci::job_trace),
    );

    // ---- Duo Workflow: the public API --------------------------------------------
    cfg.route(
        "/ai/duo_workflows/workflows/agent_privileges",
        get().to(workflows::agent_privileges),
    );
    cfg.route(
        "/ai/duo_workflows/workflows",
        post().to(workflows::create_workflow),
    );
    cfg.route(
        "/ai/duo_workflows/workflows",
        get().to(workflows::list_workflows),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}",
        delete().to(workflows::delete_workflow),
    );
    cfg.route(
        "/ai/duo_workflows/direct_access",
        post().to(workflows::direct_access),
    );
    cfg.route(
        "/ai/duo_workflows/list_tools",
        get().to(workflows::list_tools),
    );
    cfg.route(
        "/service_accounts",
        post().to(workflows::create_service_account),
    );
    cfg.route(
        "/ai/duo_workflows/service_account",
        put().to(workflows::set_workflow_service_account),
    );
    cfg.route(
        "/ai/duo_workflows/service_account",
        get().to(workflows::show_workflow_service_account),
    );

    // ---- Duo Workflow: the internal API of the service and executors -------------
    cfg.route(
        "/ai/duo_workflows/revoke_token",
        post().to(workflows_internal::revoke_token),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}",
        get().to(workflows_internal::show),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}",
        patch().to(workflows_internal::update_status),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}/checkpoints",
        post().to(workflows_internal::create_checkpoint),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}/checkpoints",
        get().to(workflows_internal::list_checkpoints),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}/checkpoints/{checkpoint_id}",
        get().to(workflows_internal::show_checkpoint),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}/checkpoint_writes_batch",
        post().to(workflows_internal::create_writes),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}/events",
        post().to(workflows_internal::create_event),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}/events",
        get().to(workflows_internal::list_events),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}/events/{event_id}",
        put().to(workflows_internal::update_event),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}/run_lock",
        post().to(workflows_internal::take_run_lock),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}/run_lock/{run_id}",
        put().to(workflows_internal::renew_run_lock),
    );
    cfg.route(
        "/ai/duo_workflows/workflows/{id}/run_lock/{run_id}",
        delete().to(workflows_internal::release_run_lock),
    );

    // ---- Duo Workflow: the executor's socket --------------------------------------
    cfg.route("/ai/duo_workflows/ws", get().to(workflows_socket::open));
    // The MCP server (streamable HTTP: POST messages, GET the server's
    // stream, DELETE a session).
    cfg.route("/mcp", post().to(mcp::handle));
    cfg.route("/mcp", get().to(mcp::handle));
    cfg.route("/mcp", delete().to(mcp::handle));
}

/// The members routes under `all` (`/groups/{id}/members` or
/// `/projects/{id}/members`); `K` tells the handlers which kind of container
/// `{id}` names.
fn member_routes<K: members::SourceKind>(cfg: &mut ServiceConfig, all: &str) {
    let member = format!("{all}/{{user_id}}");
    cfg.route(all, get().to(members::list::<K>));
    cfg.route(all, post().to(members::add::<K>));
    cfg.route(&member, get().to(members::show::<K>));
    cfg.route(&member, put().to(members::update::<K>));
    cfg.route(&member, delete().to(members::remove::<K>));
}
