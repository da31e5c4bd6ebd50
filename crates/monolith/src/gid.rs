//! GitLab global IDs: `gid://gitlab/<Model>/<id>`.

pub fn format(model: &str, id: i64) -> String {
    format!("gid://gitlab/{model}/{id}")
}

/// Splits a global ID into its model name and numeric id.
pub fn parse(gid: &str) -> Option<(&str, i64)> {
    let rest = gid.strip_prefix("gid://gitlab/")?;
    let (model, id) = rest.rsplit_once('/')?;
    if model.is_empty() || !model.chars().all(|c| c.is_ascii_alphanumeric() || c == ':') {
        return None;
    }
    let id: i64 = id.parse().ok().filter(|n| *n > 0)?;
    Some((model, id))
}

/// A UUID derived from `text` (SHA-256, first 16 bytes): stable, and reveals nothing.
pub fn stable_uuid(text: &str) -> uuid::Uuid {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Uuid::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert_eq!(parse("gid://gitlab/Issue/12"), Some(("Issue", 12)));
        assert_eq!(parse("gid://gitlab/Ci::Build/3"), Some(("Ci::Build", 3)));
        assert_eq!(parse("gid://gitlab/Issue/abc"), None);
        assert_eq!(parse("gid://gitlab/Issue/-1"), None);
        assert_eq!(parse("gid://other/Issue/1"), None);
        assert_eq!(parse("gid://gitlab/../1"), None);
        assert_eq!(format("Issue", 5), "gid://gitlab/Issue/5");
    }
}
