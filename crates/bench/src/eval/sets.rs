//! The question sets (`crates/bench/eval/*.yaml`): what each case asks,
//! what it expects, and what the fake provider answers it with.
//!
//! One file per set. Every file has `set:` (its name) and `cases:`; a case
//! has `id`, `question`, optionally `resource` (the page the user is on) and
//! `tiny: true` (part of the quick subset), then what its set scores:
//! `expected_tool` (a tool name or `none`), `facts` (texts the answer must
//! contain) or `reference` (what a correct answer says, for the judge).
//! `fake` lists the fake model's turns in order (`{web_url}` is replaced by
//! the monolith's address, `{head:<project>}` by the id of the project's
//! newest commit) and `fake_judge` the fake judge's reply.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use serde_json::Value;

/// The tools the chat agent can pick first.
pub const TOOLS: &[&str] = &[
    "issue_reader",
    "gitlab_documentation",
    "codebase_search",
    "commit_reader",
    "merge_request_reader",
    "epic_reader",
    "build_reader",
];

/// What a set measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SetKind {
    /// The first tool the agent ran.
    ToolSelection,
    /// The share of a resource's facts found in the answer.
    Grounded,
    /// A judge model's verdict on the answer.
    Qa,
}

impl SetKind {
    pub const ALL: [SetKind; 3] = [SetKind::ToolSelection, SetKind::Grounded, SetKind::Qa];

    pub fn name(self) -> &'static str {
        match self {
            SetKind::ToolSelection => "tool-selection",
            SetKind::Grounded => "grounded",
            SetKind::Qa => "qa",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// The page a question is asked from, resolved to a global id at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    Issue {
        project: String,
        iid: i64,
    },
    MergeRequest {
        project: String,
        iid: i64,
    },
    Epic {
        group: String,
        iid: i64,
    },
    /// A CI job of the project, by its name.
    Build {
        project: String,
        name: String,
    },
    Project {
        project: String,
    },
}

/// What a case expects, by set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expectation {
    /// The first tool, or `None` for an answer without a tool.
    FirstTool(Option<String>),
    Facts(Vec<String>),
    Reference(String),
}

#[derive(Debug, Clone)]
pub struct Case {
    pub id: String,
    pub set: SetKind,
    pub question: String,
    pub resource: Option<Resource>,
    pub expect: Expectation,
    pub tiny: bool,
    /// The fake model's turns, in order.
    pub fake: Vec<String>,
    /// The fake judge's reply (QA cases).
    pub fake_judge: Option<String>,
}

/// The directory of the question sets, the judge prompt and the baselines.
pub fn eval_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("eval")
}

fn text(entry: &Value, key: &str, id: &str) -> anyhow::Result<String> {
    entry[key]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("{id}: `{key}` is missing or not text"))
}

fn texts(entry: &Value, key: &str, id: &str) -> anyhow::Result<Vec<String>> {
    match &entry[key] {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .with_context(|| format!("{id}: `{key}` holds something other than text"))
            })
            .collect(),
        _ => bail!("{id}: `{key}` is not a list"),
    }
}

fn resource(value: &Value, id: &str) -> anyhow::Result<Option<Resource>> {
    if value.is_null() {
        return Ok(None);
    }
    let kind = text(value, "type", id)?;
    let iid = || {
        value["iid"]
            .as_i64()
            .with_context(|| format!("{id}: the resource needs `iid`"))
    };
    Ok(Some(match kind.as_str() {
        "issue" => Resource::Issue {
            project: text(value, "project", id)?,
            iid: iid()?,
        },
        "merge_request" => Resource::MergeRequest {
            project: text(value, "project", id)?,
            iid: iid()?,
        },
        "epic" => Resource::Epic {
            group: text(value, "group", id)?,
            iid: iid()?,
        },
        "build" => Resource::Build {
            project: text(value, "project", id)?,
            name: text(value, "name", id)?,
        },
        "project" => Resource::Project {
            project: text(value, "project", id)?,
        },
        other => bail!("{id}: unknown resource type {other:?}"),
    }))
}

fn case(set: SetKind, entry: &Value) -> anyhow::Result<Case> {
    let id = entry["id"]
        .as_str()
        .context("a case without an `id`")?
        .to_owned();
    let expect = match set {
        SetKind::ToolSelection => {
            let tool = text(entry, "expected_tool", &id)?;
            if tool == "none" {
                Expectation::FirstTool(None)
            } else {
                ensure!(
                    TOOLS.contains(&tool.as_str()),
                    "{id}: {tool:?} is not one of the agent's tools ({}) or none",
                    TOOLS.join(", ")
                );
                Expectation::FirstTool(Some(tool))
            }
        }
        SetKind::Grounded => {
            let facts = texts(entry, "facts", &id)?;
            ensure!(!facts.is_empty(), "{id}: a grounded case needs `facts`");
            Expectation::Facts(facts)
        }
        SetKind::Qa => Expectation::Reference(text(entry, "reference", &id)?),
    };
    Ok(Case {
        question: text(entry, "question", &id)?,
        resource: resource(&entry["resource"], &id)?,
        expect,
        tiny: entry["tiny"].as_bool().unwrap_or(false),
        fake: texts(entry, "fake", &id)?,
        fake_judge: entry["fake_judge"].as_str().map(str::to_owned),
        set,
        id,
    })
}

