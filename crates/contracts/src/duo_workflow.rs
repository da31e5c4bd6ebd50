//! The Duo Workflow service's messages and gRPC service
//! (`proto/duo_workflow.proto`), generated with tonic at build time: the
//! server trait in [`duo_workflow_server`] (the gateway implements it) and the
//! client in [`duo_workflow_client`] (the executor and the monolith's
//! WebSocket relay use it). Method paths are `/DuoWorkflow/<Method>`.
//!
//! Encode with [`prost::Message::encode_to_vec`], decode with
//! [`prost::Message::decode`]. Oneofs are Rust enums in the submodule named
//! after their message, e.g. [`client_event::Response`].

// Generated code follows protobuf's names, not Rust's conventions.
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/_.rs"));

pub use prost::Message;
pub use prost_types::{ListValue, Struct, Value, value::Kind};

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
                    ..McpTool::default()
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
                preapproved_tools: vec!["read_file".into()],
                resume_checkpoint_ts: Some("2026-01-01T00:00:00Z".into()),
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
            ClientEvent {
                response: Some(client_event::Response::Heartbeat(HeartbeatRequest {
                    timestamp: 1_700_000_000_000,
                })),
            },
            ClientEvent {
                response: Some(client_event::Response::StopWorkflow(StopWorkflowRequest {
                    reason: "ABORTED".into(),
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
                timeout: Some(120),
            }),
            A::RunHttpRequest(RunHttpRequest {
                method: "POST".into(),
                path: "/api/v4/projects/1/issues".into(),
                body: Some("{}".into()),
            }),
            A::RunReadFile(ReadFile {
                filepath: "src/main.rs".into(),
                limit: Some(10),
                offset: Some(1),
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
                status: "RUNNING".into(),
                checkpoint: "{}".into(),
                goal: "g".into(),
                errors: vec!["e".into()],
                agent_context_usage: HashMap::from([(
                    "chat".into(),
                    TokenBreakdown {
                        total_tokens: 10,
                        max_tokens: 100,
                    },
                )]),
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
            A::RunReadFiles(ReadFiles {
                filepaths: vec!["a".into(), "b".into()],
            }),
            A::RunShellCommand(RunShellCommand {
                command: "ls | wc -l".into(),
                timeout: Some(5),
            }),
            A::ScheduleNotification(ScheduleNotification {
                task_id: "t".into(),
                condition: r#"{"type":"timer"}"#.into(),
                message: "m".into(),
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
                ..ReadFile::default()
            })),
        };
        assert_eq!(
            action.encode_to_vec(),
            [0x0a, 1, b'x', 0x22, 3, 0x0a, 1, b'f']
        );
        let token = GenerateTokenResponse {
            token: "t".into(),
            expires_at: 1,
            server_capabilities: Vec::new(),
        };
        assert_eq!(token.encode_to_vec(), [0x0a, 1, b't', 0x10, 1]);
    }

    /// The two numbers our first proto had wrong: StartWorkflowRequest 11 is
    /// flowConfig (a Struct) and Action 14 is runReadFiles.
    #[test]
    fn flow_config_and_read_files_have_gitlabs_numbers() {
        let start = StartWorkflowRequest {
            flow_config: Some(Struct::default()),
            ..StartWorkflowRequest::default()
        };
        // Field 11, wire type 2: tag (11 << 3) | 2 = 0x5a, empty message.
        assert_eq!(start.encode_to_vec(), [0x5a, 0]);
        let action = Action {
            request_id: String::new(),
            action: Some(action::Action::RunReadFiles(ReadFiles {
                filepaths: vec!["f".into()],
            })),
        };
        // Field 14, wire type 2: tag (14 << 3) | 2 = 0x72.
        assert_eq!(action.encode_to_vec(), [0x72, 3, 0x0a, 1, b'f']);
        let event = ClientEvent {
            response: Some(client_event::Response::StopWorkflow(StopWorkflowRequest {
                reason: "x".into(),
            })),
        };
        assert_eq!(event.encode_to_vec(), [0x22, 3, 0x0a, 1, b'x']);
        let approval = Approval {
            user_decision: Some(approval::UserDecision::Approval(
                approval::Approved::default(),
            )),
        };
        assert_eq!(approval.encode_to_vec(), [0x0a, 0]);
    }

    #[test]
    fn service_paths_have_no_package() {
        use tonic::server::NamedService;
        assert_eq!(
            <duo_workflow_server::DuoWorkflowServer<Unimplemented> as NamedService>::NAME,
            "DuoWorkflow"
        );
    }

    struct Unimplemented;

    #[tonic::async_trait]
    impl duo_workflow_server::DuoWorkflow for Unimplemented {
        type ExecuteWorkflowStream = tonic::codegen::BoxStream<Action>;
        async fn execute_workflow(
            &self,
            _: tonic::Request<tonic::Streaming<ClientEvent>>,
        ) -> Result<tonic::Response<Self::ExecuteWorkflowStream>, tonic::Status> {
            Err(tonic::Status::unimplemented(""))
        }
        async fn generate_token(
            &self,
            _: tonic::Request<GenerateTokenRequest>,
        ) -> Result<tonic::Response<GenerateTokenResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented(""))
        }
        async fn list_capabilities(
            &self,
            _: tonic::Request<ListCapabilitiesRequest>,
        ) -> Result<tonic::Response<ListCapabilitiesResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented(""))
        }
        async fn list_tools(
            &self,
            _: tonic::Request<ListToolsRequest>,
        ) -> Result<tonic::Response<ListToolsResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented(""))
        }
        async fn list_flows(
            &self,
            _: tonic::Request<ListFlowsRequest>,
        ) -> Result<tonic::Response<ListFlowsResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented(""))
        }
        async fn validate_flow_config(
            &self,
            _: tonic::Request<ValidateFlowConfigRequest>,
        ) -> Result<tonic::Response<ValidateFlowConfigResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented(""))
        }
    }
}
