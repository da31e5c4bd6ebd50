//! Every example of the README, as a new user would try it: `./dev run` with
//! no API key (the bundled model server, its weights fetched by the run
//! itself), then each question and command the README and `./dev run`'s
//! printed instructions give, judged for a useful answer. The README is the
//! source: the examples are read out of it, so an example added, changed or
//! dropped there changes what runs here, and an example this test cannot
//! judge fails it.
//!
//! Each example has a time bound; the times are printed
//! (`cargo nextest run -p e2e-tests readme --no-capture`).

use std::path::Path;
use std::time::{Duration, Instant};

use e2e_tests::repo_root;
use serde_json::{Value, json};

use crate::dev_run_e2e::{Env, signal};

/// How long one chat answer of the bundled model may take, on a 2-core
/// machine running nothing else (the e2e tests run alone).
const ANSWER_BOUND: Duration = Duration::from_secs(150);
/// How long the workflow example may take.
const WORKFLOW_BOUND: Duration = Duration::from_secs(300);

/// An example read out of the README (or `./dev run`'s instructions).
#[derive(Debug, Clone, PartialEq)]
enum Example {
    /// A chat question, as typed.
    Question(String),
    /// A GraphQL request, as written.
    Graphql(String),
    /// A shell command, as written.
    Shell(String),
}

/// The lines of the README section under `heading` (up to the next heading
/// of the same or a higher level).
fn section<'a>(readme: &'a str, heading: &str) -> &'a str {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let start = readme
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("the README has no section {heading:?}"))
        + heading.len()
        + 2;
    let rest = &readme[start..];
    let end = rest
        .match_indices("\n#")
        .find(|(at, _)| {
            let hashes = rest[at + 1..].chars().take_while(|c| *c == '#').count();
            hashes <= level && rest[at + 1 + hashes..].starts_with(' ')
        })
        .map_or(rest.len(), |(at, _)| at);
    &rest[..end]
}

/// The fenced code blocks of `text` with their info string.
fn code_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(info) = line.strip_prefix("```") {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            blocks.push((info.trim().to_owned(), body.join("\n")));
        }
    }
    blocks
}

/// Every example the README gives: the questions to try (a list of
/// `code` items), the repository question (a GraphQL block) and the Duo
/// Workflow command (a shell block).
fn readme_examples(readme: &str) -> Vec<Example> {
    let mut examples: Vec<Example> = section(readme, "## Questions to try")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- `"))
        .filter_map(|l| l.strip_suffix('`'))
        .map(|q| Example::Question(q.to_owned()))
        .collect();
    assert!(!examples.is_empty(), "no questions to try in the README");
    for (info, body) in code_blocks(section(readme, "## Ask about a repository")) {
        assert_eq!(
            info, "graphql",
            "an example this test does not know: {body}"
        );
        examples.push(Example::Graphql(body));
    }
    for (info, body) in code_blocks(section(readme, "### Run a Duo Workflow")) {
        assert_eq!(info, "sh", "an example this test does not know: {body}");
        examples.push(Example::Shell(body));
    }
    examples
}

/// The question in the `curl` line `./dev run` printed.
fn printed_question(printed: &str) -> String {
    let at = printed
        .find("content: \\\"")
        .unwrap_or_else(|| panic!("./dev run printed no question:\n{printed}"))
        + "content: \\\"".len();
    let end = printed[at..].find("\\\"").unwrap();
    printed[at..at + end].to_owned()
}

/// A line the answer says three times or more: the loop of a small model.
fn repeated_line(answer: &str) -> Option<&str> {
    let lines: Vec<&str> = answer
        .lines()
        .map(str::trim)
        .filter(|l| l.len() >= 20)
        .collect();
    lines
        .iter()
        .find(|l| lines.iter().filter(|m| m == l).count() >= 3)
        .copied()
}

struct Instance {
    web: String,
    token: String,
    http: reqwest::Client,
}

