//! Passwords for signing in to the web pages, hashed with argon2id (memory-hard;
//! the PHC string carries its salt and parameters, so they can be raised later).

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};

/// Shortest password accepted (GitLab's default minimum).
pub const MIN_PASSWORD_CHARS: usize = 8;
/// Longest password accepted: hashing cost must stay bounded.
pub const MAX_PASSWORD_BYTES: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("Password is too short (minimum is {MIN_PASSWORD_CHARS} characters)")]
    TooShort,
    #[error("Password is too long (maximum is {MAX_PASSWORD_BYTES} bytes)")]
    TooLong,
    #[error("hashing failed: {0}")]
    Hash(String),
}

/// The PHC string to store for `password`.
pub fn hash(password: &str) -> Result<String, PasswordError> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(PasswordError::TooShort);
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(PasswordError::TooLong);
    }
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| PasswordError::Hash(e.to_string()))
}

/// A stored hash of a password nobody knows: verifying against it when the user
/// does not exist costs the same time as a real check, so response times do not
/// tell which usernames exist.
static DECOY: std::sync::LazyLock<Option<String>> =
    std::sync::LazyLock::new(|| hash("decoy password that matches nothing").ok());

/// Whether `password` matches `stored` (a PHC string); `None` runs a decoy check.
pub fn verify(password: &str, stored: Option<&str>) -> bool {
    if password.len() > MAX_PASSWORD_BYTES {
        return false;
    }
    let (phc, real) = match stored {
        Some(s) => (s.to_owned(), true),
        None => match DECOY.as_ref() {
            Some(d) => (d.clone(), false),
            None => return false,
        },
    };
    let Ok(parsed) = PasswordHash::new(&phc) else {
        return false;
    };
    Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok()
        && real
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_verify_only_their_password_and_are_salted() {
        let a = hash("correct horse battery").unwrap();
        let b = hash("correct horse battery").unwrap();
        assert_ne!(a, b, "each hash has its own salt");
        assert!(a.starts_with("$argon2id$"));
        assert!(verify("correct horse battery", Some(&a)));
        assert!(!verify("correct horse batterY", Some(&a)));
        assert!(!verify("decoy password that matches nothing", None));
        assert!(!verify("anything", Some("not a phc string")));
        assert!(matches!(hash("short"), Err(PasswordError::TooShort)));
        assert!(matches!(
            hash(&"x".repeat(200)),
            Err(PasswordError::TooLong)
        ));
    }
}
