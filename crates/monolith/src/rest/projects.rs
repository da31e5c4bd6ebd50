//! Projects in GitLab's REST shapes: list, show, create, update.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::containers::{Container, actor, readable_project, require_write};
use super::item_access::Item;
use super::pagination::{PageParams, paged};
use super::param_values::{check_visibility, visibility_rank};
use super::{ApiError, WRITE_SCOPES};
use super::{optional_user, require_user};
use crate::app_state::AppState;
use crate::namespaces::projects::{self, Project, ProjectChanges};
use crate::policy::{Ability, Actor, DuoSwitchScope, Subject, WriteAbility};

// ---- projects -----------------------------------------------------------------

pub(super) fn project_json(state: &AppState, p: &Project) -> Value {
    let base = &state.config.external_url;
    let full_path = &p.full_path;
    let mut project = json!({
        "id": p.id,
        "name": p.name,
        "path": p.path,
        "path_with_namespace": full_path,
        "name_with_namespace": full_path.replace('/', " / "),
        "description": p.description,
        "visibility": p.visibility,
        "namespace": { "id": p.group_id, "kind": "group" },
        "web_url": format!("{}{full_path}", base.as_str()),
        "duo_features_enabled": p.duo_features_enabled,
        "created_at": p.created_at,
        "duo_context_exclusion_settings": {
            "exclusion_rules": p.duo_context_exclusion_rules,
        },
        // The code index behind codebase search (`docs/code-search.md`).
        "code_index": p.code_index.as_ref().map(|index| json!({
            "state": index.state,
            "chunk_count": index.chunk_count,
            "indexed_commit": index.indexed_commit,
            "indexed_at": index
                .indexed_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            "last_error_code": index.last_error_code,
        })),
    });
    super::repository_access::project_repository_fields(
        state,
        &mut project,
        p.id,
        full_path,
        &p.default_branch,
    );
    project
}

pub(super) async fn list_projects(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let user = actor(&optional_user(&state, &req).await?);
    let db = state.pool.get().await?;
    let item = Item::PROJECT;
    let mut items = Vec::new();
    for project in projects::list(&*db).await? {
        if state
            .policy
            .can(&*db, user, item.ability, (item.subject)(project.id))
            .await?
        {
            items.push(project_json(&state, &project));
        }
    }
    Ok(paged(&req, q.into_inner(), items))
}

pub(super) async fn project_response(state: &AppState, id: i64) -> Result<Value, ApiError> {
    let db = state.pool.get().await?;
    let project = projects::by_id(&*db, id)
        .await?
        .ok_or(ApiError::NotFound("Project"))?;
    Ok(project_json(state, &project))
}

pub(super) async fn show_project(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    readable_project(&state, &req, id).await?;
    Ok(HttpResponse::Ok().json(project_response(&state, id).await?))
}

#[derive(Deserialize)]
pub(super) struct NewProject {
    name: String,
    path: Option<String>,
    namespace_id: i64,
    visibility: Option<String>,
    description: Option<String>,
    duo_features_enabled: Option<bool>,
}

/// Maintainers and owners of the group (and admins) create projects in it.
pub(super) async fn create_project(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: super::params::Params<NewProject>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let b = body.into_inner();
    if !super::containers::can(
        &state,
        Some(Actor::from(&me)),
        Ability::ReadGroup,
        Subject::Group(b.namespace_id),
    )
    .await?
    {
        return Err(ApiError::NotFound("Namespace"));
    }
    require_write(
        &state,
        &me,
        WriteAbility::CreateProject,
        Subject::Group(b.namespace_id),
    )
    .await?;
    let visibility = check_visibility(b.visibility.as_deref())?;
    let path = b
        .path
        .unwrap_or_else(|| b.name.to_lowercase().replace(' ', "-"));
    let db = state.pool.get().await?;
    let new = projects::NewProject {
        group_id: b.namespace_id,
        name: &b.name,
        path: &path,
        visibility: &visibility,
        description: b.description.as_deref().unwrap_or_default(),
        duo_features_enabled: b.duo_features_enabled.unwrap_or(true),
    };
    let id = projects::create(&*db, &new)
        .await?
        .ok_or_else(|| ApiError::BadRequest("path has already been taken".into()))?;
    // Every project has its repository from the start (empty until a push).
    if let Err(e) = state.repositories.ensure(id, "main").await {
        projects::delete(&*db, id).await?;
        return Err(ApiError::Internal(format!("creating the repository: {e}")));
    }
    Ok(HttpResponse::Created().json(project_response(&state, id).await?))
}

