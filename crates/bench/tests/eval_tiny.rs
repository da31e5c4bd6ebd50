//! The evaluation harness on its tiny set, end to end: the real system with
//! the fake provider answering each case's scripted turns and a fake judge
//! giving scripted verdicts. Checks that the harness still sees the tool
//! the agent ran, finds an answer's facts, reads the judge, and notices a
//! case that did worse than a baseline. Needs PostgreSQL (`DATABASE_URL`)
//! and the debug `duo-monolith` and `duo-gateway` binaries.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a failed step fails the test"
)]

use bench::eval::judge::Verdict;
use bench::eval::report::{self, Baseline, CaseResult, Change};
use bench::eval::{self, ModelKind, RunConfig};

fn case<'a>(results: &'a [CaseResult], id: &str) -> &'a CaseResult {
    results
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no result for {id}"))
}

#[tokio::test]
async fn the_tiny_set_runs_with_the_fake_provider_and_judge() {
    let run = eval::run(&RunConfig::new(ModelKind::Fake, "tiny"))
        .await
        .unwrap();
    let results = &run.results;
    let table = report::render_table(results);
    assert_eq!(results.len(), 5, "{table}");

    // Tool selection: seen on the wire between the monolith and the gateway.
    let by_reference = case(results, "ts-issue-by-reference");
    assert_eq!(
        by_reference.first_tool.as_deref(),
        Some("issue_reader"),
        "{table}"
    );
    assert!(by_reference.passed, "{table}");
    let direct = case(results, "ts-none-code-writing");
    assert_eq!(direct.first_tool, None, "{table}");
    assert!(direct.tools.is_empty());
    assert!(direct.passed, "{table}");
    assert!(direct.answer.contains("s[::-1]"), "{}", direct.answer);

    // Grounded: every fact, and a scripted answer missing one on purpose.
    let login = case(results, "gr-login-issue");
    assert!(login.passed && login.score == 1.0, "{table}");
    let job = case(results, "gr-failed-job");
    assert_eq!(job.first_tool.as_deref(), Some("build_reader"));
    assert_eq!(job.missing_facts, vec!["failed".to_owned()], "{table}");
    assert!((job.score - 2.0 / 3.0).abs() < 1e-9);
    assert!(!job.passed);

    // QA: the judge's reply read into a verdict with its reason.
    let qa = case(results, "qa-login-cause");
    match &qa.verdict {
        Some(Verdict::Correct { reason }) => assert!(reason.contains("30 days"), "{reason}"),
        other => panic!("{other:?}\n{table}"),
    }
    assert!(qa.passed);

    // Latency is measured and the JSON carries every case.
    assert!(results.iter().all(|r| r.answered && !r.latency.is_zero()));
    let json = run.to_json();
    assert_eq!(json["cases"].as_array().unwrap().len(), 5);
    assert_eq!(json["model"], "fake");
    let grounded = json["sets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["set"] == "grounded")
        .unwrap();
    assert_eq!(grounded["passed"], 1);

    // The stored fake baseline agrees with this run: nothing got worse.
    let stored = Baseline::load(&eval::baseline_path(
        &eval::sets::eval_dir(),
        ModelKind::Fake,
    ))
    .unwrap()
    .expect("crates/bench/eval/baseline-fake.json");
    let comparison = report::compare(results, &stored);
    assert!(
        comparison.regressions().is_empty(),
        "{}",
        report::render_comparison(&comparison)
    );

    // A baseline in which the partly grounded case passed: a regression.
    let mut better = Baseline::from_results(results);
    let entry = better
        .cases
        .iter_mut()
        .find(|c| c.id == "gr-failed-job")
        .unwrap();
    entry.passed = true;
    entry.score = 1.0;
    let comparison = report::compare(results, &better);
    let worse: Vec<&str> = comparison
        .regressions()
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(worse, vec!["gr-failed-job"]);
    let change = comparison
        .cases
        .iter()
        .find(|c| c.id == "qa-login-cause")
        .unwrap()
        .change;
    assert_eq!(change, Change::Same);
}
