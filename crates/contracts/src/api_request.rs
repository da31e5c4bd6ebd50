//! The one check of a `runHTTPRequest` target, shared by the executor (which
//! relays it to GitLab with the workflow's token) and the monolith's socket
//! bridge (which answers it with a token minted for the run).
//!
//! A path is accepted only when it is already in canonical form and lies
//! under `/api/v4/` (or is exactly `/api/graphql`, GitLab's other API
//! endpoint). Rather than rewriting an odd path into a good one, every form
//! some parser on the way could read differently is refused: a dot segment,
//! literal or percent-encoded (also twice encoded, or hidden behind an
//! encoded slash), an empty segment (`//`), a backslash, a control character,
//! a fragment, an absolute URL or a scheme-relative `//host`. What passes is
//! sent byte for byte, so the checked path is the requested path.

/// The REST prefix every relayed request must stay under.
pub const API_PREFIX: &str = "/api/v4/";
/// GitLab's GraphQL endpoint (the proto names it as a relayed path).
pub const GRAPHQL_PATH: &str = "/api/graphql";
/// Longest path (with its query string) relayed.
pub const MAX_PATH_BYTES: usize = 8 * 1024;
/// Percent-decoding passes applied when looking for hidden dot segments:
/// enough for a path encoded twice or three times.
const DECODE_PASSES: usize = 3;

/// Why a request target is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiRequestError {
    #[error("the path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    #[error("only a path on this GitLab instance is allowed, not a URL or another host")]
    NotAPath,
    #[error(
        "the path contains a character that is not allowed (control, space, non-ASCII, backslash or '#')"
    )]
    BadCharacter,
    #[error("the path has an invalid percent-encoding")]
    BadEncoding,
    #[error("the path contains an empty segment ('//')")]
    EmptySegment,
    #[error("the path contains a '.' or '..' segment (literal or encoded)")]
    DotSegment,
    #[error("only paths under {API_PREFIX} or {GRAPHQL_PATH} are allowed")]
    OutsideApi,
    #[error("the method {0:?} is not allowed (GET, POST, PUT, PATCH or DELETE)")]
    Method(String),
}

/// The HTTP method of a relayed request, upper-cased; only the five methods
/// GitLab's REST API uses.
pub fn allowed_method(method: &str) -> Result<&'static str, ApiRequestError> {
    match method.to_ascii_uppercase().as_str() {
        "GET" => Ok("GET"),
        "POST" => Ok("POST"),
        "PUT" => Ok("PUT"),
        "PATCH" => Ok("PATCH"),
        "DELETE" => Ok("DELETE"),
        _ => Err(ApiRequestError::Method(method.chars().take(20).collect())),
    }
}

/// `raw` (a path with an optional query string) when it may be relayed, as
/// the exact text to append to the instance's base URL.
pub fn normalize_path(raw: &str) -> Result<&str, ApiRequestError> {
    if raw.len() > MAX_PATH_BYTES {
        return Err(ApiRequestError::TooLong);
    }
    if !raw.starts_with('/') || raw.starts_with("//") {
        return Err(ApiRequestError::NotAPath);
    }
    // Bytes a URL parser might drop, rewrite or read as a separator.
    if raw
        .bytes()
        .any(|b| b.is_ascii_control() || b == b' ' || b == b'\\' || b == b'#' || !b.is_ascii())
    {
        return Err(ApiRequestError::BadCharacter);
    }
    let (path, query) = match raw.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (raw, None),
    };
    percent_decode(path)?;
    if let Some(query) = query {
        // A NUL in a parameter could cut a value short further on.
        if percent_decode(query)?.contains(&0) {
            return Err(ApiRequestError::BadCharacter);
        }
    }
    // The first piece is the empty text before the leading '/'; a trailing
    // '/' leaves an empty last piece, which is harmless.
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (index, segment) in segments.iter().enumerate() {
        if segment.is_empty() && index != last {
            return Err(ApiRequestError::EmptySegment);
        }
        check_segment(segment)?;
    }
    let under_api = path.starts_with(API_PREFIX) || path == GRAPHQL_PATH;
    if !under_api {
        return Err(ApiRequestError::OutsideApi);
    }
    Ok(raw)
}

/// Refuses a segment that is, or decodes (up to [`DECODE_PASSES`] times)
/// into, a dot segment, a control character or a backslash. An encoded slash
/// (`%2F`, as in `group%2Fproject`) is fine unless it hides a dot segment.
fn check_segment(segment: &str) -> Result<(), ApiRequestError> {
    let mut current = segment.as_bytes().to_vec();
    for _ in 0..=DECODE_PASSES {
        // ';' too: some servers cut a segment's parameters there (`..;/`).
        if current
            .split(|b| matches!(b, b'/' | b'\\' | b';'))
            .any(|piece| piece == b"." || piece == b"..")
        {
            return Err(ApiRequestError::DotSegment);
        }
        if current.iter().any(|b| b.is_ascii_control() || *b == b'\\') {
            return Err(ApiRequestError::BadCharacter);
        }
        if !current.contains(&b'%') {
            return Ok(());
        }
        // A later pass may meet a literal '%' (sent as `%25`) that starts
        // no escape: nothing further can be hidden behind it.
        current = match std::str::from_utf8(&current).map(percent_decode) {
            Ok(Ok(decoded)) => decoded,
            _ => return Ok(()),
        };
    }
    Ok(())
}

