//! Unit primitives: the named capabilities a JWT's `scopes` claim grants.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

macro_rules! unit_primitives {
    ($($variant:ident => $name:literal),* $(,)?) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum UnitPrimitive {
            $(#[serde(rename = $name)] $variant,)*
        }

        impl UnitPrimitive {
            pub const ALL: &'static [UnitPrimitive] = &[$(UnitPrimitive::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self { $(UnitPrimitive::$variant => $name,)* }
            }
        }

        impl FromStr for UnitPrimitive {
            type Err = UnknownUnitPrimitive;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name => Ok(UnitPrimitive::$variant),)*
                    other => Err(UnknownUnitPrimitive(other.to_owned())),
                }
            }
        }
    };
}

unit_primitives! {
    DuoChat => "duo_chat",
    AskBuild => "ask_build",
    AskCommit => "ask_commit",
    AskEpic => "ask_epic",
    AskIssue => "ask_issue",
    AskMergeRequest => "ask_merge_request",
    DocumentationSearch => "documentation_search",
    IncludeFileContext => "include_file_context",
    IncludeSnippetContext => "include_snippet_context",
    IncludeMergeRequestContext => "include_merge_request_context",
    IncludeIssueContext => "include_issue_context",
    IncludeDependencyContext => "include_dependency_context",
    IncludeLocalGitContext => "include_local_git_context",
    IncludeTerminalContext => "include_terminal_context",
    IncludeRepositoryContext => "include_repository_context",
    IncludeDirectoryContext => "include_directory_context",
    IncludeUserRuleContext => "include_user_rule_context",
    ExplainCode => "explain_code",
    FixCode => "fix_code",
    RefactorCode => "refactor_code",
    WriteTests => "write_tests",
    CompleteCode => "complete_code",
    GenerateCode => "generate_code",
    ExplainVulnerability => "explain_vulnerability",
    ResolveVulnerability => "resolve_vulnerability",
    TroubleshootJob => "troubleshoot_job",
    SummarizeComments => "summarize_comments",
    SummarizeReview => "summarize_review",
    ReviewMergeRequest => "review_merge_request",
    SummarizeNewMergeRequest => "summarize_new_merge_request",
    GenerateDescription => "generate_description",
    GenerateCommitMessage => "generate_commit_message",
    GenerateEmbeddingsCodebase => "generate_embeddings_codebase",
    CodebaseSearch => "codebase_search",
    GlabAskGitCommand => "glab_ask_git_command",
    DuoWorkflowExecuteWorkflow => "duo_workflow_execute_workflow",
    DuoWorkflowGenerateToken => "duo_workflow_generate_token",
    DuoAgentPlatform => "duo_agent_platform",
}

impl fmt::Display for UnitPrimitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown unit primitive {0}")]
pub struct UnknownUnitPrimitive(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for up in UnitPrimitive::ALL {
            assert_eq!(up.as_str().parse::<UnitPrimitive>().unwrap(), *up);
            let json = serde_json::to_string(up).unwrap();
            assert_eq!(json, format!("\"{}\"", up.as_str()));
        }
        assert!("duo_chatt".parse::<UnitPrimitive>().is_err());
    }
}
