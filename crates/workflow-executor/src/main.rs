//! `duo-workflow-executor`: see `duo-workflow-executor --help`.

use std::process::ExitCode;
use workflow_executor::cli::{self, Options, RuleApprover, TerminalReporter};
use workflow_executor::{ActionRunner, GitLabTarget, Limits, Session, SessionEnd, Workspace};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DUO_EXECUTOR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", cli::USAGE);
        return ExitCode::SUCCESS;
    }
    let options = match Options::parse(&args) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("duo-workflow-executor: {err}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    match run(options).await {
        Ok(SessionEnd::Finished) => {
            eprintln!("duo-workflow-executor: the workflow finished");
            ExitCode::SUCCESS
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

async fn run(options: Options) -> anyhow::Result<SessionEnd> {
    let workspace = Workspace::new(&options.workspace)?;
    let client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        .build()?;
    let workflow_id = match &options.workflow_id {
        Some(id) => id.clone(),
        None => cli::create_workflow(&client, &options).await?,
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
                headers: Vec::new(),
                ca_pem: None,
            },
        ),
        _ => {
            let access = cli::direct_access(&client, &options, &workflow_id).await?;
            (access.gitlab_token, access.service)
        }
    };
    if let Some(ca) = &options.ca_file {
        service.ca_pem = Some(std::fs::read(ca)?);
    }
    let runner = ActionRunner {
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
    let mut approver = RuleApprover::new(&options);
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