/// One pass of percent-decoding; a '%' not followed by two hex digits is an
/// error.
fn percent_decode(text: &str) -> Result<Vec<u8>, ApiRequestError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let high = bytes.get(i + 1).and_then(|b| (*b as char).to_digit(16));
            let low = bytes.get(i + 2).and_then(|b| (*b as char).to_digit(16));
            match (high, low) {
                (Some(high), Some(low)) => {
                    out.push((high * 16 + low) as u8);
                    i += 3;
                }
                _ => return Err(ApiRequestError::BadEncoding),
            }
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_pass_unchanged() {
        for path in [
            "/api/v4/projects",
            "/api/v4/projects/",
            "/api/v4/projects/group%2Fsub%2Fproject/issues/7",
            "/api/v4/projects/1/repository/files/docs%2FREADME.md/raw?ref=main",
            "/api/v4/ai/duo_workflows/workflows/7/checkpoints?per_page=1",
            "/api/v4/projects/1/repository/files/.gitlab-ci.yml",
            "/api/v4/projects/1/repository/files/a%2F.hidden%2Fb",
            "/api/v4/search?search=a%2520b",
            "/api/v4/projects/1/repository/files/100%25zz",
            "/api/graphql",
        ] {
            assert_eq!(normalize_path(path), Ok(path), "{path}");
        }
    }

    #[test]
    fn traversal_in_every_spelling_is_refused() {
        for path in [
            "/api/v4/../../admin",
            "/api/v4/..",
            "/api/v4/./projects",
            "/api/v4/%2e%2e/x",
            "/api/v4/%2E%2E/admin",
            "/api/v4/.%2e/admin",
            "/api/v4/..%2f..%2fadmin",
            "/api/v4/..%2F..%2Fadmin",
            "/api/v4/x%2F..%2F..%2Fadmin",
            "/api/v4/%252e%252e/admin",
            "/api/v4/%25252e%25252e/admin",
            "/api/v4/..;/admin",
            "/api/v4/projects/1/..%3B/x",
        ] {
            assert_eq!(
                normalize_path(path),
                Err(ApiRequestError::DotSegment),
                "{path}"
            );
        }
    }

    #[test]
    fn other_hosts_and_odd_forms_are_refused() {
        let cases = [
            ("//evil.example/api/v4/", ApiRequestError::NotAPath),
            ("https://evil.example/api/v4/x", ApiRequestError::NotAPath),
            ("http:/api/v4/x", ApiRequestError::NotAPath),
            ("api/v4/projects", ApiRequestError::NotAPath),
            ("", ApiRequestError::NotAPath),
            ("/api/v4//projects", ApiRequestError::EmptySegment),
            ("/api/v4/..\\..\\admin", ApiRequestError::BadCharacter),
            ("/api/v4/%5c..%5cadmin", ApiRequestError::DotSegment),
            ("/api/v4/x%5cy", ApiRequestError::BadCharacter),
            ("/api/v4/x\0y", ApiRequestError::BadCharacter),
            ("/api/v4/x%00y", ApiRequestError::BadCharacter),
            ("/api/v4/x%0d%0aHost:%20evil", ApiRequestError::BadCharacter),
            ("/api/v4/x?q=%00", ApiRequestError::BadCharacter),
            ("/api/v4/x y", ApiRequestError::BadCharacter),
            ("/api/v4/x#frag", ApiRequestError::BadCharacter),
            ("/api/v4/é", ApiRequestError::BadCharacter),
            ("/api/v4/x%zz", ApiRequestError::BadEncoding),
            ("/api/v4/x%2", ApiRequestError::BadEncoding),
            ("/admin", ApiRequestError::OutsideApi),
            ("/api/v4", ApiRequestError::OutsideApi),
            ("/API/v4/projects", ApiRequestError::OutsideApi),
            ("/api/v3/projects", ApiRequestError::OutsideApi),
            ("/api/graphql/x", ApiRequestError::OutsideApi),
            ("/api/graphqlx", ApiRequestError::OutsideApi),
            ("/users/sign_in?x=/api/v4/", ApiRequestError::OutsideApi),
        ];
        for (path, expected) in cases {
            assert_eq!(normalize_path(path), Err(expected), "{path:?}");
        }
        let long = format!("/api/v4/{}", "a".repeat(MAX_PATH_BYTES));
        assert_eq!(normalize_path(&long), Err(ApiRequestError::TooLong));
    }

    #[test]
    fn only_the_rest_methods_are_allowed() {
        assert_eq!(allowed_method("get"), Ok("GET"));
        assert_eq!(allowed_method("Delete"), Ok("DELETE"));
        for method in ["CONNECT", "TRACE", "OPTIONS", "GET ", ""] {
            assert!(allowed_method(method).is_err(), "{method}");
        }
    }
}
