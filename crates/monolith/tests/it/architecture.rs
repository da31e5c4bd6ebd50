//! The monolith's layering, checked: a module uses only modules ranked below it
//! (see the table in `src/lib.rs`), so there are no import cycles between
//! domains and the HTTP layer sits on top. Also:
//!
//! - no two files import each other in a loop (`KNOWN_IMPORT_CIRCLES`, the
//!   list of those left, is empty and stays so);
//! - `/api/v4` routes are registered only in `rest/routes.rs`;
//! - `rest`, `web`, `graphql` and `agent` hold no SQL (`SQL_STILL_IN`, the
//!   list of files that still did, is empty and stays so);
//! - the gateway never reaches the database.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Rank of each top-level module; a module may use only modules of a lower rank.
/// A new module must be added here, which is the point: its place is decided.
const RANKS: &[(&str, u32)] = &[
    ("gid", 0),
    ("lifecycle", 0),
    ("percent", 0),
    ("queries", 0),
    ("config", 1),
    ("db", 2),
    ("instance", 3),
    // Per-user request budgets, which chat and Duo Workflow both count in.
    ("rate_limit", 3),
    // The audit log of MCP tool calls.
    ("audit", 3),
    // Feature flags: their gates and evaluation, read by the agent and the edges.
    ("features", 3),
    ("identity", 4),
    ("policy", 5),
    ("ai_models", 6),
    ("chat", 6),
    ("gateway_client", 6),
    ("namespaces", 6),
    ("repositories", 6),
    // Issues, merge requests, epics, notes and CI jobs: above the policy
    // they ask and the namespaces they live in, below the agent and the
    // edges that show them.
    ("work_items", 7),
    ("code_index", 7),
    // AI usage records and question categorisation: over chat, the gateway
    // and the models; below the agent that records into it.
    ("ai_usage", 7),
    ("agent", 8),
    // Turning a Duo switch brings the code index in line with it.
    ("duo_settings", 8),
    ("workflows", 8),
    ("app_state", 9),
    // Code review and mentions: jobs over work items, the agent and the
    // gateway, started by the edges (REST, web) that record the events.
    ("review", 9),
    ("rest", 10),
    ("git_http", 10),
    ("worker", 10),
    ("probes", 10),
    ("web", 10),
    ("graphql", 11),
    ("server", 12),
    ("seed", 12),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`src/chat/live.rs` → `chat`).
fn owner(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    Some(first.trim_end_matches(".rs").to_owned())
}

/// Every `crate::<module>` a file's code mentions (comments skipped).
fn used_modules(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((n + 1, name));
            }
            rest = after;
        }
    }
    found
}

