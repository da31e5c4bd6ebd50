//! The Duo Workflow service's messages (`proto/duo_workflow.proto`),
//! generated with prost at build time. Only the messages: the gRPC service
//! itself comes with the workflow service.
//!
//! Encode with [`prost::Message::encode_to_vec`], decode with
//! [`prost::Message::decode`]. Oneofs are Rust enums in the submodule named
//! after their message, e.g. [`client_event::Response`].

// Generated code follows protobuf's names, not Rust's conventions.
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/_.rs"));

pub use prost::Message;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn start_request() -> ClientEvent {
        ClientEvent {
            response: Some(client_event::Response::StartRequest(StartWorkflowRequest {
                client_version: "1.2.3".into(),
                workflow_id: "42".into(),
                workflow_definition: "software_development".into(),
                goal: "Add a README".into(),
                workflow_metadata: r#"{"git_branch":"main"}"#.into(),
                client_capabilities: vec!["shell_command".into()],
                mcp_tools: vec![McpTool {
                    name: "lookup".into(),
                    description: "Looks things up".into(),
                    input_schema: r#"{"type":"object"}"#.into(),
                }],
                additional_context: vec![AdditionalContext {
                    category: "file".into(),
                    id: Some("README.md".into()),
                    content: Some("# Hello".into()),
                    metadata: None,
                }],
                approval: Some(Approval {
                    user_decision: Some(approval::UserDecision::Rejection(approval::Rejected {
                        message: Some("not that file".into()),
                    })),
                }),
                additional_tools: vec![Tool {
                    name: "deploy".into(),
                    source: "executor".into(),
                    description: "Deploys".into(),
                    input_schema: "{}".into(),
                }],
                ..StartWorkflowRequest::default()
            })),
        }
    }

    #[test]
    fn client_events_round_trip() {
        let events = [
            start_request(),
            ClientEvent {
                response: Some(client_event::Response::ActionResponse(ActionResponse {
                    request_id: "r1".into(),
                    response: String::new(),
                    response_type: Some(action_response::ResponseType::HttpResponse(
                        HttpResponse {
                            headers: HashMap::from([("content-type".into(), "json".into())]),
                            status_code: 201,
                            body: "{}".into(),
                            error: String::new(),
                        },
                    )),
                })),
            },
        ];
        for event in events {
            let bytes = event.encode_to_vec();
            assert!(!bytes.is_empty());
            assert_eq!(ClientEvent::decode(bytes.as_slice()).unwrap(), event);
        }
    }

    #[test]
    fn every_action_round_trips() {
        use action::Action as A;
        let actions = [
            A::RunCommand(RunCommandAction {
                program: "ls".into(),
                arguments: vec!["-la".into()],
                flags: vec!["--color=never".into()],
            }),
            A::RunHttpRequest(RunHttpRequest {
                method: "POST".into(),
                path: "/api/v4/projects/1/issues".into(),
                body: Some("{}".into()),
            }),
            A::RunReadFile(ReadFile {
                filepath: "src/main.rs".into(),
            }),
            A::RunWriteFile(WriteFile {
                filepath: "a.txt".into(),
                contents: "hé ✓".into(),
            }),
            A::RunGitCommand(RunGitCommand {
                command: "status".into(),
                arguments: None,
                repository_url: "https://gitlab.example/a/b.git".into(),
            }),
            A::RunEditFile(EditFile {
                filepath: "a.txt".into(),
                old_string: "a".into(),
                new_string: "b".into(),
            }),
            A::NewCheckpoint(NewCheckpoint {
                status: "Execution".into(),
                checkpoint: "{}".into(),
                goal: "g".into(),
                errors: vec!["e".into()],
            }),
            A::ListDirectory(ListDirectory {
                directory: ".".into(),
            }),
            A::Grep(Grep {
                search_directory: "src".into(),
                pattern: "fn main".into(),
                case_insensitive: true,
            }),
            A::FindFiles(FindFiles {
                name_pattern: "*.rs".into(),
            }),
            A::RunMcpTool(RunMcpTool {
                name: "lookup".into(),
                args: "{}".into(),
            }),
            A::Mkdir(Mkdir {
                directory_path: "docs".into(),
            }),
            A::RunTool(RunTool {
                name: "deploy".into(),
                args: "{}".into(),
            }),
        ];
        for (n, kind) in actions.into_iter().enumerate() {
            let action = Action {
                request_id: format!("r{n}"),
                action: Some(kind),
            };
            let decoded = Action::decode(action.encode_to_vec().as_slice()).unwrap();
            assert_eq!(decoded, action);
        }
    }

    #[test]
    fn field_numbers_match_the_wire() {
        // requestID is field 1 (tag 0x0a), runReadFile field 4 (tag 0x22).
        let action = Action {
            request_id: "x".into(),
            action: Some(action::Action::RunReadFile(ReadFile {
                filepath: "f".into(),
            })),
        };
        assert_eq!(
            action.encode_to_vec(),
            [0x0a, 1, b'x', 0x22, 3, 0x0a, 1, b'f']
        );
        let token = GenerateTokenResponse {
            token: "t".into(),
            expires_at: 1,
        };
        assert_eq!(token.encode_to_vec(), [0x0a, 1, b't', 0x10, 1]);
    }
}
