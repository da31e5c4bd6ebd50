//! Agent privileges: which tool buckets a workflow's agent may use, and which
//! of them run without asking (GitLab's `AgentPrivileges`).

/// `(id, name, description)` of every privilege, in GitLab's numbering.
pub const ALL: &[(i16, &str, &str)] = &[
    (
        1,
        "read_write_files",
        "Allow local filesystem read/write access",
    ),
    (
        2,
        "read_only_gitlab",
        "Allow read only access to GitLab APIs",
    ),
    (3, "read_write_gitlab", "Allow write access to GitLab APIs"),
    (4, "run_commands", "Allow running any commands"),
    (
        5,
        "use_git",
        "Allow git commits, push and other git commands",
    ),
    (6, "run_mcp_tools", "Allow running MCP tools"),
    (
        7,
        "start_flows",
        "Allow starting foundational flows from chat",
    ),
    (8, "read_only_files", "Allow local filesystem read access"),
];

/// What a workflow gets when nothing is asked for (the column default).
pub const DEFAULT: &[i16] = &[1, 2];

pub fn name(id: i16) -> Option<&'static str> {
    ALL.iter().find(|(i, _, _)| *i == id).map(|(_, n, _)| *n)
}

/// The names of `ids`, skipping unknown ones.
pub fn names(ids: &[i16]) -> Vec<&'static str> {
    ids.iter().filter_map(|id| name(*id)).collect()
}

/// Checks a requested privilege list; the first unknown value is the error,
/// worded as GitLab's validation ("contains an invalid value 9").
pub fn check(ids: &[i64]) -> Result<Vec<i16>, String> {
    let mut out: Vec<i16> = Vec::with_capacity(ids.len());
    for id in ids {
        match i16::try_from(*id).ok().filter(|i| name(*i).is_some()) {
            Some(i) => {
                if !out.contains(&i) {
                    out.push(i);
                }
            }
            None => return Err(format!("contains an invalid value {id}")),
        }
    }
    Ok(out)
}
