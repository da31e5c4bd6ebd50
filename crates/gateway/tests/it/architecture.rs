//! The gateway's module structure, checked on its source: no source files
//! import each other round a loop (a file-level import cycle, found as a
//! strongly connected component of more than one file), and the model layer
//! (`providers`) never imports what is built on it.
//!
//! Imports are the `crate::`, `super::` and `self::` paths a file's code
//! names, `use` groups included; comments, string literals and `#[cfg(test)]`
//! items do not count. A path is the file it names: the longest prefix that
//! is a module file (`crate::providers::tool_calling::ModelTurn` is
//! `providers/tool_calling.rs`, `crate::providers::ModelRoute` is
//! `providers/mod.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What a top-level module must never import. `providers` is the model
/// layer: chat, the workflow service, the HTTP handlers and the server
/// wiring (with its shared state) are built on it.
const FORBIDDEN: &[(&str, &[&str])] = &[(
    "providers",
    &["api", "app", "app_state", "chat", "workflow_service"],
)];

/// Source files by their path below `src/` (`chat/agent.rs`).
type Sources = BTreeMap<String, String>;

/// One import: `from` names `path` on `line`, which is in the file `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Import {
    from: String,
    line: usize,
    path: String,
    to: String,
}

fn read_sources(dir: &Path, src: &Path, out: &mut Sources) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            read_sources(&path, src, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src).unwrap();
            let rel = rel.to_str().unwrap().replace('\\', "/");
            out.insert(rel, std::fs::read_to_string(&path).unwrap());
        }
    }
}

