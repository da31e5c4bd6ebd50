//! The Duo Chat tool catalogue: every tool the ReAct agent may offer, defined
//! once, in the order GitLab lists them. The monolith runs the tools; the
//! gateway only decides which ones a caller may see.
//!
//! Adding a tool is one entry in [`TOOLS`] plus its test (`docs/adding-a-tool.md`).

use crate::auth::GatewayUser;
use contracts::UnitPrimitive;
use semver::Version;

/// The error event's message when the model picks a tool the caller may not
/// use (not in its [`DuoChatToolsRegistry::tools_for`]).
pub const TOOL_NOT_AVAILABLE: &str = "tool not available";

/// One tool as it appears in the ReAct prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ToolDefinition {
    /// What the model writes after `Action:`.
    pub name: &'static str,
    /// The GitLab resource this tool reads, listed as "resources you can read".
    pub resource: &'static str,
    /// When to use the tool.
    pub description: &'static str,
    /// A worked example: the question and the Action Input to give.
    pub example: &'static str,
    /// The scope a caller needs for this tool to be offered.
    #[serde(skip)]
    pub unit_primitive: UnitPrimitive,
    /// The oldest monolith (`X-Gitlab-Version`) that can run this tool.
    #[serde(skip)]
    pub min_gitlab_version: Option<&'static str>,
    /// A feature flag (`x-gitlab-enabled-feature-flags`) the tool also needs.
    #[serde(skip)]
    pub feature_flag: Option<&'static str>,
}

/// Monolith versions before this cannot run build, merge request and commit tools.
const VERSION_17_5: &str = "17.5.0-pre";

/// The catalogue, in prompt order.
pub const TOOLS: &[ToolDefinition] = &[
    ToolDefinition {
        name: "build_reader",
        resource: "builds",
        description: "Reads one CI/CD build (job) and answers questions about it. \
            Choose it only when the question names a build by its ID or URL, or when \
            the user is currently looking at a build. It cannot search or list builds. \
            Give the user's question unchanged as the Action Input.",
        example: "Question: Why did build 4521 fail?\n\
            Thought: The question names build 4521, so I should read that build.\n\
            Action: build_reader\n\
            Action Input: Why did build 4521 fail?",
        unit_primitive: UnitPrimitive::AskBuild,
        min_gitlab_version: Some(VERSION_17_5),
        feature_flag: None,
    },
    ToolDefinition {
        name: "epic_reader",
        resource: "epics",
        description: "Reads one epic (or work item of type epic) and answers questions \
            about it. Choose it only when the question names an epic by its reference \
            (such as &12) or URL, or when the user is currently looking at an epic. It \
            cannot search or list epics. Give the user's question unchanged as the \
            Action Input.",
        example: "Question: What is left to do in epic &12?\n\
            Thought: The question names epic &12, so I should read that epic.\n\
            Action: epic_reader\n\
            Action Input: What is left to do in epic &12?",
        unit_primitive: UnitPrimitive::AskEpic,
        min_gitlab_version: None,
        feature_flag: None,
    },
    ToolDefinition {
        name: "issue_reader",
        resource: "issues",
        description: "Reads one issue and answers questions about it. Choose it only \
            when the question names an issue by its reference (such as #34) or URL, or \
            when the user is currently looking at an issue. It cannot search issues by \
            keyword or list them. Give the user's question unchanged as the Action Input.",
        example: "Question: Summarize the discussion in issue #34.\n\
            Thought: The question names issue #34, so I should read that issue.\n\
            Action: issue_reader\n\
            Action Input: Summarize the discussion in issue #34.",
        unit_primitive: UnitPrimitive::AskIssue,
        min_gitlab_version: None,
        feature_flag: None,
    },
    ToolDefinition {
        name: "merge_request_reader",
        resource: "merge_requests",
        description: "Reads one merge request and answers questions about it. Choose it \
            only when the question names a merge request by its reference (such as !56) \
            or URL, or when the user is currently looking at a merge request. It cannot \
            search or list merge requests. Give the user's question unchanged as the \
            Action Input.",
        example: "Question: What does merge request !56 change?\n\
            Thought: The question names merge request !56, so I should read it.\n\
            Action: merge_request_reader\n\
            Action Input: What does merge request !56 change?",
        unit_primitive: UnitPrimitive::AskMergeRequest,
        min_gitlab_version: Some(VERSION_17_5),
        feature_flag: None,
    },
    ToolDefinition {
        name: "gitlab_documentation",
        resource: "documentation answers",
        description: "Searches the GitLab documentation. Choose it for questions about \
            how GitLab works: its features, settings, CI/CD configuration and \
            administration. Give a short search query built from the question's key \
            words as the Action Input.",
        example: "Question: How do I protect a branch?\n\
            Thought: This is a question about a GitLab feature, so the documentation \
            should answer it.\n\
            Action: gitlab_documentation\n\
            Action Input: protect a branch",
        unit_primitive: UnitPrimitive::DocumentationSearch,
        min_gitlab_version: None,
        feature_flag: None,
    },
    ToolDefinition {
        name: "commit_reader",
        resource: "commits",
        description: "Reads one commit and answers questions about it. Choose it only \
            when the question names a commit by its SHA or URL, or when the user is \
            currently looking at a commit. It cannot search or list commits. Give the \
            user's question unchanged as the Action Input.",
        example: "Question: Explain the change made in commit 9f3c2ab.\n\
            Thought: The question names commit 9f3c2ab, so I should read that commit.\n\
            Action: commit_reader\n\
            Action Input: Explain the change made in commit 9f3c2ab.",
        unit_primitive: UnitPrimitive::AskCommit,
        min_gitlab_version: Some(VERSION_17_5),
        feature_flag: Some("ai_commit_reader_for_chat"),
    },
    ToolDefinition {
        name: "codebase_search",
        resource: "repository code",
        description: "Searches the code of one project's repository (its default branch) \
            and returns the most relevant pieces of files. Choose it for questions about \
            how something is implemented or configured in a project's code, or where \
            something is defined. Give the project's full path (such as acme/website) \
            followed by a short search query as the Action Input; leave the path out \
            when the user is looking at the project.",
        example: "Question: Where is the rate limit configured in acme/website?\n\
            Thought: This asks about the code of acme/website, so I should search it.\n\
            Action: codebase_search\n\
            Action Input: acme/website rate limit configuration",
        unit_primitive: UnitPrimitive::CodebaseSearch,
        min_gitlab_version: None,
        // Offered only to monoliths that say they run it.
        feature_flag: Some("ai_codebase_search_for_chat"),
    },
];

