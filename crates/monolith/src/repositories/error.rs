//! What can go wrong with a repository: one error type for storing, reading
//! and writing them (its own module, so those modules need not import each
//! other for it).

#[derive(Debug, thiserror::Error)]
pub enum RepositoryError {
    #[error("git failed: {0}")]
    Git(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("reading the repository: {0}")]
    Read(String),
    #[error("the branch changed meanwhile; try again")]
    Conflict,
}
