//! GitLab's REST API takes a project or a group either by numeric id or by its
//! URL-encoded full path (`/projects/acme%2Fplatform%2Fapi`, `/groups/acme`).
//! This middleware turns the path form into the id before routing, so every
//! handler deals in ids only. An unknown path becomes id 0, which handlers
//! answer with 404, exactly as for a project the caller may not read: the
//! lookup reveals nothing.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{ResponseError, web};

use super::ApiError;
use crate::app_state::AppState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    Project,
    Group,
}

/// Where the id segment of a `/api/v4/projects/…` or `/api/v4/groups/…` path
/// is, when it is a path rather than a number.
pub fn path_segment(path: &str) -> Option<(Container, std::ops::Range<usize>)> {
    for (prefix, container) in [
        ("/api/v4/projects/", Container::Project),
        ("/api/v4/groups/", Container::Group),
    ] {
        let Some(rest) = path.strip_prefix(prefix) else {
            continue;
        };
        let len = rest.find('/').unwrap_or(rest.len());
        let segment = &rest[..len];
        if segment.is_empty() || segment.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        return Some((container, prefix.len()..prefix.len() + len));
    }
    None
}

async fn id_for(state: &AppState, container: Container, full_path: &str) -> Result<i64, ApiError> {
    let db = state.pool.get().await?;
    let found = match container {
        Container::Project => crate::namespaces::project_id_by_full_path(&*db, full_path).await?,
        Container::Group => crate::namespaces::group_id_by_full_path(&*db, full_path).await?,
    };
    Ok(found.unwrap_or(0))
}

pub async fn resolve_path_ids<B: MessageBody>(
    mut req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let path = req.uri().path().to_owned();
    if let Some((container, range)) = path_segment(&path) {
        let state = req.app_data::<web::Data<AppState>>().cloned();
        let id = match (state, crate::percent::decode(&path[range.clone()])) {
            (Some(state), Some(full_path)) => id_for(&state, container, &full_path).await,
            _ => Ok(0),
        };
        let id = match id {
            Ok(id) => id,
            Err(err) => {
                let response = err.error_response();
                return Ok(req.into_response(response).map_into_right_body());
            }
        };
        let mut rewritten = format!("{}{id}{}", &path[..range.start], &path[range.end..]);
        if let Some(query) = req.uri().query() {
            rewritten.push('?');
            rewritten.push_str(query);
        }
        if let Ok(uri) = rewritten.parse::<actix_web::http::Uri>() {
            req.match_info_mut().get_mut().update(&uri);
            req.head_mut().uri = uri;
        }
    }
    Ok(next.call(req).await?.map_into_left_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_path_segments_and_leaves_ids_alone() {
        let p = "/api/v4/projects/acme%2Fplatform%2Fapi/issues/1";
        let (kind, range) = path_segment(p).unwrap();
        assert_eq!(kind, Container::Project);
        assert_eq!(&p[range], "acme%2Fplatform%2Fapi");
        assert_eq!(path_segment("/api/v4/projects/12/issues"), None);
        assert_eq!(path_segment("/api/v4/projects"), None);
        assert_eq!(path_segment("/api/v4/projects/"), None);
        let (kind, range) = path_segment("/api/v4/groups/acme").unwrap();
        assert_eq!(kind, Container::Group);
        assert_eq!(range, 15..19);
        assert_eq!(path_segment("/api/v4/users/alice"), None);
    }
}