/// The cases of one set file.
pub fn parse_set(yaml: &str, origin: &str) -> anyhow::Result<Vec<Case>> {
    let doc: Value = serde_norway::from_str(yaml).with_context(|| format!("{origin}: YAML"))?;
    let name = doc["set"]
        .as_str()
        .with_context(|| format!("{origin}: `set` is missing"))?;
    let set = SetKind::from_name(name).with_context(|| format!("{origin}: unknown set {name}"))?;
    let entries = doc["cases"]
        .as_array()
        .with_context(|| format!("{origin}: `cases` is not a list"))?;
    entries
        .iter()
        .map(|e| case(set, e).with_context(|| origin.to_owned()))
        .collect()
}

/// Every case of every set in `dir`, in set order; ids are unique.
pub fn load_all(dir: &Path) -> anyhow::Result<Vec<Case>> {
    let mut cases = Vec::new();
    for kind in SetKind::ALL {
        let path = dir.join(format!("{}.yaml", kind.name()));
        let yaml = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        let loaded = parse_set(&yaml, &path.display().to_string())?;
        ensure!(
            loaded.iter().all(|c| c.set == kind),
            "{}: its cases belong to another set",
            path.display()
        );
        cases.extend(loaded);
    }
    for (i, case) in cases.iter().enumerate() {
        ensure!(
            !cases[..i].iter().any(|c| c.id == case.id),
            "the case id {} is used twice",
            case.id
        );
    }
    Ok(cases)
}

/// The cases `selection` names: `full` (everything), `tiny` (the cases
/// marked `tiny`), a set's name, or a comma-separated list of case ids.
pub fn select(all: Vec<Case>, selection: &str) -> anyhow::Result<Vec<Case>> {
    let picked: Vec<Case> = match selection {
        "full" | "all" => all,
        "tiny" => all.into_iter().filter(|c| c.tiny).collect(),
        name => {
            if let Some(kind) = SetKind::from_name(name) {
                all.into_iter().filter(|c| c.set == kind).collect()
            } else {
                let ids: Vec<&str> = name.split(',').map(str::trim).collect();
                for id in &ids {
                    ensure!(
                        all.iter().any(|c| c.id == *id),
                        "--set {selection}: neither full, tiny, a set ({}) nor a case id",
                        SetKind::ALL.map(SetKind::name).join(", ")
                    );
                }
                all.into_iter()
                    .filter(|c| ids.contains(&c.id.as_str()))
                    .collect()
            }
        }
    };
    ensure!(!picked.is_empty(), "--set {selection} selects no case");
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_sets_load_and_the_tiny_subset_is_small() {
        let all = load_all(&eval_dir()).unwrap();
        assert!((15..=30).contains(&all.len()), "{} cases", all.len());
        for kind in SetKind::ALL {
            assert!(all.iter().any(|c| c.set == kind), "{kind:?} is empty");
        }
        let tiny = select(all.clone(), "tiny").unwrap();
        assert!((3..=5).contains(&tiny.len()), "{} tiny cases", tiny.len());
        // Every case can run against the fake provider.
        for case in &all {
            assert!(!case.fake.is_empty(), "{}: no fake turns", case.id);
            if case.set == SetKind::Qa {
                assert!(case.fake_judge.is_some(), "{}: no fake verdict", case.id);
            }
        }
    }

    #[test]
    fn unknown_tools_and_missing_expectations_are_refused() {
        let bad_tool =
            "set: tool-selection\ncases:\n- id: a\n  question: q\n  expected_tool: issue_writer\n";
        assert!(parse_set(bad_tool, "t").is_err());
        let no_facts = "set: grounded\ncases:\n- id: a\n  question: q\n";
        assert!(parse_set(no_facts, "t").is_err());
        let none = "set: tool-selection\ncases:\n- id: a\n  question: q\n  expected_tool: none\n  resource: {type: epic, group: acme, iid: 1}\n";
        let cases = parse_set(none, "t").unwrap();
        assert_eq!(cases[0].expect, Expectation::FirstTool(None));
        assert_eq!(
            cases[0].resource,
            Some(Resource::Epic {
                group: "acme".into(),
                iid: 1
            })
        );
    }

    #[test]
    fn selections() {
        let all = load_all(&eval_dir()).unwrap();
        let qa = select(all.clone(), "qa").unwrap();
        assert!(qa.iter().all(|c| c.set == SetKind::Qa));
        let first = all[0].id.clone();
        assert_eq!(select(all.clone(), &first).unwrap().len(), 1);
        assert!(select(all, "no-such-case").is_err());
    }
}
