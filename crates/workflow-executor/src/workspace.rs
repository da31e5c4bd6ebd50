//! The workspace: the only directory tree actions may touch. Paths are
//! resolved against its root and refused when they leave it, through `..`,
//! an absolute path, or a symbolic link anywhere along the way. Nothing in a
//! `.git` directory is reachable either (its config and hooks run programs
//! the next time git runs), whether named directly or through a link.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

/// Whether a path component is git's directory (any case: on a
/// case-insensitive file system `.GIT` is the same directory).
pub fn is_git_dir_name(name: &OsStr) -> bool {
    name.as_encoded_bytes().eq_ignore_ascii_case(b".git")
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path is empty")]
    Empty,
    #[error("the path contains a NUL character")]
    Nul,
    #[error("{0} is outside the workspace")]
    Outside(String),
    #[error("{0} is in a .git directory, which actions may not touch")]
    GitDir(String),
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
}

#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// `root` must exist; it is canonicalised once.
    pub fn new(root: &Path) -> Result<Self, PathError> {
        let root = root.canonicalize().map_err(|e| PathError::Io {
            path: root.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The real location of `path` inside the workspace. The path need not
    /// exist (files to create); its deepest existing ancestor is resolved
    /// with symbolic links followed and must lie inside the root.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, PathError> {
        if path.trim().is_empty() {
            return Err(PathError::Empty);
        }
        if path.contains('\0') {
            return Err(PathError::Nul);
        }
        let outside = || PathError::Outside(path.to_owned());
        let given = Path::new(path);
        let relative = if given.is_absolute() {
            given.strip_prefix(&self.root).map_err(|_| outside())?
        } else {
            given
        };
        // Lexical clean-up first: `..` may never climb above the root.
        let mut clean = PathBuf::new();
        for component in relative.components() {
            match component {
                Component::Normal(part) if is_git_dir_name(part) => {
                    return Err(PathError::GitDir(path.to_owned()));
                }
                Component::Normal(part) => clean.push(part),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !clean.pop() {
                        return Err(outside());
                    }
                }
                Component::RootDir | Component::Prefix(_) => return Err(outside()),
            }
        }
        let candidate = self.root.join(&clean);
        // Then the file system: follow links on the deepest part that exists.
        let mut existing = candidate.as_path();
        let mut rest = Vec::new();
        loop {
            match existing.symlink_metadata() {
                Ok(_) => break,
                Err(_) => {
                    let Some(name) = existing.file_name() else {
                        return Err(outside());
                    };
                    rest.push(name.to_owned());
                    existing = existing.parent().ok_or_else(outside)?;
                }
            }
        }
        let real = existing.canonicalize().map_err(|e| PathError::Io {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let Ok(inside) = real.strip_prefix(&self.root) else {
            return Err(outside());
        };
        // A link that leads into `.git` under another name.
        if inside
            .components()
            .any(|c| matches!(c, Component::Normal(part) if is_git_dir_name(part)))
        {
            return Err(PathError::GitDir(path.to_owned()));
        }
        let mut resolved = real;
        for name in rest.into_iter().rev() {
            resolved.push(name);
        }
        Ok(resolved)
    }

    /// `path` relative to the root, for messages.
    pub fn display(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| path.display().to_string())
    }
}