impl Instance {
    async fn graphql(&self, query: &str, variables: Value) -> Value {
        let body: Value = self
            .http
            .post(format!("http://{}/api/graphql", self.web))
            .bearer_auth(&self.token)
            .json(&json!({"query": query, "variables": variables}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(body.get("errors").is_none(), "GraphQL errors: {body}");
        body
    }

    async fn rest(&self, path: &str) -> Value {
        self.http
            .get(format!("http://{}/api/v4/{path}", self.web))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Sends an `aiAction` mutation and waits for its final answer's text.
    async fn answer(&self, mutation: &str, variables: Value) -> String {
        let accepted = self.graphql(mutation, variables).await;
        let action = &accepted["data"]["aiAction"];
        assert_eq!(action["errors"], json!([]), "{accepted}");
        let request_id = action["requestId"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + ANSWER_BOUND;
        loop {
            let messages = self
                .graphql(
                    "query($ids: [ID!]) { aiMessages(requestIds: $ids) { nodes { role content errors } } }",
                    json!({"ids": [request_id]}),
                )
                .await;
            let answer = messages["data"]["aiMessages"]["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["role"] == "ASSISTANT")
                .cloned();
            if let Some(answer) = answer {
                let errors = answer["errors"].as_array().cloned().unwrap_or_default();
                assert!(errors.is_empty(), "the answer is an error: {answer}");
                let content = answer["content"].as_str().unwrap_or_default().to_owned();
                assert!(!content.trim().is_empty(), "an empty answer: {answer}");
                return content;
            }
            assert!(
                Instant::now() < deadline,
                "no answer within {ANSWER_BOUND:?}"
            );
            // The stored answer appears when the worker finishes; the
            // subscription's stream is covered by the chat tests.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `/new`: the next questions go to a fresh conversation (each example
    /// stands alone, as the README gives it).
    async fn new_conversation(&self) {
        let accepted = self
            .graphql(
                "mutation { aiAction(input: {chat: {content: \"/new\"}}) { threadId errors } }",
                json!({}),
            )
            .await;
        assert_eq!(
            accepted["data"]["aiAction"]["errors"],
            json!([]),
            "{accepted}"
        );
    }

    async fn ask(&self, question: &str) -> String {
        self.answer(
            "mutation($content: String!) { aiAction(input: {chat: {content: $content}}) { requestId errors } }",
            json!({"content": question}),
        )
        .await
    }
}

/// What a useful answer to `question` contains, from the instance's own
/// data; `None` for a question this test does not know how to judge.
async fn judge_question(instance: &Instance, question: &str, answer: &str) -> Option<()> {
    let lower = answer.to_lowercase();
    if let Some(reference) = question.strip_prefix("Summarize issue ") {
        let (project, iid) = reference.split_once('#')?;
        let issue = instance
            .rest(&format!(
                "projects/{}/issues/{iid}",
                project.replace('/', "%2F")
            ))
            .await;
        let title = issue["title"].as_str()?.to_lowercase();
        assert!(
            lower.contains(&title),
            "the summary does not give the issue's title {title:?}: {answer}"
        );
        let state = if issue["state"] == "opened" {
            "open"
        } else {
            "closed"
        };
        assert!(
            lower.contains(state),
            "the summary does not say the issue is {state}: {answer}"
        );
        return Some(());
    }
    if let Some(concept) = question
        .strip_prefix("What is a ")
        .and_then(|q| q.strip_suffix('?'))
    {
        assert!(
            lower.contains(&concept.to_lowercase()),
            "the definition does not name {concept:?}: {answer}"
        );
        // A definition says what the thing is, or speaks of what it is
        // made of (the model's wording varies with the conversation).
        let concept = concept.to_lowercase();
        assert!(
            lower.contains(&format!("{concept} is"))
                || lower.contains(&format!("{concept}s are"))
                || ["branch", "change", "code", "commit"]
                    .iter()
                    .any(|w| lower.contains(w)),
            "not a definition of {concept:?}: {answer}"
        );
        return Some(());
    }
    if question == "What can you do?" {
        assert!(
            ["code", "gitlab", "help", "question"]
                .iter()
                .any(|w| lower.contains(w)),
            "the answer says nothing about what Duo does: {answer}"
        );
        return Some(());
    }
    None
}

/// The repository example: the answer names a file of the repository it
/// was asked about.
async fn judge_repository(instance: &Instance, request: &str, answer: &str) {
    let gid = request
        .split("gid://gitlab/Project/")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the example names a project");
    let tree = instance
        .rest(&format!(
            "projects/{gid}/repository/tree?recursive=true&per_page=100"
        ))
        .await;
    let paths: Vec<String> = tree
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "blob")
        .map(|e| e["path"].as_str().unwrap().to_owned())
        .collect();
    assert!(!paths.is_empty(), "project {gid} has no files: {tree}");
    let named = paths.iter().any(|p| {
        let file = Path::new(p).file_name().unwrap().to_str().unwrap();
        answer.contains(p.as_str()) || answer.contains(file)
    });
    assert!(
        named,
        "the answer names no file of the repository ({paths:?}): {answer}"
    );
}

/// The file a workflow goal names (`--goal "... README.md"`) and the goal.
fn workflow_goal(command: &str) -> (String, String) {
    let at = command
        .find("--goal \"")
        .unwrap_or_else(|| panic!("a workflow example without --goal: {command}"))
        + "--goal \"".len();
    let goal = &command[at..at + command[at..].find('"').unwrap()];
    let file = goal
        .split_whitespace()
        .map(|w| w.trim_end_matches('.'))
        .find(|w| w.contains('.'))
        .unwrap_or_else(|| panic!("the goal {goal:?} names no file"));
    (file.to_owned(), goal.to_owned())
}

/// The workflow command `./dev run` printed, for a demo checkout made the
/// way the README makes one.
fn printed_workflow(printed: &str) -> String {
    let lines: Vec<&str> = printed.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("duo-workflow-executor"))
        .unwrap_or_else(|| panic!("./dev run printed no workflow command:\n{printed}"));
    let mut command = Vec::new();
    for line in &lines[at..] {
        command.push(line.trim_end_matches('\\').trim());
        if !line.trim_end().ends_with('\\') {
            break;
        }
    }
    format!(
        "mkdir -p /tmp/demo && echo \"# Demo\" > /tmp/demo/README.md && {}",
        command.join(" ").replace("/path/to/checkout", "/tmp/demo")
    )
}

/// The workflow example, run as written with the printed token, the
/// executor of this build and this run's address, at a terminal where the
/// user answers `y` to each question. Judged by the file its goal names: the
/// text it had is kept, a new line is there, nothing said three times, and
/// the run reports what it added.
async fn run_workflow(env: &Env, token: &str, command: &str) {
    let bin = e2e_tests::binary("duo-workflow-executor").unwrap();
    let workspace = env.scratch.join("demo");
    let _ = std::fs::remove_dir_all(&workspace);
    let command = command
        .replace("/tmp/demo", &workspace.display().to_string())
        .replace(
            "target/release/duo-workflow-executor",
            &bin.display().to_string(),
        )
        .replace("http://127.0.0.1:3000", &format!("http://{}", env.web));
    let (file, goal) = workflow_goal(&command);
    let script = std::env::temp_dir().join(format!("readme-workflow-{}.sh", std::process::id()));
    std::fs::write(&script, &command).unwrap();
    let output = tokio::time::timeout(
        WORKFLOW_BOUND,
        tokio::process::Command::new("bash")
            .arg("-c")
            // `script` gives the command a terminal: the executor asks there
            // (it pauses instead when its input is not a terminal). One `y` a
            // second: `yes` would flood the terminal, and it and `script`
            // then took half the CPU from the model (a 10 s run took 49 s).
            .arg(format!(
                "while sleep 1; do echo y; done | script -qfec 'bash {}' /dev/null",
                script.display()
            ))
            .env("TOKEN", token)
            .current_dir(repo_root())
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("the workflow example took more than {WORKFLOW_BOUND:?}"))
    .unwrap();
    let _ = std::fs::remove_file(&script);
    let shown = String::from_utf8_lossy(&output.stdout).replace('\r', "");
    assert!(
        output.status.success(),
        "the workflow example failed (exit {:?}):\n{shown}",
        output.status.code()
    );
    assert!(
        shown.contains("-- FINISHED") && !shown.contains("without changing anything"),
        "{goal:?}: the workflow changed nothing:\n{shown}"
    );
    let written = std::fs::read_to_string(workspace.join(&file))
        .unwrap_or_else(|e| panic!("{goal:?}: {file} was not written ({e}):\n{shown}"));
    let before = if file == "README.md" { "# Demo" } else { "" };
    assert!(
        written.starts_with(before),
        "{file} lost its text:\n{written}"
    );
    let added: Vec<&str> = written[before.len()..]
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(!added.is_empty(), "{goal:?}: nothing added to {file}");
    assert!(
        repeated_line(&written).is_none(),
        "{goal:?}: {file} repeats a line:\n{written}"
    );
    assert!(
        shown.contains(&format!("Added to {file}: {}", added[0])),
        "{goal:?}: the run does not say what it added:\n{shown}"
    );
    eprintln!("workflow {goal:?}: {file} now reads {written:?}");
}

#[tokio::test]
async fn every_readme_example_gives_a_useful_answer_with_the_bundled_model() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let mut examples = readme_examples(&readme);

    let env = Env::with_model(true);
    let started = Instant::now();
    let run = env.start().await;
    // `Run` stops `./dev run` if the test ends early (`dev_run_e2e`).
    eprintln!("./dev run ready in {:.1}s", started.elapsed().as_secs_f64());
    examples.insert(0, Example::Question(printed_question(&run.printed)));
    examples.push(Example::Shell(printed_workflow(&run.printed)));

    let seed: Value =
        serde_json::from_str(&std::fs::read_to_string(run.run_dir.join("seed.json")).unwrap())
            .unwrap();
    // The user `./dev run` prints the request for.
    let token = seed["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| run.printed.contains(u["token"].as_str().unwrap()))
        .map(|u| u["token"].as_str().unwrap().to_owned())
        .expect("the printed token is a demo user's");
    let instance = Instance {
        web: env.web.clone(),
        token: token.clone(),
        http: reqwest::Client::new(),
    };

    for example in &examples {
        let started = Instant::now();
        if !matches!(example, Example::Shell(_)) {
            instance.new_conversation().await;
        }
        match example {
            Example::Question(question) => {
                let answer = instance.ask(question).await;
                assert!(
                    repeated_line(&answer).is_none(),
                    "{question:?}: the answer repeats itself: {answer}"
                );
                assert!(
                    judge_question(&instance, question, &answer).await.is_some(),
                    "the README asks {question:?}, which this test does not know how to judge"
                );
            }
            Example::Graphql(request) => {
                let answer = instance.answer(request, json!({})).await;
                judge_repository(&instance, request, &answer).await;
            }
            Example::Shell(command) => run_workflow(&env, &token, command).await,
        }
        let took = started.elapsed();
        eprintln!("{:>6.1}s  {example:?}", took.as_secs_f64());
    }

    signal(run.pid(), "TERM");
    assert_eq!(run.exit_code().await, Some(143));
    let _ = std::fs::remove_dir_all(&env.scratch);
}

#[test]
fn the_readme_parser_finds_each_kind_of_example() {
    let readme = "# x\n\n## Questions to try\n\nAsk:\n\n- `What is a merge request?`\n- `Summarize issue a/b#1`\n\n### Run a Duo Workflow\n\n```sh\nexecutor --goal \"g\"\n```\n\n## Ask about a repository\n\n```graphql\nmutation { x }\n```\n\nmore\n\n## Next\n\n- `not a question`\n";
    assert_eq!(
        readme_examples(readme),
        vec![
            Example::Question("What is a merge request?".into()),
            Example::Question("Summarize issue a/b#1".into()),
            Example::Graphql("mutation { x }".into()),
            Example::Shell("executor --goal \"g\"".into()),
        ]
    );
    assert_eq!(
        printed_question(
            r#"-d '{"query":"mutation { aiAction(input: {chat: {content: \"What can you do?\"}}) { requestId } }"}'"#
        ),
        "What can you do?"
    );
    let printed = "Run a workflow:\n  /x/duo-workflow-executor --gitlab-url http://h --token glpat-1 \\\n  --project-id 1 --goal \"Describe this repository in NOTES.md\" --workspace /path/to/checkout\n\nPress Ctrl-C";
    let command = printed_workflow(printed);
    assert!(
        command.ends_with("/x/duo-workflow-executor --gitlab-url http://h --token glpat-1 --project-id 1 --goal \"Describe this repository in NOTES.md\" --workspace /tmp/demo"),
        "{command}"
    );
    assert_eq!(
        workflow_goal(&command),
        (
            "NOTES.md".to_owned(),
            "Describe this repository in NOTES.md".to_owned()
        )
    );
    assert_eq!(
        repeated_line(
            "a\nthe same line, said again\nthe same line, said again\nthe same line, said again"
        ),
        Some("the same line, said again")
    );
    assert_eq!(
        repeated_line("one line that is long enough\nanother line that is long enough"),
        None
    );
}
