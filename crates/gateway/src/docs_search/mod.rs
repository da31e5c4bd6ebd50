//! Full-text search over the project's own Markdown documentation, for the
//! `gitlab_documentation` chat tool (`POST /v1/search/gitlab-docs`).
//!
//! The index is built in memory at start-up from every `*.md` file under the
//! documentation directory, one entry per `## ` section (see
//! [`markdown::split_sections`]). It is small (a few hundred KiB of text) and
//! read-only afterwards, so searching needs no locks.

pub mod markdown;

use markdown::Section;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{
    Field, IndexRecordOption, STORED, Schema, TextFieldIndexing, TextOptions, Value as _,
};
use tantivy::{Index, IndexReader, ReloadPolicy, TantivyDocument, doc};

/// At most this many results, whatever `page_size` asks for.
pub const MAX_RESULTS: usize = 5;
/// Longer queries are refused (422): questions are short, and a bounded query
/// keeps the cost of one search bounded.
pub const MAX_QUERY_CHARS: usize = 1_000;
/// A result's `content` is cut to this many characters.
pub const MAX_CONTENT_CHARS: usize = 4_000;
/// Files larger than this are skipped (with a warning): they are not docs.
const MAX_FILE_BYTES: u64 = 2 * 1024 * 1024;
/// Heap for the one-off indexing run; tantivy's minimum per thread.
const WRITER_HEAP_BYTES: usize = 15_000_000;
/// The tokenizer tantivy registers for English with stemming, so that
/// "errors" finds "error".
const ENGLISH: &str = "en_stem";

#[derive(Debug, thiserror::Error)]
pub enum DocsIndexError {
    #[error("reading the documentation in {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("building the documentation index: {0}")]
    Index(#[from] tantivy::TantivyError),
}

/// One search hit.
#[derive(Debug, Clone, PartialEq)]
pub struct DocsHit {
    /// `<source>#<anchor>`: stable across restarts while the docs don't change.
    pub id: String,
    pub content: String,
    /// `source`, `source_type`, `source_url`, `title`, `section`, `filename`.
    pub metadata: Map<String, Value>,
    pub score: f32,
}

struct Fields {
    title: Field,
    heading: Field,
    body: Field,
    ordinal: Field,
}

/// A section as served, with where it came from.
struct Entry {
    section: Section,
    /// Path shown to users: the documentation directory's name and the file's
    /// path below it, with `/` separators (`docs/error-codes.md`).
    source: String,
    filename: String,
}

pub struct DocsIndex {
    index: Index,
    reader: IndexReader,
    fields: Fields,
    entries: Vec<Entry>,
    /// Prefix of `source_url`; empty gives a relative link.
    base_url: String,
}

impl std::fmt::Debug for DocsIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocsIndex")
            .field("sections", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl DocsIndex {
    /// Indexes every `*.md` file below `dir`. A missing directory gives an
    /// empty index (searches find nothing) and a warning, not a failed start.
    pub fn build(dir: &Path, base_url: &str) -> Result<Self, DocsIndexError> {
        let mut files = Vec::new();
        if dir.is_dir() {
            collect_markdown(dir, &mut files)?;
        } else {
            tracing::warn!(dir = %dir.display(), "documentation directory not found: the docs search will find nothing");
        }
        files.sort();
        let prefix = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "docs".to_owned());

        let mut entries = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| DocsIndexError::Read {
                path: file.clone(),
                source,
            })?;
            let relative = file.strip_prefix(dir).unwrap_or(&file);
            let relative = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            let stem = file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let filename = file
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            for section in markdown::split_sections(&text, &stem) {
                entries.push(Entry {
                    section,
                    source: format!("{prefix}/{relative}"),
                    filename: filename.clone(),
                });
            }
        }
        Self::from_entries(entries, base_url)
    }

    fn from_entries(entries: Vec<Entry>, base_url: &str) -> Result<Self, DocsIndexError> {
        let mut schema = Schema::builder();
        let text = TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(ENGLISH)
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        );
        let fields = Fields {
            title: schema.add_text_field("title", text.clone()),
            heading: schema.add_text_field("heading", text.clone()),
            body: schema.add_text_field("body", text),
            ordinal: schema.add_u64_field("ordinal", STORED),
        };
        let index = Index::create_in_ram(schema.build());
        let mut writer = index.writer_with_num_threads::<TantivyDocument>(1, WRITER_HEAP_BYTES)?;
        for (ordinal, entry) in entries.iter().enumerate() {
            writer.add_document(doc!(
                fields.title => entry.section.page_title.as_str(),
                fields.heading => entry.section.heading.as_str(),
                fields.body => entry.section.text.as_str(),
                fields.ordinal => ordinal as u64,
            ))?;
        }
        writer.commit()?;
        drop(writer);
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        Ok(Self {
            index,
            reader,
            fields,
            entries,
            base_url: base_url.trim_end_matches('/').to_owned(),
        })
    }

    /// How many sections are searchable.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The best `limit` sections for `query` (at most [`MAX_RESULTS`]), best
    /// first. Query syntax is not interpreted: every word is a plain term.
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<DocsHit>, DocsIndexError> {
        let limit = limit.clamp(1, MAX_RESULTS);
        let words = plain_words(query);
        if words.is_empty() || self.entries.is_empty() {
            return Ok(Vec::new());
        }
        let mut parser = QueryParser::for_index(
            &self.index,
            vec![self.fields.title, self.fields.heading, self.fields.body],
        );
        // A hit in the section heading says more than one in its text.
        parser.set_field_boost(self.fields.heading, 3.0);
        parser.set_field_boost(self.fields.title, 1.5);
        let (parsed, _ignored) = parser.parse_query_lenient(&words);
        let searcher = self.reader.searcher();
        let top = searcher.search(&parsed, &TopDocs::with_limit(limit).order_by_score())?;
        let mut hits = Vec::with_capacity(top.len());
        for (score, address) in top {
            let stored: TantivyDocument = searcher.doc(address)?;
            let Some(entry) = stored
                .get_first(self.fields.ordinal)
                .and_then(|v| v.as_u64())
                .and_then(|i| self.entries.get(usize::try_from(i).ok()?))
            else {
                continue;
            };
            hits.push(self.hit(entry, score));
        }
        Ok(hits)
    }

    fn hit(&self, entry: &Entry, score: f32) -> DocsHit {
        let section = &entry.section;
        let link = if section.anchor.is_empty() {
            entry.source.clone()
        } else {
            format!("{}#{}", entry.source, section.anchor)
        };
        let source_url = if self.base_url.is_empty() {
            link.clone()
        } else {
            format!("{}/{link}", self.base_url)
        };
        let mut metadata = Map::new();
        metadata.insert("source".into(), entry.source.clone().into());
        metadata.insert("source_type".into(), "doc".into());
        metadata.insert("source_url".into(), source_url.into());
        metadata.insert("title".into(), section.page_title.clone().into());
        metadata.insert("section".into(), section.heading.clone().into());
        metadata.insert("filename".into(), entry.filename.clone().into());
        DocsHit {
            id: link,
            content: truncate_chars(&section.text, MAX_CONTENT_CHARS),
            metadata,
            score,
        }
    }
}

