//! GitLab's Features API (`/features`): the instance's feature flags and
//! their gates, for instance administrators only.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::params::Params;
use super::{ApiError, READ_SCOPES, WRITE_SCOPES, require_admin};
use crate::app_state::AppState;
use crate::features::{self, FeatureError, Flag, FlagActor, GateChange, store};

impl From<FeatureError> for ApiError {
    fn from(e: FeatureError) -> Self {
        match e {
            FeatureError::Db(db) => db.into(),
            other => ApiError::BadRequest(other.to_string()),
        }
    }
}

/// A flag in GitLab's shape: `{name, state, gates: [{key, value}], definition}`.
fn feature_json(flag: &Flag) -> Value {
    let gates: Vec<Value> = flag
        .gates
        .clone()
        .unwrap_or_default()
        .gate_list()
        .into_iter()
        .map(|(key, value)| json!({ "key": key, "value": value }))
        .collect();
    let definition = flag.definition().map(|d| {
        json!({
            "name": d.name,
            "type": d.kind,
            "default_enabled": d.default_enabled,
            "description": d.description,
        })
    });
    json!({
        "name": flag.name,
        "state": flag.state().as_str(),
        "gates": gates,
        "definition": definition,
    })
}

/// `GET /features`: every flag an administrator set, with its gates.
pub(super) async fn list_features(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, READ_SCOPES).await?;
    let db = state.pool.get().await?;
    let flags: Vec<Value> = store::stored(&*db)
        .await?
        .into_iter()
        .map(|(name, gates)| {
            feature_json(&Flag {
                name,
                gates: Some(gates),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(flags))
}

#[derive(Debug, Deserialize)]
pub(super) struct SetFeature {
    value: Option<Value>,
    key: Option<String>,
    feature_group: Option<String>,
    user: Option<String>,
    group: Option<String>,
    namespace: Option<String>,
    project: Option<String>,
}

/// What `value` asks for, as GitLab reads it: `true`, `false` (or `0`), or
/// an integer percentage.
enum GateValue {
    Switch(bool),
    Percentage(u8),
}

fn gate_value(value: Option<&Value>) -> Result<GateValue, ApiError> {
    let bad = || {
        ApiError::BadRequest(
            "value must be true, false or an integer percentage from 0 to 100".into(),
        )
    };
    let number = |n: i64| u8::try_from(n).ok().filter(|p| *p <= 100).ok_or_else(bad);
    match value.ok_or_else(|| ApiError::BadRequest("value is missing".into()))? {
        Value::Bool(b) => Ok(GateValue::Switch(*b)),
        Value::Number(n) => match n.as_i64().ok_or_else(bad)? {
            0 => Ok(GateValue::Switch(false)),
            n => number(n).map(GateValue::Percentage),
        },
        Value::String(s) => match s.trim() {
            "true" => Ok(GateValue::Switch(true)),
            "false" | "0" => Ok(GateValue::Switch(false)),
            other => number(other.parse().map_err(|_| bad())?).map(GateValue::Percentage),
        },
        _ => Err(bad()),
    }
}

/// Comma-separated names, blanks dropped.
fn names(list: Option<&str>) -> Vec<String> {
    list.map(|l| {
        l.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect()
    })
    .unwrap_or_default()
}

/// The actors named by `user`, `group`, `namespace` and `project`; 400
/// naming the first that does not exist.
async fn actors(
    db: &impl crate::queries::Queries,
    b: &SetFeature,
) -> Result<Vec<FlagActor>, ApiError> {
    let mut found = Vec::new();
    for username in names(b.user.as_deref()) {
        let filter = crate::identity::users::UserFilter {
            username: Some(&username),
            pattern: None,
            pattern_matches_email: false,
            state: None,
        };
        let user = crate::identity::users::list(db, &filter)
            .await?
            .into_iter()
            .next();
        let user =
            user.ok_or_else(|| ApiError::BadRequest(format!("user {username} is not found")))?;
        found.push(FlagActor::User {
            id: user.id,
            admin: user.admin,
        });
    }
    // Groups are this instance's namespaces: `namespace` names one too.
    for (param, list) in [("group", &b.group), ("namespace", &b.namespace)] {
        for path in names(list.as_deref()) {
            let id = crate::namespaces::group_id_by_full_path(db, &path)
                .await?
                .ok_or_else(|| ApiError::BadRequest(format!("{param} {path} is not found")))?;
            found.push(FlagActor::Group(id));
        }
    }
    for path in names(b.project.as_deref()) {
        let id = crate::namespaces::project_id_by_full_path(db, &path)
            .await?
            .ok_or_else(|| ApiError::BadRequest(format!("project {path} is not found")))?;
        found.push(FlagActor::Project(id));
    }
    Ok(found)
}

/// `POST /features/:name`: sets a gate (creating the flag) and answers 201
/// with the flag.
pub(super) async fn set_feature(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    body: Params<SetFeature>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let name = path.into_inner();
    if !features::valid_name(&name) {
        return Err(FeatureError::InvalidName.into());
    }
    let b = body.into_inner();
    let value = gate_value(b.value.as_ref())?;
    let mut db = state.pool.get().await?;
    let actors = actors(&*db, &b).await?;
    let groups = names(b.feature_group.as_deref());
    let targeted = !actors.is_empty() || !groups.is_empty();
    let changes = match value {
        GateValue::Percentage(_) if targeted => {
            return Err(ApiError::BadRequest(
                "a percentage applies to every actor: leave out user, group, namespace, project and feature_group".into(),
            ));
        }
        GateValue::Percentage(p) => match b.key.as_deref().unwrap_or("percentage_of_time") {
            "percentage_of_time" => vec![GateChange::PercentageOfTime(p)],
            "percentage_of_actors" => vec![GateChange::PercentageOfActors(p)],
            _ => {
                return Err(ApiError::BadRequest(
                    "key does not have a valid value".into(),
                ));
            }
        },
        GateValue::Switch(on) if targeted => {
            let mut changes = Vec::new();
            if !actors.is_empty() {
                changes.push(GateChange::Actors(actors, on));
            }
            if !groups.is_empty() {
                changes.push(GateChange::Groups(groups, on));
            }
            changes
        }
        GateValue::Switch(on) => vec![GateChange::Boolean(on)],
    };
    if let Some(key) = b.key.as_deref()
        && !["percentage_of_time", "percentage_of_actors"].contains(&key)
    {
        return Err(ApiError::BadRequest(
            "key does not have a valid value".into(),
        ));
    }
    let gates = store::set(&mut db, &name, &changes).await?;
    Ok(HttpResponse::Created().json(feature_json(&Flag {
        name,
        gates: Some(gates),
    })))
}

/// `DELETE /features/:name`: forgets the flag (its default applies again);
/// 204 whether or not it was set.
pub(super) async fn delete_feature(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let name = path.into_inner();
    if !features::valid_name(&name) {
        return Err(FeatureError::InvalidName.into());
    }
    let db = state.pool.get().await?;
    store::delete(&*db, &name).await?;
    Ok(HttpResponse::NoContent().finish())
}
