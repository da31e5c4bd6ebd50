//! Scores, the table per set, the JSON written after a run, and the
//! comparison with a stored baseline.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use super::judge::Verdict;
use super::sets::{Case, Expectation, SetKind};
use crate::Latencies;

/// How one case went.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub id: String,
    pub set: SetKind,
    pub question: String,
    /// Passed: the right first tool, every fact, or a CORRECT verdict.
    pub passed: bool,
    /// 0..=1: 1 or 0 for tool selection and QA, the share of facts found
    /// for grounded answers.
    pub score: f64,
    /// From the question to the stored answer.
    pub latency: Duration,
    /// The answer arrived (a coded error counts as arrived).
    pub answered: bool,
    /// The first tool the agent ran, `None` when it answered without one.
    pub first_tool: Option<String>,
    /// Every tool the agent asked for, in order.
    pub tools: Vec<String>,
    pub expected_tool: Option<Option<String>>,
    pub missing_facts: Vec<String>,
    pub verdict: Option<Verdict>,
    pub answer: String,
    /// The answer's coded error, or why there was no answer.
    pub error: Option<String>,
}

/// What a run observed for one case, before scoring.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub answered: bool,
    pub answer: String,
    pub error: Option<String>,
    pub tools: Vec<String>,
    pub latency: Duration,
    pub verdict: Option<Verdict>,
}

/// The facts of `facts` that `answer` does not contain (case-insensitive).
pub fn missing_facts(facts: &[String], answer: &str) -> Vec<String> {
    let answer = answer.to_lowercase();
    facts
        .iter()
        .filter(|f| !answer.contains(&f.to_lowercase()))
        .cloned()
        .collect()
}

/// Scores what was observed for `case`.
pub fn score(case: &Case, observed: Observed) -> CaseResult {
    let first_tool = observed.tools.first().cloned();
    let mut result = CaseResult {
        id: case.id.clone(),
        set: case.set,
        question: case.question.clone(),
        passed: false,
        score: 0.0,
        latency: observed.latency,
        answered: observed.answered,
        first_tool: first_tool.clone(),
        tools: observed.tools,
        expected_tool: None,
        missing_facts: Vec::new(),
        verdict: observed.verdict,
        answer: observed.answer,
        error: observed.error,
    };
    match &case.expect {
        Expectation::FirstTool(expected) => {
            // The choice is what is measured: it counts even when the tool
            // then fails, but not when no answer came back at all.
            result.passed = result.answered && first_tool == *expected;
            result.score = f64::from(u8::from(result.passed));
            result.expected_tool = Some(expected.clone());
        }
        Expectation::Facts(facts) => {
            result.missing_facts = missing_facts(facts, &result.answer);
            let found = facts.len() - result.missing_facts.len();
            result.score = found as f64 / facts.len().max(1) as f64;
            result.passed = result.missing_facts.is_empty();
        }
        Expectation::Reference(_) => {
            result.passed = matches!(result.verdict, Some(Verdict::Correct { .. }));
            result.score = f64::from(u8::from(result.passed));
        }
    }
    result
}

/// The figures of one set.
#[derive(Debug, Clone)]
pub struct SetSummary {
    pub set: SetKind,
    pub cases: usize,
    pub passed: usize,
    /// Mean score (equal to the pass share except for grounded answers).
    pub score: f64,
    pub judge_errors: usize,
    /// Cases without an answer (timed out) or with a coded error.
    pub failed_answers: usize,
    pub p50: Duration,
    pub p95: Duration,
}

impl SetSummary {
    pub fn share(&self) -> f64 {
        self.passed as f64 / self.cases.max(1) as f64
    }
}

