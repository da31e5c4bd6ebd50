//! `duo-workflow-executor`: see `duo-workflow-executor --help`.

use std::process::ExitCode;
use workflow_executor::cli::{self, Options, RuleApprover, TerminalReporter};
use workflow_executor::remote::{Relay, RunRepository};
use workflow_executor::{ActionRunner, GitLabTarget, Limits, Session, SessionEnd, Workspace};
use workflow_executor::{hardening, mcp};

fn main() -> ExitCode {
    // First of all, before any thread or child exists: the commands this
    // process runs must not read its memory, environment or command line.
    let inspectable = hardening::forbid_inspection().err();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secrets = match hardening::received() {
        Ok(Some(secrets)) => secrets,
        Ok(None) => {
            // Returns only when the restart failed; the run goes on as it is.
            let error = hardening::restart(&args);
            eprintln!(
                "duo-workflow-executor: warning: could not restart without the tokens in its command line and environment ({error})"
            );
            hardening::Secrets::default()
        }
        Err(e) => {
            eprintln!("duo-workflow-executor: could not read the tokens handed over at start: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(error) = inspectable {
        eprintln!(
            "duo-workflow-executor: warning: could not protect this process from inspection by its commands ({error})"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("duo-workflow-executor: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(start(args, secrets))
}

async fn start(args: Vec<String>, secrets: hardening::Secrets) -> ExitCode {
    let filter = std::env::var("DUO_EXECUTOR_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| "warn".to_owned());
    let _telemetry = duo_telemetry::init(duo_telemetry::LogOptions::new(
        "duo-workflow-executor",
        filter,
    ));
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", cli::USAGE);
        return ExitCode::SUCCESS;
    }
    let variable = |name: &str| {
        secrets
            .get(name)
            .map(str::to_owned)
            .or_else(|| std::env::var(name).ok())
    };
    let options = match Options::parse_with(&args, variable) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("duo-workflow-executor: {err}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    // A caller that started this process (the monolith's runner) passes its
    // trace in `TRACEPARENT`, the convention for processes.
    let span = tracing::info_span!("workflow.executor", otel.kind = "client");
    let traceparent = std::env::var("TRACEPARENT").ok();
    duo_telemetry::continue_from_traceparent(&span, traceparent.as_deref());
    let outcome = tracing::Instrument::instrument(run(options), span).await;
    match outcome {
        Ok(SessionEnd::Finished) => {
            eprintln!("duo-workflow-executor: the workflow finished");
            ExitCode::SUCCESS
        }
        Ok(SessionEnd::FinishedWithoutChanges(message)) => {
            eprintln!("duo-workflow-executor: the workflow finished WITHOUT CHANGES. {message}");
            ExitCode::from(4)
        }
        Ok(SessionEnd::Paused(status)) => {
            eprintln!(
                "duo-workflow-executor: the workflow is paused ({status}); run again with --approve or on a terminal to answer"
            );
            ExitCode::from(3)
        }
        Err(err) => {
            eprintln!("duo-workflow-executor: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(mut options: Options) -> anyhow::Result<SessionEnd> {
    // In a sandbox the relays are the only ways out: start them first.
    let _gitlab_relay = match &options.gitlab_socket {
        Some(socket) => {
            let relay = Relay::start(socket).await?;
            options.gitlab_url = relay.url();
            Some(relay)
        }
        None => None,
    };
    let _service_relay = match &options.service_socket {
        Some(socket) => {
            let relay = Relay::start(socket).await?;
            options.service_url = Some(relay.url());
            Some(relay)
        }
        None => None,
    };
    let repository = match (&options.clone_project, &options.workflow_id) {
        (Some(project), Some(workflow_id)) => {
            let (author_name, author_email) = options
                .git_author
                .clone()
                .unwrap_or_else(|| ("GitLab Duo".to_owned(), "duo@localhost".to_owned()));
            let repository = RunRepository {
                gitlab_url: options.gitlab_url.clone(),
                project_path: project.clone(),
                token: options.token.clone(),
                source_ref: options.source_ref.clone(),
                checkpoint_ref: options
                    .checkpoint_ref
                    .clone()
                    .unwrap_or_else(|| format!("refs/workloads/{workflow_id}")),
                author_name,
                author_email,
            };
            let resumed = repository.prepare(&options.workspace).await?;
            if !options.quiet {
                eprintln!(
                    "cloned {project} at {}{}",
                    repository.source_ref,
                    if resumed {
                        " and continued from the run's checkpoint"
                    } else {
                        ""
                    }
                );
            }
            Some(repository)
        }
        (Some(_), None) => anyhow::bail!("--clone-project needs --workflow-id"),
        _ => None,
    };
    let end = run_session(&options).await;
    if let (Some(repository), Some(workflow_id)) = (&repository, &options.workflow_id) {
        let outcome = match &end {
            Ok(SessionEnd::Finished) => "finished",
            Ok(SessionEnd::FinishedWithoutChanges(_)) => "finished without changes",
            Ok(SessionEnd::Paused(_)) => "paused",
            Err(_) => "stopped",
        };
        let message = format!("Duo Workflow {workflow_id}: checkpoint ({outcome})");
        match repository.checkpoint(&options.workspace, &message).await {
            Ok(commit) => eprintln!(
                "checkpoint {commit} pushed to {}",
                repository.checkpoint_ref
            ),
            Err(e) => eprintln!("duo-workflow-executor: the code checkpoint failed: {e}"),
        }
    }
    end
}

async fn run_session(options: &Options) -> anyhow::Result<SessionEnd> {
    let workspace = Workspace::new(&options.workspace)?;
    // No redirects: a redirect would carry the token to a path the
    // request-path check never saw.
    let client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let workflow_id = match &options.workflow_id {
        Some(id) => id.clone(),
        None => cli::create_workflow(&client, options).await?,
    };
    if !options.quiet {
        eprintln!("workflow {workflow_id}");
    }
    let (gitlab_token, mut service) = match (&options.service_url, &options.service_token) {
        (Some(url), Some(token)) => (
            options.token.clone(),
            workflow_executor::ServiceTarget {
                url: url.clone(),
                token: token.clone(),
                headers: options.service_headers.clone(),
                ca_pem: None,
            },
        ),
        _ => {
            let access = cli::direct_access(&client, options, &workflow_id).await?;
            (access.gitlab_token, access.service)
        }
    };
    if let Some(ca) = &options.ca_file {
        service.ca_pem = Some(std::fs::read(ca)?);
    }
    let mcp = connect_mcp(options, &client, &gitlab_token, &workflow_id, &workspace).await;
    let runner = ActionRunner {
        mcp,
        workspace,
        limits: Limits {
            max_file_bytes: options.max_file_bytes,
            default_command_timeout: options.command_timeout,
            allowed_commands: (!options.allowed_commands.is_empty())
                .then(|| options.allowed_commands.clone()),
            ..Limits::default()
        },
        gitlab: Some(GitLabTarget {
            base_url: options.gitlab_url.clone(),
            token: gitlab_token,
            client,
        }),
    };
    let mut approver = RuleApprover::new(options);
    let mut reporter = TerminalReporter::new(options.quiet);
    let end = workflow_executor::session::run(Session {
        target: service,
        workflow_id,
        goal: options.goal.clone().unwrap_or_default(),
        workflow_definition: options.definition.clone(),
        runner,
        approver: &mut approver,
        reporter: &mut reporter,
        max_reconnects: 3,
    })
    .await?;
    Ok(end)
}

/// Connects the MCP servers of the workspace's and the user's files, when
/// GitLab enables MCP for the workflow; what happened is printed, and no
/// failure here stops the run.
async fn connect_mcp(
    options: &Options,
    client: &reqwest::Client,
    gitlab_token: &str,
    workflow_id: &str,
    workspace: &Workspace,
) -> Option<std::sync::Arc<mcp::McpHub>> {
    if options.no_mcp {
        return None;
    }
    let (servers, warnings) = mcp::load(workspace, options.mcp_config.as_deref());
    for warning in &warnings {
        eprintln!("duo-workflow-executor: MCP configuration: {warning}");
    }
    if servers.is_empty() {
        return None;
    }
    let permission =
        match cli::workflow_entity(client, &options.gitlab_url, gitlab_token, workflow_id).await {
            Ok(entity) => mcp::Permission::from_workflow(&entity),
            Err(e) => {
                eprintln!("duo-workflow-executor: MCP servers not used: {e}");
                return None;
            }
        };
    let hub = mcp::McpHub::connect(
        servers,
        &permission,
        workspace.root(),
        mcp::McpLimits {
            call_timeout: options.mcp_timeout,
            ..mcp::McpLimits::default()
        },
    )
    .await;
    for report in &hub.reports {
        eprintln!("duo-workflow-executor: {report}");
    }
    Some(std::sync::Arc::new(hub))
}
