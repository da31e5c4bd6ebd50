//! Which files are never indexed (nor shown to AI features): binary files,
//! files over the size limit, vendored or generated paths, and the project's
//! Duo context exclusion globs.

use globset::{Glob, GlobSet, GlobSetBuilder};

/// Paths that hold other people's code or build output.
const VENDORED_DIRS: &[&str] = &[
    "vendor/",
    "node_modules/",
    "third_party/",
    "third-party/",
    "dist/",
    "build/",
    "target/",
    ".git/",
    "__pycache__/",
    ".venv/",
    "venv/",
    "bower_components/",
];

/// File names and suffixes of lock files, minified bundles and generated code.
const GENERATED_SUFFIXES: &[&str] = &[
    ".min.js",
    ".min.css",
    ".map",
    ".lock",
    "package-lock.json",
    "pnpm-lock.yaml",
    "go.sum",
    ".pb.go",
    "_pb2.py",
    ".snap",
];

/// Why a file stays out of the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    TooLarge,
    Binary,
    Vendored,
    Excluded,
}

/// A project's exclusion rules, compiled once per run.
#[derive(Debug, Clone)]
pub struct Exclusions {
    set: GlobSet,
}

/// A glob that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("{pattern:?} is not a valid glob: {reason}")]
pub struct BadGlob {
    pub pattern: String,
    pub reason: String,
}

impl Exclusions {
    /// Gitignore-like matching: a pattern without `/` matches the file name
    /// at any depth, and `dir/` or `dir/**` matches everything below `dir`.
    pub fn new(rules: &[String]) -> Result<Self, BadGlob> {
        let mut builder = GlobSetBuilder::new();
        for rule in rules {
            let rule = rule.trim();
            if rule.is_empty() {
                continue;
            }
            let rooted = rule.trim_start_matches('/');
            let mut patterns = Vec::new();
            if let Some(dir) = rooted.strip_suffix('/') {
                patterns.push(format!("{dir}/**"));
            } else {
                patterns.push(rooted.to_owned());
                patterns.push(format!("{rooted}/**"));
            }
            if !rule.starts_with('/') && !rooted.starts_with("**/") {
                let any_depth: Vec<String> = patterns.iter().map(|p| format!("**/{p}")).collect();
                patterns.extend(any_depth);
            }
            for pattern in patterns {
                let glob = Glob::new(&pattern).map_err(|e| BadGlob {
                    pattern: rule.to_owned(),
                    reason: e.kind().to_string(),
                })?;
                builder.add(glob);
            }
        }
        let set = builder.build().map_err(|e| BadGlob {
            pattern: rules.join(", "),
            reason: e.to_string(),
        })?;
        Ok(Self { set })
    }

    pub fn none() -> Self {
        Self {
            set: GlobSet::empty(),
        }
    }

    pub fn excludes(&self, path: &str) -> bool {
        self.set.is_match(path)
    }
}

/// Checks the rules a stored project setting must meet.
pub fn validate_rules(rules: &[String]) -> Result<(), String> {
    if rules.len() > 100 {
        return Err("at most 100 exclusion rules".into());
    }
    if let Some(r) = rules.iter().find(|r| r.len() > 255 || r.contains('\0')) {
        return Err(format!(
            "{:?} is too long or contains a NUL byte",
            r.chars().take(40).collect::<String>()
        ));
    }
    Exclusions::new(rules)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Whether the path alone rules a file out (vendored or generated).
pub fn is_vendored(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    VENDORED_DIRS
        .iter()
        .any(|d| lower.starts_with(d) || lower.contains(&format!("/{d}")))
        || GENERATED_SUFFIXES.iter().any(|s| lower.ends_with(s))
}

/// Whether content looks like text we can embed: UTF-8 without NUL bytes,
/// and not a generated file that says so at its top.
pub fn content_skip(bytes: &[u8]) -> Option<Skip> {
    let head = &bytes[..bytes.len().min(8000)];
    if head.contains(&0) || std::str::from_utf8(bytes).is_err() {
        return Some(Skip::Binary);
    }
    let top = String::from_utf8_lossy(&bytes[..bytes.len().min(600)]);
    if top.contains("@generated") || top.contains("DO NOT EDIT") {
        return Some(Skip::Vendored);
    }
    None
}

/// The decision for one file before its content is read.
pub fn path_skip(path: &str, size: u64, max_bytes: u64, exclusions: &Exclusions) -> Option<Skip> {
    if exclusions.excludes(path) {
        Some(Skip::Excluded)
    } else if is_vendored(path) {
        Some(Skip::Vendored)
    } else if size > max_bytes {
        Some(Skip::TooLarge)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(r: &[&str]) -> Exclusions {
        Exclusions::new(&r.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn exclusion_globs_match_like_gitignore() {
        let ex = rules(&["*.env", "secrets/", "/config/prod.yml", "**/fixtures/**"]);
        assert!(ex.excludes("app/.env") || ex.excludes("a.env"));
        assert!(ex.excludes("deep/down/x.env"));
        assert!(ex.excludes("secrets/key.txt"));
        assert!(ex.excludes("svc/secrets/key.txt"));
        assert!(ex.excludes("config/prod.yml"));
        assert!(!ex.excludes("other/config/prod.yml"));
        assert!(ex.excludes("spec/fixtures/data.json"));
        assert!(!ex.excludes("src/main.rs"));
        assert!(!Exclusions::none().excludes("anything"));
        assert!(Exclusions::new(&["[".to_owned()]).is_err());
    }

    #[test]
    fn vendored_generated_binary_and_large_files_are_skipped() {
        assert!(is_vendored("vendor/lib.rb"));
        assert!(is_vendored("web/node_modules/x/index.js"));
        assert!(is_vendored("dist/app.min.js"));
        assert!(is_vendored("Cargo.lock"));
        assert!(!is_vendored("src/vendors.rs"));
        assert_eq!(content_skip(b"abc\0def"), Some(Skip::Binary));
        assert_eq!(content_skip(&[0xff, 0xfe, 0x41]), Some(Skip::Binary));
        assert_eq!(
            content_skip(b"// Code generated by x. DO NOT EDIT.\n"),
            Some(Skip::Vendored)
        );
        assert_eq!(content_skip(b"fn main() {}"), None);
        assert_eq!(
            path_skip("a.rs", 2_000_000, 1_000_000, &Exclusions::none()),
            Some(Skip::TooLarge)
        );
        assert_eq!(path_skip("a.rs", 10, 1_000_000, &Exclusions::none()), None);
    }
}