pub fn summarise(results: &[CaseResult]) -> Vec<SetSummary> {
    SetKind::ALL
        .into_iter()
        .filter_map(|set| {
            let of_set: Vec<&CaseResult> = results.iter().filter(|r| r.set == set).collect();
            if of_set.is_empty() {
                return None;
            }
            let mut latencies = Latencies::default();
            for r in &of_set {
                latencies.push(r.latency);
            }
            Some(SetSummary {
                set,
                cases: of_set.len(),
                passed: of_set.iter().filter(|r| r.passed).count(),
                score: of_set.iter().map(|r| r.score).sum::<f64>() / of_set.len() as f64,
                judge_errors: of_set
                    .iter()
                    .filter(|r| matches!(r.verdict, Some(Verdict::Error { .. })))
                    .count(),
                failed_answers: of_set
                    .iter()
                    .filter(|r| !r.answered || r.error.is_some())
                    .count(),
                p50: latencies.quantile(0.5),
                p95: latencies.quantile(0.95),
            })
        })
        .collect()
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn percent(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

/// The table per set, then one line per case that did not pass.
pub fn render_table(results: &[CaseResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>5} {:>6} {:>6} {:>6} {:>10} {:>7} {:>9} {:>9}",
        "set", "cases", "passed", "share", "score", "judge err", "errors", "p50", "p95"
    );
    for s in summarise(results) {
        let _ = writeln!(
            out,
            "{:<16} {:>5} {:>6} {:>6} {:>6.2} {:>10} {:>7} {:>9} {:>9}",
            s.set.name(),
            s.cases,
            s.passed,
            percent(s.share()),
            s.score,
            if s.set == SetKind::Qa {
                s.judge_errors.to_string()
            } else {
                "-".to_owned()
            },
            s.failed_answers,
            seconds(s.p50),
            seconds(s.p95),
        );
    }
    let failed: Vec<&CaseResult> = results.iter().filter(|r| !r.passed).collect();
    if !failed.is_empty() {
        let _ = writeln!(out, "\nnot passed:");
    }
    for r in failed {
        let why = match r.set {
            SetKind::ToolSelection => format!(
                "first tool {} (expected {})",
                r.first_tool.as_deref().unwrap_or("none"),
                r.expected_tool
                    .clone()
                    .flatten()
                    .unwrap_or_else(|| "none".to_owned())
            ),
            SetKind::Grounded => format!("missing {:?}", r.missing_facts),
            SetKind::Qa => match &r.verdict {
                Some(v) => format!("{}: {}", v.label(), v.reason()),
                None => "not judged".to_owned(),
            },
        };
        let error = r
            .error
            .as_deref()
            .map(|e| format!(" [{}]", e.chars().take(120).collect::<String>()))
            .unwrap_or_default();
        let _ = writeln!(out, "  {:<26} {why}{error}", r.id);
    }
    out
}

fn tool_json(tool: &Option<String>) -> Value {
    json!(tool.as_deref().unwrap_or("none"))
}

/// The whole run as JSON (`--out`).
pub fn to_json(results: &[CaseResult], header: Value) -> Value {
    let sets: Vec<Value> = summarise(results)
        .iter()
        .map(|s| {
            json!({
                "set": s.set.name(),
                "cases": s.cases,
                "passed": s.passed,
                "share": s.share(),
                "score": s.score,
                "judge_errors": s.judge_errors,
                "failed_answers": s.failed_answers,
                "p50_ms": s.p50.as_millis() as u64,
                "p95_ms": s.p95.as_millis() as u64,
            })
        })
        .collect();
    let cases: Vec<Value> = results
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "set": r.set.name(),
                "question": r.question,
                "passed": r.passed,
                "score": r.score,
                "latency_ms": r.latency.as_millis() as u64,
                "answered": r.answered,
                "first_tool": tool_json(&r.first_tool),
                "tools": r.tools,
                "expected_tool": r.expected_tool.as_ref().map(tool_json),
                "missing_facts": r.missing_facts,
                "verdict": r.verdict.as_ref().map(Verdict::label),
                "verdict_reason": r.verdict.as_ref().map(Verdict::reason),
                "answer": r.answer,
                "error": r.error,
            })
        })
        .collect();
    let mut out = header;
    out["sets"] = json!(sets);
    out["cases"] = json!(cases);
    out
}

/// One case of a baseline: what matters for the comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineCase {
    pub id: String,
    pub set: SetKind,
    pub passed: bool,
    pub score: f64,
    pub first_tool: Option<String>,
    pub verdict: Option<String>,
}

/// A stored baseline (`eval/baseline-<model>.json`).
#[derive(Debug, Clone, Default)]
pub struct Baseline {
    pub cases: Vec<BaselineCase>,
}

