//! Values of parameters many endpoints take, read GitLab's way: labels as one
//! comma-separated string, a literal search, `sort`, a `state` filter and a
//! visibility level. A value outside what GitLab accepts is a 400 naming the
//! parameter.

use super::ApiError;
use crate::work_items::SortOrder;

/// GitLab takes labels as one comma-separated string.
pub(super) fn split_labels(labels: Option<&str>) -> Vec<String> {
    labels
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// An `ILIKE` pattern matching text that contains `search` literally; `None` for
/// an absent or blank search.
pub(super) fn like_pattern(search: Option<&str>) -> Option<String> {
    let s = search.map(str::trim).filter(|s| !s.is_empty())?;
    let escaped = s
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    Some(format!("%{escaped}%"))
}

/// The `sort` parameter: `desc` (the default) or `asc`.
pub(super) fn sort_order(sort: Option<&str>) -> Result<SortOrder, ApiError> {
    match sort {
        None | Some("desc") => Ok(SortOrder::Desc),
        Some("asc") => Ok(SortOrder::Asc),
        Some(_) => Err(ApiError::BadRequest(
            "sort does not have a valid value".into(),
        )),
    }
}

/// The `state` filter of a list: `None` for `all` (the default), else one of
/// `states`.
pub(super) fn state_filter(
    state: Option<&str>,
    states: &[&str],
) -> Result<Option<String>, ApiError> {
    match state {
        None | Some("all") => Ok(None),
        Some(s) if states.contains(&s) => Ok(Some(s.to_owned())),
        Some(_) => Err(ApiError::BadRequest(
            "state does not have a valid value".into(),
        )),
    }
}

pub(super) const VISIBILITIES: &[&str] = &["private", "internal", "public"];

/// `private` < `internal` < `public`.
pub(super) fn visibility_rank(v: &str) -> usize {
    VISIBILITIES.iter().position(|x| *x == v).unwrap_or(0)
}

pub(super) fn check_visibility(v: Option<&str>) -> Result<String, ApiError> {
    let v = v.unwrap_or("private");
    if VISIBILITIES.contains(&v) {
        Ok(v.to_owned())
    } else {
        Err(ApiError::BadRequest(
            "visibility does not have a valid value".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_search_and_visibility() {
        assert_eq!(split_labels(Some(" bug, ,p1 ")), vec!["bug", "p1"]);
        assert!(split_labels(None).is_empty());
        assert_eq!(like_pattern(Some(" 50%_a\\ ")).unwrap(), "%50\\%\\_a\\\\%");
        assert_eq!(like_pattern(Some("  ")), None);
        assert!(visibility_rank("public") > visibility_rank("internal"));
        assert!(visibility_rank("internal") > visibility_rank("private"));
        assert_eq!(check_visibility(None).unwrap(), "private");
        assert!(check_visibility(Some("secret")).is_err());
    }
}