/// The query's words, lower-cased, with every other character a space, so
/// that nothing in a question is read as query syntax (`field:`, `*`, quotes,
/// `AND`/`OR`).
fn plain_words(query: &str) -> String {
    let cleaned: String = query
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { ' ' })
        .flat_map(char::to_lowercase)
        .collect();
    cleaned.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn collect_markdown(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), DocsIndexError> {
    let read_error = |source| DocsIndexError::Read {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let path = entry.path();
        let kind = entry.file_type().map_err(read_error)?;
        if kind.is_dir() {
            collect_markdown(&path, files)?;
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "md") {
            let size = entry.metadata().map_err(read_error)?.len();
            if size > MAX_FILE_BYTES {
                tracing::warn!(file = %path.display(), size, "skipping an oversized documentation file");
                continue;
            }
            files.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_of(pages: &[(&str, &str)]) -> DocsIndex {
        let entries = pages
            .iter()
            .flat_map(|(name, text)| {
                markdown::split_sections(text, name)
                    .into_iter()
                    .map(move |section| Entry {
                        section,
                        source: format!("docs/{name}.md"),
                        filename: format!("{name}.md"),
                    })
            })
            .collect();
        DocsIndex::from_entries(entries, "").unwrap()
    }

    #[test]
    fn finds_the_section_and_links_its_anchor() {
        let index = index_of(&[
            (
                "errors",
                "# Errors\n\n## Error A1000\nThe model took too long.\n\n## Error M3003\nNot found or hidden.\n",
            ),
            ("setup", "# Setup\n\n## Installing\nRun the installer.\n"),
        ]);
        let hits = index.search("what does error M3003 mean?", 4).unwrap();
        assert_eq!(hits[0].id, "docs/errors.md#error-m3003");
        assert_eq!(hits[0].metadata["source_url"], "docs/errors.md#error-m3003");
        assert_eq!(hits[0].metadata["title"], "Errors");
        assert!(hits[0].content.contains("Not found or hidden."));
    }

    #[test]
    fn stems_words_and_ignores_query_syntax() {
        let index = index_of(&[("setup", "# Setup\n\n## Installing\nRun the installer.\n")]);
        assert_eq!(index.search("installs", 4).unwrap().len(), 1);
        assert_eq!(
            index.search("title:\"installing\" AND *", 4).unwrap().len(),
            1
        );
        assert!(index.search("?!", 4).unwrap().is_empty());
        assert!(index.search("zebra", 4).unwrap().is_empty());
    }

    #[test]
    fn results_are_bounded() {
        let pages: Vec<(String, String)> = (0..8)
            .map(|i| {
                (
                    format!("p{i}"),
                    format!("# Page {i}\n\n## Tokens\nTokens everywhere.\n"),
                )
            })
            .collect();
        let pages: Vec<(&str, &str)> = pages
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let index = index_of(&pages);
        assert_eq!(index.search("tokens", 20).unwrap().len(), MAX_RESULTS);
        assert_eq!(index.search("tokens", 2).unwrap().len(), 2);
    }

    #[test]
    fn long_content_is_cut_on_a_character_boundary() {
        let cut = truncate_chars(&"é".repeat(MAX_CONTENT_CHARS + 3), MAX_CONTENT_CHARS);
        assert_eq!(cut.chars().count(), MAX_CONTENT_CHARS + 1);
        assert!(cut.ends_with('…'));
    }
}