/// Owners delete a project: its records go at once, and so does its repository
/// (GitLab answers 202, as its removal is scheduled).
pub(super) async fn delete_project(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    Container::Project(id)
        .writer(&state, &req, WriteAbility::RemoveProject)
        .await?;
    let db = state.pool.get().await?;
    projects::delete(&*db, id).await?;
    state
        .repositories
        .remove(id)
        .await
        .map_err(|e| ApiError::Internal(format!("removing the repository: {e}")))?;
    Ok(HttpResponse::Accepted().json(json!({ "message": "202 Accepted" })))
}

#[derive(Debug, Deserialize)]
pub(super) struct ProjectUpdate {
    name: Option<String>,
    /// The project's URL path: a rename moves nothing on disk (repositories are
    /// stored by id), so its history stays; the old clone URL stops working.
    path: Option<String>,
    description: Option<String>,
    visibility: Option<String>,
    duo_features_enabled: Option<bool>,
    /// GitLab's Duo context exclusion: `{"exclusion_rules": ["*.env", "secrets/"]}`.
    duo_context_exclusion_settings: Option<ExclusionSettings>,
}

#[derive(Debug, serde::Deserialize)]
pub(super) struct ExclusionSettings {
    exclusion_rules: Vec<String>,
}

/// Maintainers edit a project; renaming it or changing its visibility takes an
/// owner (GitLab's `rename_project` and `change_visibility_level`).
pub(super) async fn update_project(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<ProjectUpdate>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let me = Container::Project(id)
        .writer(&state, &req, WriteAbility::AdminProject)
        .await?;
    let subject = Subject::Project(id);
    let b = body.into_inner();
    let db = state.pool.get().await?;
    let projects::NameAndVisibility {
        name,
        visibility,
        group_visibility,
    } = projects::name_and_visibility(&*db, id).await?;
    if let Some(new_name) = b.name.as_deref() {
        if new_name.trim().is_empty() {
            return Err(ApiError::BadRequest("name is empty".into()));
        }
        if new_name != name {
            require_write(&state, &me, WriteAbility::RenameProject, subject).await?;
        }
    }
    if let Some(new_path) = b.path.as_deref() {
        let valid = !new_path.is_empty()
            && new_path.len() <= 255
            && new_path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !new_path.starts_with(['-', '.'])
            && !new_path.ends_with(".git")
            && !new_path.ends_with(".atom");
        if !valid {
            return Err(ApiError::invalid(
                "path",
                "can contain only letters, digits, '_', '-' and '.'. Cannot start with '-', end in '.git' or end in '.atom'",
            ));
        }
        require_write(&state, &me, WriteAbility::RenameProject, subject).await?;
    }
    if let Some(v) = b.visibility.as_deref() {
        let v = check_visibility(Some(v))?;
        if v != visibility {
            require_write(&state, &me, WriteAbility::ChangeProjectVisibility, subject).await?;
        }
        if visibility_rank(&v) > visibility_rank(&group_visibility) {
            return Err(ApiError::invalid(
                "visibility_level",
                format!("{v} is not allowed in a {group_visibility} group."),
            ));
        }
    }
    let exclusion_rules = match &b.duo_context_exclusion_settings {
        Some(settings) => {
            crate::code_index::filters::validate_rules(&settings.exclusion_rules)
                .map_err(|e| ApiError::invalid("duo_context_exclusion_settings", e))?;
            Some(settings.exclusion_rules.clone())
        }
        None => None,
    };
    if let Some(rules) = &exclusion_rules {
        // Chunks of newly excluded files are filtered from every search at
        // once and leave the index at the next run (a full walk).
        projects::set_exclusion_rules(&*db, id, rules).await?;
        crate::code_index::store::request_full_walk(&*db, id).await?;
        crate::code_index::enqueue_index(&*db, id, state.config.code_index.max_attempts)
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
    }
    let changes = ProjectChanges {
        name: b.name.as_deref(),
        description: b.description.as_deref(),
        visibility: b.visibility.as_deref(),
        duo_features_enabled: b.duo_features_enabled,
        path: b.path.as_deref(),
    };
    if !projects::update(&*db, id, &changes).await? {
        return Err(ApiError::invalid("path", "has already been taken"));
    }
    if b.duo_features_enabled.is_some() {
        follow_duo_switch(&state, &*db, DuoSwitchScope::Project(id)).await?;
    }
    Ok(HttpResponse::Ok().json(project_response(&state, id).await?))
}

/// The code index follows a Duo switch saved through the API.
pub(super) async fn follow_duo_switch(
    state: &AppState,
    db: &impl crate::queries::Queries,
    scope: DuoSwitchScope,
) -> Result<(), ApiError> {
    crate::duo_settings::follow_duo_switch(db, scope, state.config.code_index.max_attempts)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))
}
