//! Running the system's `git` with a fixed environment: no user or system
//! configuration, no prompts. Storage, reading and writing all run it.

use std::process::Stdio;

use super::error::RepositoryError;

/// Runs `git` with these arguments; its stdout, or its stderr as the error.
pub(crate) async fn git(args: &[&str]) -> Result<Vec<u8>, RepositoryError> {
    git_with(args, &[], None).await
}

/// Runs `git` with extra environment and optional stdin.
pub(crate) async fn git_with(
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&[u8]>,
) -> Result<Vec<u8>, RepositoryError> {
    use tokio::io::AsyncWriteExt;
    let mut command = tokio::process::Command::new("git");
    command
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        // No user or system configuration changes what the monolith does.
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input).await?;
        drop(pipe);
    }
    let out = child.wait_with_output().await?;
    if !out.status.success() {
        return Err(RepositoryError::Git(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    Ok(out.stdout)
}