/// The tool catalogue (GitLab's `DuoChatToolsRegistry`).
#[derive(Debug, Clone, Copy, Default)]
pub struct DuoChatToolsRegistry;

impl DuoChatToolsRegistry {
    pub fn all(&self) -> &'static [ToolDefinition] {
        TOOLS
    }

    /// The tools this caller may use, in catalogue order. Debug users get
    /// every tool. A version-gated tool needs a valid `X-Gitlab-Version` at
    /// least its minimum; a flag-gated tool needs its flag in `flags`.
    pub fn tools_for(
        &self,
        user: &GatewayUser,
        gitlab_version: Option<&str>,
        flags: &[&str],
    ) -> Vec<&'static ToolDefinition> {
        if user.is_debug {
            return TOOLS.iter().collect();
        }
        let client_version = gitlab_version.and_then(parse_gitlab_version);
        TOOLS
            .iter()
            .filter(|tool| user.can(tool.unit_primitive))
            .filter(|tool| match tool.min_gitlab_version {
                None => true,
                Some(min) => match (&client_version, Version::parse(min)) {
                    (Some(client), Ok(min)) => *client >= min,
                    _ => false,
                },
            })
            .filter(|tool| tool.feature_flag.is_none_or(|flag| flags.contains(&flag)))
            .collect()
    }

    /// Looks a tool up by the name the model wrote.
    pub fn find(&self, name: &str) -> Option<&'static ToolDefinition> {
        TOOLS.iter().find(|tool| tool.name == name)
    }

    /// Looks a tool up by the unit primitive that grants it, as GitLab's
    /// registry is keyed. Each tool has its own unit primitive (the catalogue
    /// test checks it), so there is at most one.
    pub fn find_by_unit_primitive(
        &self,
        unit_primitive: UnitPrimitive,
    ) -> Option<&'static ToolDefinition> {
        TOOLS
            .iter()
            .find(|tool| tool.unit_primitive == unit_primitive)
    }
}