impl Baseline {
    pub fn parse(value: &Value) -> anyhow::Result<Self> {
        let cases = value["cases"]
            .as_array()
            .context("a baseline without `cases`")?
            .iter()
            .map(|c| {
                let id = c["id"].as_str().context("a baseline case without id")?;
                let set = c["set"]
                    .as_str()
                    .and_then(SetKind::from_name)
                    .with_context(|| format!("baseline case {id}: unknown set"))?;
                Ok(BaselineCase {
                    id: id.to_owned(),
                    set,
                    passed: c["passed"].as_bool().unwrap_or(false),
                    score: c["score"].as_f64().unwrap_or(0.0),
                    first_tool: c["first_tool"].as_str().map(str::to_owned),
                    verdict: c["verdict"].as_str().map(str::to_owned),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self { cases })
    }

    /// `None` when the file does not exist yet.
    pub fn load(path: &Path) -> anyhow::Result<Option<Self>> {
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
        let value: Value =
            serde_json::from_str(&text).with_context(|| format!("{}: JSON", path.display()))?;
        Self::parse(&value).map(Some)
    }

    pub fn from_results(results: &[CaseResult]) -> Self {
        Self {
            cases: results
                .iter()
                .map(|r| BaselineCase {
                    id: r.id.clone(),
                    set: r.set,
                    passed: r.passed,
                    score: r.score,
                    first_tool: r.first_tool.clone().or_else(|| Some("none".to_owned())),
                    verdict: r.verdict.as_ref().map(|v| v.label().to_owned()),
                })
                .collect(),
        }
    }

    /// This baseline with the cases of `newer` replacing (or joining) its
    /// own: a run of a subset updates only that subset.
    pub fn merged(&self, newer: &Baseline) -> Baseline {
        let mut cases = self.cases.clone();
        for case in &newer.cases {
            match cases.iter_mut().find(|c| c.id == case.id) {
                Some(old) => *old = case.clone(),
                None => cases.push(case.clone()),
            }
        }
        cases.sort_by_key(|c| c.set);
        Baseline { cases }
    }

    pub fn to_json(&self, model: &str) -> Value {
        json!({
            "model": model,
            "note": "Written by `duo-eval --update-baseline`; compared with every run of this model kind.",
            "cases": self.cases.iter().map(|c| json!({
                "id": c.id,
                "set": c.set.name(),
                "passed": c.passed,
                "score": c.score,
                "first_tool": c.first_tool,
                "verdict": c.verdict,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn save(&self, path: &Path, model: &str) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(&self.to_json(model))?;
        std::fs::write(path, format!("{text}\n")).with_context(|| path.display().to_string())
    }
}

/// Better or worse than the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Better,
    Worse,
    Same,
    /// Not in the baseline.
    New,
}

#[derive(Debug, Clone)]
pub struct CaseChange {
    pub id: String,
    pub set: SetKind,
    pub before: Option<BaselineCase>,
    pub after_score: f64,
    pub after_passed: bool,
    pub after_first_tool: String,
    pub change: Change,
}

#[derive(Debug, Clone)]
pub struct SetChange {
    pub set: SetKind,
    /// Over the cases both runs have.
    pub compared: usize,
    pub passed_before: usize,
    pub passed_after: usize,
    pub score_before: f64,
    pub score_after: f64,
}

#[derive(Debug, Clone)]
pub struct Comparison {
    pub sets: Vec<SetChange>,
    pub cases: Vec<CaseChange>,
}

impl Comparison {
    pub fn regressions(&self) -> Vec<&CaseChange> {
        self.cases
            .iter()
            .filter(|c| c.change == Change::Worse)
            .collect()
    }

    pub fn improvements(&self) -> Vec<&CaseChange> {
        self.cases
            .iter()
            .filter(|c| c.change == Change::Better)
            .collect()
    }
}

const SCORE_EPSILON: f64 = 1e-9;

/// Compares a run with a baseline, case by case (a case is worse when its
/// score fell or it stopped passing) and per set over the cases both have.
pub fn compare(results: &[CaseResult], baseline: &Baseline) -> Comparison {
    let cases: Vec<CaseChange> = results
        .iter()
        .map(|r| {
            let before = baseline.cases.iter().find(|c| c.id == r.id).cloned();
            let change = match &before {
                None => Change::New,
                Some(b) if r.score < b.score - SCORE_EPSILON || (b.passed && !r.passed) => {
                    Change::Worse
                }
                Some(b) if r.score > b.score + SCORE_EPSILON || (!b.passed && r.passed) => {
                    Change::Better
                }
                Some(_) => Change::Same,
            };
            CaseChange {
                id: r.id.clone(),
                set: r.set,
                before,
                after_score: r.score,
                after_passed: r.passed,
                after_first_tool: r.first_tool.clone().unwrap_or_else(|| "none".to_owned()),
                change,
            }
        })
        .collect();
    let mut sets: BTreeMap<SetKind, SetChange> = BTreeMap::new();
    for c in &cases {
        let Some(before) = &c.before else { continue };
        let entry = sets.entry(c.set).or_insert(SetChange {
            set: c.set,
            compared: 0,
            passed_before: 0,
            passed_after: 0,
            score_before: 0.0,
            score_after: 0.0,
        });
        entry.compared += 1;
        entry.passed_before += usize::from(before.passed);
        entry.passed_after += usize::from(c.after_passed);
        entry.score_before += before.score;
        entry.score_after += c.after_score;
    }
    let sets = sets
        .into_values()
        .map(|mut s| {
            s.score_before /= s.compared.max(1) as f64;
            s.score_after /= s.compared.max(1) as f64;
            s
        })
        .collect();
    Comparison { sets, cases }
}

pub fn render_comparison(comparison: &Comparison) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>8} {:>15} {:>14}",
        "set", "compared", "passed", "score"
    );
    for s in &comparison.sets {
        let _ = writeln!(
            out,
            "{:<16} {:>8} {:>6} -> {:<5} {:>5.2} -> {:<5.2}",
            s.set.name(),
            s.compared,
            s.passed_before,
            s.passed_after,
            s.score_before,
            s.score_after
        );
    }
    for (label, list) in [
        ("worse", comparison.regressions()),
        ("better", comparison.improvements()),
    ] {
        for c in list {
            let before = c.before.as_ref().map_or(0.0, |b| b.score);
            let tools = match (c.set, c.before.as_ref().and_then(|b| b.first_tool.as_ref())) {
                (SetKind::ToolSelection, Some(tool)) => {
                    format!(" (first tool {tool} -> {})", c.after_first_tool)
                }
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "  {label:<7} {:<26} score {before:.2} -> {:.2}{tools}",
                c.id, c.after_score
            );
        }
    }
    let new: Vec<&str> = comparison
        .cases
        .iter()
        .filter(|c| c.change == Change::New)
        .map(|c| c.id.as_str())
        .collect();
    if !new.is_empty() {
        let _ = writeln!(out, "  not in the baseline: {}", new.join(", "));
    }
    let _ = writeln!(
        out,
        "{} worse, {} better, {} unchanged",
        comparison.regressions().len(),
        comparison.improvements().len(),
        comparison
            .cases
            .iter()
            .filter(|c| c.change == Change::Same)
            .count()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::sets::parse_set;

    fn grounded_case() -> Case {
        parse_set(
            "set: grounded\ncases:\n- id: g\n  question: q\n  facts: [Add dark mode, feature, system preference]\n",
            "t",
        )
        .unwrap()
        .remove(0)
    }

    #[test]
    fn grounded_score_is_the_share_of_facts_found() {
        let result = score(
            &grounded_case(),
            Observed {
                answered: true,
                answer: "ADD DARK MODE, a Feature.".into(),
                ..Observed::default()
            },
        );
        assert_eq!(result.missing_facts, vec!["system preference".to_owned()]);
        assert!((result.score - 2.0 / 3.0).abs() < 1e-9);
        assert!(!result.passed);
    }

    #[test]
    fn tool_selection_needs_an_answer_and_the_right_first_tool() {
        let case = parse_set(
            "set: tool-selection\ncases:\n- id: t\n  question: q\n  expected_tool: none\n",
            "t",
        )
        .unwrap()
        .remove(0);
        let direct = Observed {
            answered: true,
            ..Observed::default()
        };
        assert!(score(&case, direct.clone()).passed);
        let with_tool = Observed {
            tools: vec!["issue_reader".into()],
            ..direct
        };
        assert!(!score(&case, with_tool).passed);
        assert!(!score(&case, Observed::default()).passed, "no answer");
    }

    #[test]
    fn worse_and_better_cases_against_a_baseline() {
        let case = grounded_case();
        let run = |answer: &str, id: &str| {
            let mut r = score(
                &case,
                Observed {
                    answered: true,
                    answer: answer.into(),
                    ..Observed::default()
                },
            );
            r.id = id.into();
            r
        };
        let before = vec![
            run("add dark mode feature system preference", "a"),
            run("add dark mode", "b"),
            run("feature", "c"),
        ];
        let baseline = Baseline::from_results(&before);
        let after = vec![
            run("add dark mode feature", "a"),
            run("add dark mode feature system preference", "b"),
            run("feature", "c"),
            run("feature", "d"),
        ];
        let comparison = compare(&after, &baseline);
        let changes: Vec<(String, Change)> = comparison
            .cases
            .iter()
            .map(|c| (c.id.clone(), c.change))
            .collect();
        assert_eq!(
            changes,
            vec![
                ("a".into(), Change::Worse),
                ("b".into(), Change::Better),
                ("c".into(), Change::Same),
                ("d".into(), Change::New)
            ]
        );
        assert_eq!(comparison.sets[0].compared, 3);
        assert_eq!(comparison.sets[0].passed_before, 1);
        assert_eq!(comparison.sets[0].passed_after, 1);
        let text = render_comparison(&comparison);
        assert!(text.contains("worse   a"), "{text}");
        assert!(text.contains("1 worse, 1 better, 1 unchanged"), "{text}");

        // A saved and loaded baseline compares the same; merging replaces.
        let reloaded = Baseline::parse(&baseline.to_json("fake")).unwrap();
        assert_eq!(reloaded.cases, baseline.cases);
        let merged = baseline.merged(&Baseline::from_results(&after[3..]));
        assert_eq!(merged.cases.len(), 4);
    }
}
