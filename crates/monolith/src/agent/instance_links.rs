//! Links to this instance found in a question: the part of their path after
//! the instance's own (`acme/api/-/issues/1` for
//! `https://gitlab.example/acme/api/-/issues/1`). Links to other hosts or
//! ports name nothing here.

/// The path of `text` below `base`, without the leading `/`; `None` when
/// `text` is not a URL of this instance.
pub fn path_below(text: &str, base: &url::Url) -> Option<String> {
    let url = url::Url::parse(text.trim()).ok()?;
    if url.host_str() != base.host_str()
        || url.port_or_known_default() != base.port_or_known_default()
    {
        return None;
    }
    let path = url
        .path()
        .strip_prefix(base.path().trim_end_matches('/'))?
        .trim_start_matches('/');
    Some(path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::path_below;

    #[test]
    fn only_links_of_this_instance_have_a_path() {
        let base = url::Url::parse("http://gitlab.test:3000/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            path_below("http://gitlab.test:3000/acme/api/-/issues/1", &base).as_deref(),
            Some("acme/api/-/issues/1")
        );
        assert_eq!(path_below("http://gitlab.test:3001/acme/api", &base), None);
        assert_eq!(path_below("http://other.test:3000/acme/api", &base), None);
        assert_eq!(path_below("not a url", &base), None);
        let under =
            url::Url::parse("https://example.com/gitlab/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            path_below("https://example.com/gitlab/acme/api", &under).as_deref(),
            Some("acme/api")
        );
        assert_eq!(
            path_below("https://example.com/elsewhere/acme", &under),
            None
        );
    }
}