/// Splits `x-gitlab-enabled-feature-flags` (comma-separated) into names.
pub fn parse_feature_flags(header: Option<&str>) -> Vec<&str> {
    header
        .map(|h| {
            h.split(',')
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Reads an `X-Gitlab-Version` value. GitLab sends full versions (`17.5.0`,
/// `17.5.0-pre`); `17.5` is accepted as `17.5.0`. Anything else is invalid.
pub fn parse_gitlab_version(raw: &str) -> Option<Version> {
    let raw = raw.trim();
    if let Ok(version) = Version::parse(raw) {
        return Some(version);
    }
    let (core, pre) = match raw.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (raw, None),
    };
    let parts: Vec<&str> = core.split('.').collect();
    if parts.is_empty()
        || parts.len() > 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let mut padded = parts.join(".");
    for _ in parts.len()..3 {
        padded.push_str(".0");
    }
    if let Some(pre) = pre {
        padded.push('-');
        padded.push_str(pre);
    }
    Version::parse(&padded).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_TOOL_SCOPES: [&str; 6] = [
        "ask_build",
        "ask_epic",
        "ask_issue",
        "ask_merge_request",
        "documentation_search",
        "ask_commit",
    ];

    fn names(tools: &[&ToolDefinition]) -> Vec<&'static str> {
        tools.iter().map(|t| t.name).collect()
    }

    #[test]
    fn catalogue_matches_gitlab_order_and_fields() {
        let rows: Vec<_> = TOOLS
            .iter()
            .map(|t| {
                (
                    t.name,
                    t.resource,
                    t.unit_primitive.as_str(),
                    t.min_gitlab_version,
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                ("build_reader", "builds", "ask_build", Some("17.5.0-pre")),
                ("epic_reader", "epics", "ask_epic", None),
                ("issue_reader", "issues", "ask_issue", None),
                (
                    "merge_request_reader",
                    "merge_requests",
                    "ask_merge_request",
                    Some("17.5.0-pre")
                ),
                (
                    "gitlab_documentation",
                    "documentation answers",
                    "documentation_search",
                    None
                ),
                ("commit_reader", "commits", "ask_commit", Some("17.5.0-pre")),
                // Ours, after GitLab's: searches the code index.
                (
                    "codebase_search",
                    "repository code",
                    "codebase_search",
                    None
                ),
            ]
        );
        for tool in TOOLS {
            assert!(!tool.description.is_empty(), "{}", tool.name);
            assert!(
                tool.example.contains(&format!("Action: {}", tool.name)),
                "the example of {} shows the tool in use",
                tool.name
            );
            if let Some(min) = tool.min_gitlab_version {
                assert!(Version::parse(min).is_ok(), "{}", tool.name);
            }
        }
    }

    #[test]
    fn debug_users_get_every_tool() {
        let tools = DuoChatToolsRegistry.tools_for(&GatewayUser::debug(), None, &[]);
        assert_eq!(tools.len(), TOOLS.len());
    }

    #[test]
    fn scopes_filter_tools() {
        let user = GatewayUser::with_scopes(["duo_chat", "ask_issue", "documentation_search"]);
        let tools = DuoChatToolsRegistry.tools_for(&user, Some("17.6.0"), &[]);
        assert_eq!(names(&tools), vec!["issue_reader", "gitlab_documentation"]);
        let nobody = GatewayUser::with_scopes(["duo_chat"]);
        assert!(
            DuoChatToolsRegistry
                .tools_for(&nobody, Some("17.6.0"), &["ai_commit_reader_for_chat"])
                .is_empty()
        );
    }

    #[test]
    fn version_header_gates_tools() {
        let user = GatewayUser::with_scopes(ALL_TOOL_SCOPES);
        let flags = ["ai_commit_reader_for_chat"];
        let ungated = vec!["epic_reader", "issue_reader", "gitlab_documentation"];
        let everything = vec![
            "build_reader",
            "epic_reader",
            "issue_reader",
            "merge_request_reader",
            "gitlab_documentation",
            "commit_reader",
        ];
        let cases: [(Option<&str>, &Vec<&str>); 9] = [
            (None, &ungated),
            (Some(""), &ungated),
            (Some("not a version"), &ungated),
            (Some("17.4.9"), &ungated),
            (Some("17.5.0-pre"), &everything),
            (Some("17.5.0"), &everything),
            (Some("17.5"), &everything),
            (Some("18.0.0"), &everything),
            (Some("17.4.0-pre"), &ungated),
        ];
        for (version, expected) in cases {
            let tools = DuoChatToolsRegistry.tools_for(&user, version, &flags);
            assert_eq!(&names(&tools), expected, "version {version:?}");
        }
    }

    #[test]
    fn commit_reader_needs_its_feature_flag() {
        let user = GatewayUser::with_scopes(ALL_TOOL_SCOPES);
        let without = DuoChatToolsRegistry.tools_for(&user, Some("17.6.0"), &["other_flag"]);
        assert!(!names(&without).contains(&"commit_reader"));
        let header = Some("other_flag, ai_commit_reader_for_chat");
        let flags = parse_feature_flags(header);
        let with = DuoChatToolsRegistry.tools_for(&user, Some("17.6.0"), &flags);
        assert_eq!(names(&with).last(), Some(&"commit_reader"));
    }

    #[test]
    fn each_tool_is_found_by_its_own_unit_primitive() {
        for tool in TOOLS {
            assert_eq!(
                DuoChatToolsRegistry
                    .find_by_unit_primitive(tool.unit_primitive)
                    .map(|t| t.name),
                Some(tool.name),
                "{} must be the only tool granted by {}",
                tool.name,
                tool.unit_primitive
            );
        }
        assert!(
            DuoChatToolsRegistry
                .find_by_unit_primitive(UnitPrimitive::DuoChat)
                .is_none()
        );
    }

    #[test]
    fn find_looks_tools_up_by_name() {
        assert_eq!(
            DuoChatToolsRegistry
                .find("issue_reader")
                .map(|t| t.resource),
            Some("issues")
        );
        assert!(DuoChatToolsRegistry.find("DirectAnswer").is_none());
    }
}
