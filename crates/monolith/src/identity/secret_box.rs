//! Secrets the monolith must store and use again (API keys of self-hosted
//! models), sealed with AES-256-GCM under a key kept beside the signing keys
//! (`<DUO_SIGNING_KEY_DIR>/secrets.key`, created on first use, mode 0600). The
//! database alone never reveals them; back the key directory up with it.

use std::path::Path;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};

const KEY_FILE: &str = "secrets.key";
const KEY_LEN: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum SecretBoxError {
    #[error("reading or writing the secrets key: {0}")]
    Io(#[from] std::io::Error),
    #[error("the secrets key file is damaged (expected {KEY_LEN} bytes)")]
    BadKey,
    #[error("the random number generator failed")]
    Random,
    #[error("a sealed secret could not be opened (damaged, or sealed under another key)")]
    Open,
}

pub struct SecretBox {
    key: LessSafeKey,
    random: SystemRandom,
}

impl std::fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretBox(..)")
    }
}

impl SecretBox {
    /// The box of this key directory, creating its key the first time. Two
    /// processes starting together agree on one key: the file is created only
    /// if absent, and whoever loses the race reads the winner's.
    pub fn load_or_create(dir: &Path) -> Result<Self, SecretBoxError> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(KEY_FILE);
        let random = SystemRandom::new();
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut fresh = [0u8; KEY_LEN];
                random
                    .fill(&mut fresh)
                    .map_err(|_| SecretBoxError::Random)?;
                match write_new(&path, &fresh) {
                    Ok(()) => fresh.to_vec(),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        std::fs::read(&path)?
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        Self::from_key(&bytes)
    }

    pub fn from_key(bytes: &[u8]) -> Result<Self, SecretBoxError> {
        if bytes.len() != KEY_LEN {
            return Err(SecretBoxError::BadKey);
        }
        let key = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| SecretBoxError::BadKey)?;
        Ok(Self {
            key: LessSafeKey::new(key),
            random: SystemRandom::new(),
        })
    }

    /// `nonce || ciphertext || tag`, with `context` bound in (a secret sealed for
    /// one record cannot be moved to another).
    pub fn seal(&self, plaintext: &str, context: &str) -> Result<Vec<u8>, SecretBoxError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| SecretBoxError::Random)?;
        let mut data = plaintext.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut data,
            )
            .map_err(|_| SecretBoxError::Random)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        Ok(out)
    }

    pub fn open(&self, sealed: &[u8], context: &str) -> Result<String, SecretBoxError> {
        if sealed.len() < NONCE_LEN {
            return Err(SecretBoxError::Open);
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SecretBoxError::Open)?;
        let mut data = rest.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
            .map_err(|_| SecretBoxError::Open)?;
        String::from_utf8(plain.to_vec()).map_err(|_| SecretBoxError::Open)
    }
}

/// Creates `path` with `bytes` unless it exists, atomically: the key is
/// written whole to a temporary file first and then linked into place, so a
/// process starting at the same moment reads either no file or the whole key
/// (never an empty one), and exactly one key wins.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    linked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_secrets_open_only_with_their_key_and_context() {
        let dir = std::env::temp_dir().join(format!("duo-secret-box-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = SecretBox::load_or_create(&dir).unwrap();
        let again = SecretBox::load_or_create(&dir).unwrap();
        let sealed = a.seal("sk-live-123", "model:1").unwrap();
        assert!(!sealed.windows(11).any(|w| w == b"sk-live-123"));
        assert_eq!(again.open(&sealed, "model:1").unwrap(), "sk-live-123");
        assert!(a.open(&sealed, "model:2").is_err(), "bound to its record");
        let other = SecretBox::from_key(&[7u8; 32]).unwrap();
        assert!(other.open(&sealed, "model:1").is_err());
        assert_ne!(
            a.seal("x", "c").unwrap(),
            a.seal("x", "c").unwrap(),
            "fresh nonces"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