#[test]
fn modules_use_only_modules_below_them() {
    let ranks: BTreeMap<&str, u32> = RANKS.iter().copied().collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut problems = Vec::new();
    for file in &files {
        let Some(module) = owner(&src, file) else {
            continue;
        };
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(&own) = ranks.get(module.as_str()) else {
            problems.push(format!(
                "src/{module}: not in RANKS (give the new module its layer)"
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (line, used) in used_modules(&text) {
            if used == module {
                continue;
            }
            match ranks.get(used.as_str()) {
                Some(&theirs) if theirs < own => {}
                Some(&theirs) => problems.push(format!(
                    "{}:{line}: `{module}` (rank {own}) uses `{used}` (rank {theirs})",
                    file.strip_prefix(&src).unwrap().display()
                )),
                None => problems.push(format!(
                    "{}:{line}: uses unknown module `{used}`",
                    file.strip_prefix(&src).unwrap().display()
                )),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "layering broken:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_module_in_lib_rs_has_a_rank() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let ranks: BTreeMap<&str, u32> = RANKS.iter().copied().collect();
    for line in lib.lines() {
        if let Some(name) = line.strip_prefix("pub mod ") {
            let name = name.trim_end_matches(';');
            assert!(ranks.contains_key(name), "{name} has no rank");
        }
    }
}

#[test]
fn the_gateway_never_depends_on_the_database() {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway/Cargo.toml"),
    )
    .unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .unwrap_or("")
        .split("\n[")
        .next()
        .unwrap_or("");
    for forbidden in [
        "tokio-postgres",
        "deadpool-postgres",
        "job-queue",
        "devdb",
        "monolith",
    ] {
        assert!(
            !deps.lines().any(|l| l.trim_start().starts_with(forbidden)),
            "the gateway depends on {forbidden}"
        );
    }
}

/// `src/…/x.rs` or `src/…/x/mod.rs` for the module path `parts`, trying the
/// longest prefix first (`crate::rest::pagination::PageParams` is
/// `rest/pagination.rs`); the crate root when nothing matches.
fn module_file(src: &Path, parts: &[String]) -> Option<PathBuf> {
    for n in (1..=parts.len()).rev() {
        let mut base = src.to_path_buf();
        for part in &parts[..n] {
            base.push(part);
        }
        let file = base.with_extension("rs");
        if file.is_file() {
            return Some(file);
        }
        let dir_mod = base.join("mod.rs");
        if dir_mod.is_file() {
            return Some(dir_mod);
        }
    }
    None
}

/// The module path of the module a source file's `super` names.
fn parent_module(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.pop();
    parts
}

/// The leading path of `text` (`a::b::C` of `a::b::C::new(...)`), as far as
/// it is made of identifiers; a group (`a::{b, c}`) ends it.
fn leading_path(text: &str) -> Vec<String> {
    let mut segments = Vec::new();
    let mut tail = text.trim_start();
    loop {
        let name: String = tail
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            break;
        }
        tail = &tail[name.len()..];
        segments.push(name);
        match tail.trim_start().strip_prefix("::") {
            Some(next) => tail = next.trim_start(),
            None => break,
        }
    }
    segments
}

/// The items of a `{...}` group `text` starts inside of, split at its own
/// commas (nested groups stay whole).
fn group_items(text: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&text[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
}

/// The files of the crate a file's code (before its tests, comments skipped)
/// names through `crate::...` or `super::...`, groups (`super::{a, b}`, over
/// several lines too) included.
fn imported_files(src: &Path, file: &Path, text: &str) -> Vec<PathBuf> {
    let code: String = text
        .split("#[cfg(test)]")
        .next()
        .unwrap_or("")
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let parent = parent_module(src, file);
    let mut found = Vec::new();
    for (head, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(head) {
            // A longer identifier ending in `crate` or `super` is no path head.
            let before = rest[..i].chars().last();
            rest = &rest[i + head.len()..];
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let paths: Vec<Vec<String>> = match rest.strip_prefix('{') {
                Some(group) => group_items(group).into_iter().map(leading_path).collect(),
                None => vec![leading_path(rest)],
            };
            for segments in paths {
                if segments.is_empty() || segments[0] == "self" {
                    continue;
                }
                let mut parts = base.clone();
                parts.extend(segments);
                let target = module_file(src, &parts).or_else(|| {
                    let root = src.join("lib.rs");
                    root.is_file().then_some(root)
                });
                if let Some(target) = target.filter(|t| t != file) {
                    found.push(target);
                }
            }
        }
    }
    found
}

/// Groups of more than one file that import each other in a loop (strongly
/// connected components of the file import graph), each sorted, as paths
/// relative to `src`.
fn import_circles(src: &Path) -> Vec<Vec<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.retain(|f| !f.strip_prefix(src).unwrap().starts_with("bin"));
    files.sort();
    let index: BTreeMap<&PathBuf, usize> = files.iter().enumerate().map(|(i, f)| (f, i)).collect();
    let edges: Vec<Vec<usize>> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let mut to: Vec<usize> = imported_files(src, f, &text)
                .iter()
                .filter_map(|t| index.get(t).copied())
                .collect();
            to.sort_unstable();
            to.dedup();
            to
        })
        .collect();
    // Kosaraju: finish order on the graph, then components on its reverse.
    let n = files.len();
    let mut order = Vec::new();
    let mut seen = vec![false; n];
    for start in 0..n {
        if seen[start] {
            continue;
        }
        let mut stack = vec![(start, 0usize)];
        seen[start] = true;
        while let Some((v, next)) = stack.pop() {
            if let Some(&w) = edges[v].get(next) {
                stack.push((v, next + 1));
                if !seen[w] {
                    seen[w] = true;
                    stack.push((w, 0));
                }
            } else {
                order.push(v);
            }
        }
    }
    let mut reverse = vec![Vec::new(); n];
    for (v, to) in edges.iter().enumerate() {
        for &w in to {
            reverse[w].push(v);
        }
    }
    let mut component = vec![usize::MAX; n];
    let mut circles = Vec::new();
    for &root in order.iter().rev() {
        if component[root] != usize::MAX {
            continue;
        }
        let mut members = Vec::new();
        let mut stack = vec![root];
        component[root] = root;
        while let Some(v) = stack.pop() {
            members.push(v);
            for &w in &reverse[v] {
                if component[w] == usize::MAX {
                    component[w] = root;
                    stack.push(w);
                }
            }
        }
        if members.len() > 1 {
            let mut names: Vec<String> = members
                .iter()
                .map(|&v| {
                    files[v]
                        .strip_prefix(src)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect();
            names.sort();
            circles.push(names);
        }
    }
    circles.sort();
    circles
}

/// Files that still import each other in a loop. The list only shrinks: a new
/// circle fails the test, and so does a listed one that is gone (take it off).
const KNOWN_IMPORT_CIRCLES: &[&[&str]] = &[];

#[test]
fn no_new_import_circles_between_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = import_circles(&src);
    let known: Vec<Vec<String>> = KNOWN_IMPORT_CIRCLES
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    let new: Vec<_> = found.iter().filter(|c| !known.contains(c)).collect();
    let gone: Vec<_> = known.iter().filter(|c| !found.contains(c)).collect();
    assert!(
        new.is_empty(),
        "files importing each other in a loop (move what they share a floor below): {new:?}"
    );
    assert!(
        gone.is_empty(),
        "listed import circles that no longer exist (take them off KNOWN_IMPORT_CIRCLES): {gone:?}"
    );
}

#[test]
fn the_circle_finder_sees_a_circle() {
    let dir = std::env::temp_dir().join(format!("arch-circles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("rest")).unwrap();
    std::fs::write(dir.join("lib.rs"), "pub mod rest;\n").unwrap();
    std::fs::write(dir.join("rest/mod.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    std::fs::write(
        dir.join("rest/a.rs"),
        "use super::{\n    b::helper,\n    c::{self, X},\n};\n",
    )
    .unwrap();
    std::fs::write(dir.join("rest/b.rs"), "use crate::rest::a::routes;\n").unwrap();
    std::fs::write(
        dir.join("rest/c.rs"),
        "// super::a::x in a comment does not count\n#[cfg(test)]\nuse super::a;\n",
    )
    .unwrap();
    let circles = import_circles(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        circles,
        vec![vec!["rest/a.rs".to_owned(), "rest/b.rs".to_owned()]]
    );
}

/// `/api/v4` has one route table: handler modules under `rest/` register
/// nothing, so no module mounts another and borrows back from it.
#[test]
fn rest_routes_are_registered_only_in_the_route_table() {
    let rest = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/rest");
    let mut files = Vec::new();
    rust_files(&rest, &mut files);
    let mut registering: Vec<String> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "routes.rs"))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .any(|l| l.contains("ServiceConfig") || l.contains(".configure("))
        })
        .map(|f| f.strip_prefix(&rest).unwrap().display().to_string())
        .collect();
    registering.sort();
    assert!(
        registering.is_empty(),
        "register these routes in rest/routes.rs instead: {registering:?}"
    );
}

/// The edges (`rest`, `web`, `graphql`) and the agent hold no SQL: they ask
/// the domains (`work_items`, `namespaces`, `identity`, `chat`, ...), which
/// own their tables.
const NO_SQL_IN: &[&str] = &["rest", "web", "graphql", "agent"];

/// Files under [`NO_SQL_IN`] that still hold SQL, each with what its SQL does;
/// none are left. SQL in any file not listed fails the test, and so does a
/// listed file that holds none.
const SQL_STILL_IN: &[&str] = &[];

/// The code of a file without its test module and comment lines.
fn production_code(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where each occurrence of `word` as a whole word in `text` ends.
fn word_ends(text: &str, word: &str) -> Vec<usize> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word)
        .filter(|(i, _)| {
            let before = text[..*i].chars().last();
            let after = text[i + word.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
        .map(|(i, _)| i + word.len())
        .collect()
}

/// What in `code` is SQL: a statement's keywords (uppercase, as this code
/// base writes SQL) or a call of the database client with a statement.
fn sql_in(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let words_after = |at: usize| -> Vec<&str> { code[at..].split_whitespace().take(3).collect() };
    if !word_ends(code, "SELECT").is_empty() {
        found.push("SELECT".to_owned());
    }
    for (first, second) in [("INSERT", "INTO"), ("DELETE", "FROM")] {
        if word_ends(code, first)
            .into_iter()
            .any(|at| words_after(at).first() == Some(&second))
        {
            found.push(format!("{first} {second}"));
        }
    }
    if word_ends(code, "UPDATE")
        .into_iter()
        .any(|at| words_after(at).get(1) == Some(&"SET"))
    {
        found.push("UPDATE … SET".to_owned());
    }
    // Methods only a database client has.
    for call in [
        ".query_one(",
        ".query_opt(",
        ".query_raw(",
        ".query_typed(",
        ".batch_execute(",
        ".simple_query(",
        ".prepare_cached(",
        ".prepare_typed(",
        ".copy_in(",
        ".copy_out(",
    ] {
        if code.contains(call) {
            found.push(call.to_owned());
        }
    }
    // `query` and `execute` are also other things' names (`uri().query()`,
    // `tool.execute(env, input)`): a client call is one whose first argument
    // is a statement, a literal or a constant.
    for call in [".query(", ".execute("] {
        let statement = code.match_indices(call).any(|(i, _)| {
            let arg = code[i + call.len()..].trim_start();
            let arg = arg.strip_prefix('&').unwrap_or(arg);
            arg.starts_with('"')
                || arg.starts_with("r\"")
                || arg.starts_with("r#")
                || arg.starts_with("format!")
                || arg
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                    .next()
                    .and_then(|path| path.rsplit("::").next())
                    .is_some_and(|name| {
                        name.len() > 1
                            && name.starts_with(|c: char| c.is_ascii_uppercase())
                            && name
                                .chars()
                                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                    })
        });
        if statement {
            found.push(call.to_owned());
        }
    }
    found
}

#[test]
fn the_edges_and_the_agent_hold_no_sql() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut holding = BTreeMap::new();
    for dir in NO_SQL_IN {
        let mut files = Vec::new();
        rust_files(&src.join(dir), &mut files);
        for file in files {
            let code = production_code(&std::fs::read_to_string(&file).unwrap());
            let found = sql_in(&code);
            if !found.is_empty() {
                let rel = file.strip_prefix(&src).unwrap().display().to_string();
                holding.insert(rel, found);
            }
        }
    }
    let new: Vec<_> = holding
        .iter()
        .filter(|(file, _)| !SQL_STILL_IN.contains(&file.as_str()))
        .collect();
    let gone: Vec<_> = SQL_STILL_IN
        .iter()
        .filter(|file| !holding.contains_key(**file))
        .collect();
    assert!(
        new.is_empty(),
        "SQL outside the domains (move it into the domain module that owns the table): {new:?}"
    );
    assert!(
        gone.is_empty(),
        "these files hold no SQL any more: take them off SQL_STILL_IN: {gone:?}"
    );
}

#[test]
fn the_sql_finder_sees_statements_and_client_calls_only() {
    for sql in [
        r#"db.query_one("SELECT 1", &[])"#,
        "let q = \"SELECT id\n FROM users\";",
        r#"const SQL: &str = "INSERT INTO notes (body) VALUES ($1)";"#,
        r#"x("UPDATE instance_settings SET realm = $1")"#,
        r#"x("DELETE FROM ai_conversation_threads")"#,
        "db.execute(&SETTINGS_SQL, &[])",
        "db.execute(queries::RESET, &[])",
        "tx.query(\n    \"WITH t AS (...)\",\n &[])",
        "client.batch_execute(script)",
    ] {
        assert!(!sql_in(sql).is_empty(), "not seen: {sql}");
    }
    for code in [
        "let q = req.uri().query();",
        "tool.execute(env, input).await",
        "batch.execute(&schema, &ctx).await",
        "self.prepare(&question).await",
        "let selected = \"Select a model\";",
        "// SELECT in a comment\n",
        "let updated = UPDATE_LIMIT;",
    ] {
        assert!(sql_in(&production_code(code)).is_empty(), "seen in: {code}");
    }
}
