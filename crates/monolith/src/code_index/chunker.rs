//! Splits a file into chunks sized for the embedding model: along syntax
//! (tree-sitter grammars through `text-splitter`) where a grammar exists,
//! along lines and paragraphs elsewhere.

use text_splitter::{ChunkConfig, CodeSplitter, TextSplitter};

/// About 256 MiniLM tokens: longer input is silently truncated by the model,
/// so a bigger chunk would only be half embedded.
pub const CHUNK_BYTES: usize = 1000;
/// Chunks shorter than this are not worth a vector of their own unless the
/// whole file is that short.
const MIN_CHUNK_BYTES: usize = 300;

/// One piece of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub start_byte: usize,
    pub end_byte: usize,
    /// 1-based, inclusive.
    pub start_line: usize,
    pub end_line: usize,
    /// The function, type or class the chunk starts in, when recognisable.
    pub symbol: Option<String>,
    pub content: String,
}

/// The language of a path, by extension (`text` when none is known).
pub fn language_of(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or(path);
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("rs") => "rust",
        Some("py") => "python",
        Some("js" | "jsx" | "mjs" | "cjs") => "javascript",
        Some("ts" | "mts" | "cts") => "typescript",
        Some("tsx") => "tsx",
        Some("go") => "go",
        Some("rb" | "rake") => "ruby",
        Some("java") => "java",
        Some("md" | "markdown") => "markdown",
        Some("yml" | "yaml") => "yaml",
        Some("toml") => "toml",
        Some("json") => "json",
        Some("sql") => "sql",
        Some("sh" | "bash") => "shell",
        _ if name == "Dockerfile" || name.starts_with("Dockerfile.") => "dockerfile",
        _ if name == "Makefile" => "makefile",
        _ if name == "Gemfile" || name == "Rakefile" => "ruby",
        _ => "text",
    }
}

fn grammar(language: &str) -> Option<tree_sitter_language::LanguageFn> {
    Some(match language {
        "rust" => tree_sitter_rust::LANGUAGE,
        "python" => tree_sitter_python::LANGUAGE,
        "javascript" => tree_sitter_javascript::LANGUAGE,
        "typescript" => tree_sitter_typescript::LANGUAGE_TYPESCRIPT,
        "tsx" => tree_sitter_typescript::LANGUAGE_TSX,
        "go" => tree_sitter_go::LANGUAGE,
        "ruby" => tree_sitter_ruby::LANGUAGE,
        "java" => tree_sitter_java::LANGUAGE,
        _ => return None,
    })
}

/// Splits `text` (the content of a file in `language`) into chunks of at most
/// [`CHUNK_BYTES`] bytes; a grammar that fails to load falls back to text.
pub fn chunk(language: &str, text: &str) -> Vec<Chunk> {
    let config = || ChunkConfig::new(MIN_CHUNK_BYTES..CHUNK_BYTES);
    let pieces: Vec<(usize, &str)> =
        match grammar(language).and_then(|g| CodeSplitter::new(g, config()).ok()) {
            Some(splitter) => splitter.chunk_indices(text).collect(),
            None => TextSplitter::new(config()).chunk_indices(text).collect(),
        };
    let mut line = 1;
    let mut counted_to = 0;
    pieces
        .into_iter()
        .filter(|(_, piece)| !piece.trim().is_empty())
        .map(|(start, piece)| {
            line += count_lines(&text.as_bytes()[counted_to..start]);
            counted_to = start;
            let end_line = line + count_lines(piece.trim_end().as_bytes());
            Chunk {
                start_byte: start,
                end_byte: start + piece.len(),
                start_line: line,
                end_line,
                symbol: symbol_of(piece),
                content: piece.to_owned(),
            }
        })
        .collect()
}

fn count_lines(bytes: &[u8]) -> usize {
    bytes.iter().filter(|b| **b == b'\n').count()
}

/// The first definition a chunk opens with: `fn name`, `def name`,
/// `class Name`, `func name`, `function name`, `struct Name`...
pub fn symbol_of(piece: &str) -> Option<String> {
    const KEYWORDS: &[&str] = &[
        "fn",
        "def",
        "class",
        "func",
        "function",
        "struct",
        "enum",
        "trait",
        "impl",
        "interface",
        "module",
        "type",
        "const",
    ];
    for line in piece.lines().take(12) {
        let mut words = line
            .split(|c: char| c.is_whitespace() || c == '(' || c == '<' || c == '{' || c == ':')
            .filter(|w| !w.is_empty());
        while let Some(word) = words.next() {
            if KEYWORDS.contains(&word) {
                let name = words.next()?;
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
                    .collect();
                if name.is_empty() {
                    break;
                }
                return Some(name);
            }
            // Modifiers may come first (`pub async fn`, `export default class`).
            if ![
                "pub",
                "pub(crate)",
                "async",
                "export",
                "default",
                "public",
                "private",
                "protected",
                "static",
                "final",
                "abstract",
                "unsafe",
            ]
            .contains(&word)
            {
                break;
            }
        }
    }
    None
}

/// The text a chunk is embedded as: its path (and symbol) first, so a question
/// that names a file or function finds it.
pub fn embedding_text(path: &str, chunk: &Chunk) -> String {
    match &chunk.symbol {
        Some(symbol) => format!("{path} {symbol}\n{}", chunk.content),
        None => format!("{path}\n{}", chunk.content),
    }
}

