//! The feature flags this code knows, with their defaults, and the feature
//! groups a gate may name. The one place a new flag is declared.

/// A flag the code reads. Until an administrator sets one of its gates, a
/// known flag is as `default_enabled` says; an unknown flag is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Definition {
    pub name: &'static str,
    pub default_enabled: bool,
    /// GitLab's flag types: `beta`, `gitlab_com_derisk`, `ops`, ...
    pub kind: &'static str,
    pub description: &'static str,
    /// Whether questions announce it to the AI gateway (flags only the
    /// monolith reads are not sent).
    pub announced: bool,
}

/// Every flag the code reads, by name.
pub const DEFINITIONS: &[Definition] = &[
    Definition {
        name: "ai_commit_reader_for_chat",
        default_enabled: true,
        kind: "beta",
        description: "Duo Chat may read commits (the commit_reader tool). The gateway offers \
            the tool only when the monolith announces this flag.",
        announced: true,
    },
    Definition {
        name: "ai_codebase_search_for_chat",
        default_enabled: true,
        kind: "beta",
        description: "Duo Chat may search a project's code (the codebase_search tool).",
        announced: true,
    },
    Definition {
        name: "duo_chat_categorize_question",
        default_enabled: true,
        kind: "ops",
        description: "Each chat question is categorised after its answer (one more model \
            call, for the AI usage analytics). Off: questions are recorded without a category.",
        announced: false,
    },
    Definition {
        name: "ai_react_prompt_next",
        default_enabled: false,
        kind: "beta",
        description: "Chat questions use the next version of the ReAct prompt, where one \
            ships behind this flag (the gateway picks it only when announced).",
        announced: true,
    },
];

/// The definition of a known flag.
pub fn definition(name: &str) -> Option<&'static Definition> {
    DEFINITIONS.iter().find(|d| d.name == name)
}

/// Feature groups a `groups` gate may name (GitLab registers
/// `gitlab_team_members`; an instance of its own has its admins).
pub const FEATURE_GROUPS: &[&str] = &[INSTANCE_ADMINS];

/// Everyone who administers the instance.
pub const INSTANCE_ADMINS: &str = "instance_admins";