fn gateway_sources() -> Sources {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = Sources::new();
    read_sources(&src, &src, &mut sources);
    // The binary is its own crate: its `crate::` is not the library's.
    sources.remove("main.rs");
    sources
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Blanks `text[from..to]`, keeping line breaks so line numbers stay.
fn blank(text: &mut [char], from: usize, to: usize) {
    let to = to.min(text.len());
    for c in &mut text[from..to] {
        if *c != '\n' {
            *c = ' ';
        }
    }
}

/// The code alone: comments, string and character literals blanked.
fn without_comments_and_literals(source: &str) -> Vec<char> {
    let mut text: Vec<char> = source.chars().collect();
    let mut i = 0;
    while i < text.len() {
        let next = text.get(i + 1).copied();
        match text[i] {
            '/' if next == Some('/') => {
                let end = (i..text.len())
                    .find(|&j| text[j] == '\n')
                    .unwrap_or(text.len());
                blank(&mut text, i, end);
                i = end;
            }
            '/' if next == Some('*') => {
                let (mut depth, mut j) = (0, i);
                while j < text.len() {
                    if text[j] == '/' && text.get(j + 1) == Some(&'*') {
                        depth += 1;
                        j += 2;
                    } else if text[j] == '*' && text.get(j + 1) == Some(&'/') {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                blank(&mut text, i, j);
                i = j;
            }
            'r' if (i == 0
                || !is_ident(text[i - 1])
                || (text[i - 1] == 'b' && (i < 2 || !is_ident(text[i - 2]))))
                && matches!(next, Some('#' | '"')) =>
            {
                let hashes = text[i + 1..].iter().take_while(|c| **c == '#').count();
                if text.get(i + 1 + hashes) != Some(&'"') {
                    i += 1;
                    continue;
                }
                let mut j = i + 2 + hashes;
                while j < text.len() {
                    if text[j] == '"'
                        && text[j + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|c| **c == '#')
                            .count()
                            == hashes
                    {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                blank(&mut text, i, j);
                i = j;
            }
            '"' => {
                let mut j = i + 1;
                while j < text.len() && text[j] != '"' {
                    j += if text[j] == '\\' { 2 } else { 1 };
                }
                blank(&mut text, i, j + 1);
                i = j + 1;
            }
            '\'' if next == Some('\\') => {
                let end = (i + 2..text.len())
                    .find(|&j| text[j] == '\'')
                    .unwrap_or(text.len());
                blank(&mut text, i, end + 1);
                i = end + 1;
            }
            '\'' if text.get(i + 2) == Some(&'\'') => {
                blank(&mut text, i, i + 3);
                i += 3;
            }
            // A lifetime, or anything else.
            _ => i += 1,
        }
    }
    text
}

/// Blanks every `#[cfg(test)]` item: test code may import what it likes.
fn without_test_items(text: &mut [char]) {
    let marker: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + marker.len() <= text.len() {
        if text[i..i + marker.len()] != marker[..] {
            i += 1;
            continue;
        }
        // The item ends at its first `;`, or with the block it opens.
        let Some(open) = (i..text.len()).find(|&j| text[j] == ';' || text[j] == '{') else {
            break;
        };
        let mut end = open + 1;
        if text[open] == '{' {
            let mut depth = 1;
            while end < text.len() && depth > 0 {
                match text[end] {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                end += 1;
            }
        }
        blank(text, i, end);
        i = end;
    }
}

/// The code's `crate::`/`super::`/`self::` paths, with their lines: the head
/// (`crate`, `super`, `super::super`, `self`) and the segments after it, one
/// entry for each leaf of a `use` group.
fn named_paths(code: &[char]) -> Vec<(usize, String, Vec<String>)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let starts_word =
            i == 0 || !(is_ident(code[i - 1]) || code[i - 1] == '$' || code[i - 1] == ':');
        let rest: String = code[i..code.len().min(i + 7)].iter().collect();
        let head = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|h| starts_word && rest.starts_with(h));
        let Some(head) = head else {
            i += 1;
            continue;
        };
        let line = code[..i].iter().filter(|c| **c == '\n').count() + 1;
        let mut at = i + head.len();
        let mut head = head.trim_end_matches(':').to_owned();
        // `super::super::…`
        while code[at..].iter().collect::<String>().starts_with("super::") {
            head.push_str("::super");
            at += "super::".len();
        }
        let mut leaves = Vec::new();
        let end = path_tail(code, at, Vec::new(), &mut leaves);
        for leaf in leaves {
            found.push((line, head.clone(), leaf));
        }
        i = end.max(i + 1);
    }
    found
}

fn skip_space(code: &[char], mut at: usize) -> usize {
    while at < code.len() && code[at].is_whitespace() {
        at += 1;
    }
    at
}

/// Reads segments (and `{…}` groups) from `at`; every complete path goes
/// to `leaves`. Returns where reading stopped.
fn path_tail(
    code: &[char],
    at: usize,
    prefix: Vec<String>,
    leaves: &mut Vec<Vec<String>>,
) -> usize {
    let mut segments = prefix;
    let mut at = skip_space(code, at);
    loop {
        if code.get(at) == Some(&'{') {
            at += 1;
            loop {
                at = skip_space(code, at);
                match code.get(at) {
                    Some('}') => return at + 1,
                    Some(',') => at += 1,
                    Some(_) => {
                        let before = at;
                        at = path_tail(code, at, segments.clone(), leaves);
                        if at == before {
                            at += 1;
                        }
                    }
                    None => return at,
                }
            }
        }
        let start = at;
        while at < code.len() && is_ident(code[at]) {
            at += 1;
        }
        if at == start {
            // `*`, or the end of the path.
            if code.get(at) == Some(&'*') {
                at += 1;
            }
            leaves.push(segments);
            return at;
        }
        let segment: String = code[start..at].iter().collect();
        if segment != "self" {
            segments.push(segment);
        }
        let after = skip_space(code, at);
        if code.get(after) == Some(&':') && code.get(after + 1) == Some(&':') {
            at = skip_space(code, after + 2);
        } else {
            leaves.push(segments);
            return at;
        }
    }
}

/// The module a file is (`chat/agent.rs` → `chat::agent`, `chat/mod.rs` →
/// `chat`, `lib.rs` → the crate root).
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The file a path from `file` names.
fn resolve(sources: &Sources, file: &str, head: &str, segments: &[String]) -> String {
    let own = module_of(file);
    let mut full = match head {
        "crate" => Vec::new(),
        "self" => own,
        supers => {
            let up = supers.split("::").count();
            own[..own.len().saturating_sub(up)].to_vec()
        }
    };
    full.extend(segments.iter().cloned());
    for len in (1..=full.len()).rev() {
        let base = full[..len].join("/");
        for candidate in [format!("{base}.rs"), format!("{base}/mod.rs")] {
            if sources.contains_key(&candidate) {
                return candidate;
            }
        }
    }
    "lib.rs".to_owned()
}

fn imports(sources: &Sources) -> Vec<Import> {
    let mut found = Vec::new();
    for (file, text) in sources {
        let mut code = without_comments_and_literals(text);
        without_test_items(&mut code);
        for (line, head, segments) in named_paths(&code) {
            let to = resolve(sources, file, &head, &segments);
            if &to != file {
                let mut path = vec![head];
                path.extend(segments);
                found.push(Import {
                    from: file.clone(),
                    line,
                    path: path.join("::"),
                    to,
                });
            }
        }
    }
    found
}

/// The strongly connected components of more than one file (Tarjan).
fn cycles(imports: &[Import]) -> Vec<BTreeSet<String>> {
    struct Search<'a> {
        edges: BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, file: &'a str) {
            let n = self.index.len();
            self.index.insert(file, n);
            self.low.insert(file, n);
            self.stack.push(file);
            self.on_stack.insert(file);
            let next: Vec<&'a str> = self
                .edges
                .get(file)
                .into_iter()
                .flatten()
                .copied()
                .collect();
            for to in next {
                if !self.index.contains_key(to) {
                    self.visit(to);
                    let low = self.low[file].min(self.low[to]);
                    self.low.insert(file, low);
                } else if self.on_stack.contains(to) {
                    let low = self.low[file].min(self.index[to]);
                    self.low.insert(file, low);
                }
            }
            if self.low[file] == self.index[file] {
                let mut component = BTreeSet::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    component.insert(member.to_owned());
                    if member == file {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        edges: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for import in imports {
        search
            .edges
            .entry(import.from.as_str())
            .or_default()
            .insert(import.to.as_str());
    }
    let files: Vec<&str> = search.edges.keys().copied().collect();
    for file in files {
        if !search.index.contains_key(file) {
            search.visit(file);
        }
    }
    search.found
}

/// Each cycle with the imports that close it.
fn describe_cycles(imports: &[Import]) -> Vec<String> {
    cycles(imports)
        .into_iter()
        .map(|files| {
            let names: Vec<&str> = files.iter().map(String::as_str).collect();
            let mut text = format!("import cycle between {}:", names.join(", "));
            for import in imports
                .iter()
                .filter(|i| files.contains(&i.from) && files.contains(&i.to))
            {
                text.push_str(&format!(
                    "\n    {}:{} uses {} ({})",
                    import.from, import.line, import.path, import.to
                ));
            }
            text
        })
        .collect()
}

fn top_module(file: &str) -> &str {
    let first = file.split('/').next().unwrap_or(file);
    first.strip_suffix(".rs").unwrap_or(first)
}

/// Imports [`FORBIDDEN`] refuses.
fn forbidden_imports(imports: &[Import]) -> Vec<String> {
    let mut problems = Vec::new();
    for import in imports {
        let (from, to) = (top_module(&import.from), top_module(&import.to));
        for (module, never) in FORBIDDEN {
            if from == *module && never.contains(&to) {
                problems.push(format!(
                    "{}:{}: `{module}` must not import `{to}` (uses {})",
                    import.from, import.line, import.path
                ));
            }
        }
    }
    problems
}

#[test]
fn no_source_files_import_each_other_in_a_loop() {
    let imports = imports(&gateway_sources());
    // The reading works: a known import is seen.
    assert!(
        imports
            .iter()
            .any(|i| i.from == "chat/native.rs" && i.to == "providers/tool_calling.rs"),
        "chat/native.rs → providers/tool_calling.rs was not found"
    );
    let cycles = describe_cycles(&imports);
    assert!(cycles.is_empty(), "{}", cycles.join("\n"));
}

#[test]
fn providers_import_nothing_built_on_them() {
    let problems = forbidden_imports(&imports(&gateway_sources()));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_top_level_module_in_the_rules_exists() {
    let sources = gateway_sources();
    let modules: BTreeSet<&str> = sources.keys().map(|f| top_module(f)).collect();
    for (module, never) in FORBIDDEN {
        for name in std::iter::once(module).chain(never.iter()) {
            assert!(modules.contains(name), "no module `{name}` in src/");
        }
    }
}

/// The checks themselves, on made-up sources: a loop and a forbidden import
/// are found; comments, strings and test modules are not imports.
#[test]
fn the_checks_find_loops_and_forbidden_imports_and_nothing_else() {
    let sources: Sources = [
        ("lib.rs", "pub mod app;\npub mod chat;\npub mod providers;\n"),
        (
            "app.rs",
            "use crate::workflow_service::{self, Service};\n// crate::providers::Model\nconst URL: &str = \"crate::providers\";\nconst QUOTE: char = '\"';\nfn f<'a>(x: &'a str) {}\n",
        ),
        (
            "workflow_service/mod.rs",
            "pub mod engine;\nuse crate::app::AppState;\n#[cfg(test)]\nmod tests {\n    use crate::providers::Model;\n}\n",
        ),
        ("workflow_service/engine.rs", "use super::super::chat::agent::run;\n"),
        ("chat/mod.rs", "pub mod agent;\n"),
        ("chat/agent.rs", "fn run() {}\n"),
        ("config.rs", ""),
        ("providers/mod.rs", "pub mod route;\n"),
        (
            "providers/route.rs",
            "use crate::{\n    config::ProvidersConfig,\n    chat::{agent::run, self},\n};\nfn g() { let _ = r#\"crate::app\"#; }\n",
        ),
    ]
    .into_iter()
    .map(|(file, text)| (file.to_owned(), text.to_owned()))
    .collect();
    let imports = imports(&sources);
    let edges: BTreeSet<(&str, &str)> = imports
        .iter()
        .map(|i| (i.from.as_str(), i.to.as_str()))
        .collect();
    assert_eq!(
        edges,
        BTreeSet::from([
            ("app.rs", "workflow_service/mod.rs"),
            ("workflow_service/mod.rs", "app.rs"),
            ("workflow_service/engine.rs", "chat/agent.rs"),
            ("providers/route.rs", "config.rs"),
            ("providers/route.rs", "chat/agent.rs"),
            ("providers/route.rs", "chat/mod.rs"),
        ])
    );
    let cycles = describe_cycles(&imports);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(
        cycles[0].starts_with("import cycle between app.rs, workflow_service/mod.rs:")
            && cycles[0].contains("app.rs:1 uses crate::workflow_service")
            && cycles[0].contains("workflow_service/mod.rs:2 uses crate::app::AppState"),
        "{}",
        cycles[0]
    );
    let problems = forbidden_imports(&imports);
    assert_eq!(
        problems,
        [
            "providers/route.rs:1: `providers` must not import `chat` (uses crate::chat::agent::run)",
            "providers/route.rs:1: `providers` must not import `chat` (uses crate::chat)",
        ]
    );
}
