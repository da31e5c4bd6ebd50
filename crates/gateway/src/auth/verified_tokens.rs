//! Tokens whose signature and claims were checked, kept until they expire so
//! a caller that sends the same token again (the monolith reuses a user's
//! token for minutes, an instance its own for an hour) costs a look-up, not
//! another RS256 check (in `./dev bench gateway`, ~0.09 ms of the gateway's
//! own ~0.15 ms per `/v2/chat/agent` request).
//!
//! What keeps this as strict as checking every time:
//! - an entry is found by the whole token text, never by a part or a hash of
//!   it, and only a token that passed every check is kept;
//! - it is used only while the key its key id names is still the key that
//!   verified it (a key replaced under that id makes it checked again; a
//!   refetched set holding the same key does not), and only until its `exp`
//!   plus the leeway the checks allow;
//! - the audience and the other rules are the process's own, fixed at start;
//! - the number and the size of what is kept are bounded, so no caller can
//!   grow the gateway with it (and only holders of valid tokens add to it).

use super::GatewayUser;
use super::jwt::{TokenClaims, VerifyingKey};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Tokens kept at most; past that, expired ones go and, if none did, all.
pub const MAX_TOKENS: usize = 2048;
/// Longer tokens are checked every time (GitLab's are ~1 kB).
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// A checked token: its claims and the caller they make.
#[derive(Debug)]
pub struct Verified {
    pub claims: TokenClaims,
    pub user: GatewayUser,
}

/// A kept token: what its check found, the key that verified it, and until
/// when (`exp` plus the leeway, in seconds since the epoch) it may be reused.
#[derive(Debug)]
pub struct Kept {
    pub verified: Arc<Verified>,
    pub key: VerifyingKey,
    pub usable_until: u64,
}

/// The process's verified tokens; share one per authenticator.
#[derive(Debug, Default)]
pub struct VerifiedTokens {
    entries: Mutex<HashMap<Box<str>, Arc<Kept>>>,
}

impl VerifiedTokens {
    /// The kept result for `token`, if it is still within its time at `now`
    /// (seconds since the epoch). The caller still checks the key.
    pub fn get(&self, token: &str, now: u64) -> Option<Arc<Kept>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .get(token)
            .filter(|kept| now <= kept.usable_until)
            .cloned()
    }

    /// Keeps a token that passed every check.
    pub fn insert(&self, token: &str, kept: Kept, now: u64) {
        if token.len() > MAX_TOKEN_BYTES {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= MAX_TOKENS && !entries.contains_key(token) {
            entries.retain(|_, e| now <= e.usable_until);
            if entries.len() >= MAX_TOKENS {
                entries.clear();
            }
        }
        entries.insert(token.into(), Arc::new(kept));
    }

    /// Forgets a token (its key no longer matches).
    pub fn remove(&self, token: &str) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(token);
    }

    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A kept token verified with key "k", reusable until `usable_until`.
    fn kept(usable_until: u64) -> Kept {
        Kept {
            verified: Arc::new(Verified {
                claims: TokenClaims::default(),
                user: GatewayUser::default(),
            }),
            key: VerifyingKey {
                kid: "k".into(),
                key: Arc::new(jsonwebtoken::DecodingKey::from_secret(b"not used here")),
            },
            usable_until,
        }
    }

    #[test]
    fn a_token_is_found_by_its_whole_text_until_it_expires() {
        let tokens = VerifiedTokens::default();
        tokens.insert("a.b.c", kept(100), 50);
        assert!(tokens.get("a.b.c", 100).is_some());
        assert!(tokens.get("a.b.c", 101).is_none(), "past exp + leeway");
        assert!(tokens.get("a.b.", 50).is_none());
        assert!(tokens.get("a.b.cd", 50).is_none());
        assert_eq!(tokens.get("a.b.c", 60).unwrap().key.kid, "k");
    }

    #[test]
    fn what_is_kept_is_bounded() {
        let tokens = VerifiedTokens::default();
        for i in 0..MAX_TOKENS {
            tokens.insert(&format!("t{i}"), kept(100), 50);
        }
        assert_eq!(tokens.len(), MAX_TOKENS);
        // Full of expired tokens: they go, the new one stays.
        tokens.insert("new", kept(300), 200);
        assert_eq!(tokens.len(), 1);
        for i in 1..MAX_TOKENS {
            tokens.insert(&format!("u{i}"), kept(300), 200);
        }
        assert_eq!(tokens.len(), MAX_TOKENS);
        // Full of live ones: all go rather than growing.
        tokens.insert("newer", kept(300), 200);
        assert_eq!(tokens.len(), 1);
        assert!(tokens.get("newer", 200).is_some());
        let long = "x".repeat(MAX_TOKEN_BYTES + 1);
        tokens.insert(&long, kept(300), 200);
        assert!(tokens.get(&long, 200).is_none(), "too long to keep");
    }
}
