//! What a GraphQL document may cost before it is executed.

/// Deepest selection nesting accepted.
pub const MAX_QUERY_DEPTH: usize = 12;
/// Most fields (selections) accepted in one document.
pub const MAX_QUERY_COMPLEXITY: usize = 250;
/// Largest query document accepted, in bytes.
pub const MAX_QUERY_BYTES: usize = 20_000;

/// Rough but safe limits on a document before it is executed: nesting depth of
/// selection sets, number of selected names, and size.
pub fn check_limits(query: &str) -> Result<(), (&'static str, String)> {
    if query.len() > MAX_QUERY_BYTES {
        return Err((
            "QUERY_TOO_LARGE",
            format!("Query is too large (maximum is {MAX_QUERY_BYTES} bytes)"),
        ));
    }
    let mut depth = 0usize;
    let mut max_depth = 0usize;
    let mut names = 0usize;
    let mut in_string = false;
    let mut in_comment = false;
    let mut prev_ident = false;
    let mut paren = 0usize;
    let mut chars = query.chars().peekable();
    while let Some(c) = chars.next() {
        if in_comment {
            in_comment = c != '\n';
            continue;
        }
        if in_string {
            if c == '\\' {
                chars.next();
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        let ident = c.is_ascii_alphanumeric() || c == '_';
        match c {
            '#' => in_comment = true,
            '"' => in_string = true,
            '{' => {
                depth += 1;
                max_depth = max_depth.max(depth);
            }
            '}' => depth = depth.saturating_sub(1),
            '(' => paren += 1,
            ')' => paren = paren.saturating_sub(1),
            _ => {}
        }
        if ident && !prev_ident && depth > 0 && paren == 0 {
            names += 1;
        }
        prev_ident = ident;
    }
    // The operation's own braces count as one level.
    if max_depth > MAX_QUERY_DEPTH + 1 {
        return Err((
            "QUERY_TOO_DEEP",
            format!("Query has depth of {max_depth}, which exceeds max depth of {MAX_QUERY_DEPTH}"),
        ));
    }
    if names > MAX_QUERY_COMPLEXITY {
        return Err((
            "QUERY_TOO_COMPLEX",
            format!(
                "Query has complexity of {names}, which exceeds max complexity of {MAX_QUERY_COMPLEXITY}"
            ),
        ));
    }
    Ok(())
}