/// About how many word pieces a BERT-style tokenizer makes of `text`
/// (`[CLS]` and `[SEP]` included): each punctuation mark is one, a run of
/// letters and digits one per six characters begun. Without the model's
/// vocabulary this is an estimate, close enough to size batches by work.
pub fn estimated_tokens(text: &str) -> usize {
    let mut tokens: usize = 2;
    let mut run: usize = 0;
    for c in text.chars() {
        if c.is_alphanumeric() {
            run += 1;
            continue;
        }
        tokens += run.div_ceil(6);
        run = 0;
        if !c.is_whitespace() {
            tokens += 1;
        }
    }
    tokens + run.div_ceil(6)
}

/// Words for full-text search: the path's parts and the content with
/// identifiers split (`rateLimit`, `rate_limit` → `rate limit`), so a plain
/// question matches code that spells the words as one identifier.
pub fn search_words(path: &str, content: &str) -> String {
    let mut out = String::with_capacity(path.len() + content.len() * 2);
    for source in [path, content] {
        for word in source.split(|c: char| !c.is_alphanumeric() && c != '_') {
            if word.is_empty() || word.len() > 64 {
                continue;
            }
            out.push_str(word);
            out.push(' ');
            let parts = split_identifier(word);
            if parts.len() > 1 {
                for part in parts {
                    out.push_str(&part);
                    out.push(' ');
                }
            }
        }
        out.push('\n');
    }
    out
}

/// `parseHTTPRequest_v2` → `parse`, `http`, `request`, `v2`.
pub fn split_identifier(word: &str) -> Vec<String> {
    let mut parts = Vec::new();
    for piece in word.split('_').filter(|p| !p.is_empty()) {
        let chars: Vec<char> = piece.chars().collect();
        let mut current = String::new();
        for (i, c) in chars.iter().enumerate() {
            let boundary = i > 0
                && c.is_uppercase()
                && (chars[i - 1].is_lowercase()
                    || chars[i - 1].is_ascii_digit()
                    || chars.get(i + 1).is_some_and(|n| n.is_lowercase()));
            if boundary && !current.is_empty() {
                parts.push(std::mem::take(&mut current).to_lowercase());
            }
            current.push(*c);
        }
        if !current.is_empty() {
            parts.push(current.to_lowercase());
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_is_split_along_functions_with_lines_and_symbols() {
        let mut text = String::new();
        for i in 0..12 {
            text.push_str(&format!(
                "/// Adds {i}.\npub fn add_{i}(x: u32) -> u32 {{\n    let y = x + {i};\n    y * 2 + {i} - {i}\n}}\n\n"
            ));
        }
        let chunks = chunk("rust", &text);
        assert!(chunks.len() > 1, "{chunks:?}");
        for c in &chunks {
            assert!(c.content.len() <= CHUNK_BYTES);
            assert_eq!(&text[c.start_byte..c.end_byte], c.content);
            let first_line = text.lines().nth(c.start_line - 1).unwrap_or_default();
            assert!(c.content.starts_with(first_line.trim_start()), "{c:?}");
            // No chunk cuts a function in half.
            assert_eq!(
                c.content.matches('{').count(),
                c.content.matches('}').count()
            );
        }
        assert_eq!(chunks[0].start_line, 1);
        assert!(chunks.iter().any(|c| c.symbol.as_deref() == Some("add_0")));
        assert_eq!(chunks.last().map(|c| c.end_line), Some(12 * 6 - 1));
    }

    #[test]
    fn every_grammar_loads() {
        for lang in [
            "rust",
            "python",
            "javascript",
            "typescript",
            "tsx",
            "go",
            "ruby",
            "java",
        ] {
            let g = grammar(lang).unwrap_or_else(|| panic!("{lang}"));
            assert!(CodeSplitter::new(g, 100).is_ok(), "{lang}");
        }
    }

    #[test]
    fn unknown_languages_split_as_text() {
        let text = "word ".repeat(1000);
        let chunks = chunk("text", &text);
        assert!(chunks.len() >= 5);
        assert!(chunks.iter().all(|c| c.content.len() <= CHUNK_BYTES));
    }

    #[test]
    fn token_estimates_count_punctuation_and_long_words() {
        assert_eq!(estimated_tokens(""), 2);
        // fn, add, (, x, :, u32, ), {, }
        assert_eq!(estimated_tokens("fn add(x: u32) {}"), 2 + 9);
        // A 13-letter word is three pieces at most.
        assert_eq!(estimated_tokens("authorization"), 2 + 3);
    }

    #[test]
    fn symbols_and_identifiers() {
        assert_eq!(symbol_of("pub async fn serve(x: u8)"), Some("serve".into()));
        assert_eq!(
            symbol_of("def refund_score(row):"),
            Some("refund_score".into())
        );
        assert_eq!(
            symbol_of("export default class SeatMap {"),
            Some("SeatMap".into())
        );
        assert_eq!(symbol_of("let x = 1;"), None);
        assert_eq!(
            split_identifier("parseHTTPRequest_v2"),
            vec!["parse", "http", "request", "v2"]
        );
        assert!(search_words("src/rate_limit.rs", "maxRequests").contains("max requests"));
        assert_eq!(language_of("web/src/Cart.tsx"), "tsx");
        assert_eq!(language_of("Dockerfile"), "dockerfile");
    }
}
