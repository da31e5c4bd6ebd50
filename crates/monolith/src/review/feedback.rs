//! Learning from replies: when a developer answers one of the bot's diff
//! comments by dismissing it ("false positive", "this is intended", "won't
//! fix"), the project keeps that as feedback. Later reviews show the model
//! the recent feedback for the same file or language, and a comment the
//! model makes again on a file where the same comment was dismissed is not
//! posted.
//!
//! Whether a reply dismisses is decided by a small phrase classifier
//! ([`dismisses`]): deterministic, so a test can say what teaches the bot.
//! Who may teach it is the policy's decision (they read the merge request
//! and its code, and Duo is on for the project); the caller asks first.

use crate::queries::Queries;

/// Feedback items kept per project; the oldest go first.
pub const KEEP_PER_PROJECT: i64 = 200;
/// Items shown to the model for one file, and their total size.
const MAX_SHOWN: usize = 5;
const MAX_SHOWN_CHARS: usize = 3_000;
/// How much of a comment and a reply one shown item quotes.
const QUOTE_CHARS: usize = 300;
/// What is stored of a comment and of a reply (the table's limits).
const MAX_COMMENT_CHARS: usize = 4_000;
const MAX_REPLY_CHARS: usize = 2_000;

/// Phrases that dismiss a review comment, as lowercase words.
const DISMISSALS: &[&str] = &[
    "false positive",
    "false alarm",
    "intended",
    "intentional",
    "intentionally",
    "on purpose",
    "by design",
    "deliberate",
    "deliberately",
    "expected behavior",
    "expected behaviour",
    "not an issue",
    "not a problem",
    "not a bug",
    "non issue",
    "no issue",
    "not relevant",
    "irrelevant",
    "not applicable",
    "does not apply",
    "doesn't apply",
    "won't fix",
    "wont fix",
    "will not fix",
    "not going to fix",
    "not fixing",
    "we don't",
    "we dont",
    "we do not",
    "we never",
    "please ignore",
    "ignore this",
    "disagree",
    "this is fine",
    "that's fine",
    "it's fine",
    "can't happen",
    "cannot happen",
    "never happens",
];

/// Words that turn a dismissal around when they come just before it
/// ("this is not intended", "isn't a false positive").
const NEGATIONS: &[&str] = &[
    "not", "isn't", "isnt", "wasn't", "wasnt", "aren't", "arent", "never", "hardly", "no",
];

/// Phrases of agreement: a reply with one of them accepts the comment,
/// whatever else it says ("good catch, though the rest is intended").
const AGREEMENTS: &[&str] = &[
    "good catch",
    "nice catch",
    "you're right",
    "you are right",
    "will fix",
    "i'll fix",
    "fixed it",
    "fixed in",
    "agreed",
    "thanks for catching",
];

/// The words of `text`: lowercase runs of letters, digits and apostrophes
/// (typographic apostrophes made plain).
fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .replace('\u{2019}', "'")
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .map(|w| w.trim_matches('\''))
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Where `phrase` (words) occurs in `sentence` (words): the start indices.
fn occurrences(sentence: &[String], phrase: &[String]) -> Vec<usize> {
    if phrase.is_empty() || phrase.len() > sentence.len() {
        return Vec::new();
    }
    (0..=sentence.len() - phrase.len())
        .filter(|&i| sentence[i..i + phrase.len()] == *phrase)
        .collect()
}

/// Whether `reply` dismisses the comment it answers. Quoted lines (`>`)
/// are the comment, not the reply; a question ("is this intended?") does
/// not dismiss; an agreement anywhere wins.
pub fn dismisses(reply: &str) -> bool {
    let own: String = reply
        .lines()
        .filter(|l| !l.trim_start().starts_with('>'))
        .collect::<Vec<_>>()
        .join("\n");
    let all = words(&own);
    if AGREEMENTS
        .iter()
        .any(|a| !occurrences(&all, &words(a)).is_empty())
    {
        return false;
    }
    // Sentences with their end mark: a question asks, it does not say.
    let mut sentences: Vec<(String, bool)> = Vec::new();
    let mut current = String::new();
    for c in own.chars() {
        if matches!(c, '.' | '!' | '?' | '\n' | ';') {
            sentences.push((std::mem::take(&mut current), c == '?'));
        } else {
            current.push(c);
        }
    }
    sentences.push((current, false));
    sentences
        .iter()
        .filter(|(_, question)| !question)
        .any(|(text, _)| {
            let sentence = words(text);
            DISMISSALS.iter().any(|d| {
                let phrase = words(d);
                occurrences(&sentence, &phrase).into_iter().any(|at| {
                    let before = &sentence[at.saturating_sub(2)..at];
                    !before.iter().any(|w| NEGATIONS.contains(&w.as_str()))
                })
            })
        })
}

/// A comment's text for comparing: lowercase words, single spaces.
pub fn normalized(comment: &str) -> String {
    comment
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A dismissal to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFeedback<'a> {
    pub project_id: i64,
    pub merge_request_id: i64,
    pub path: &'a str,
    pub comment: &'a str,
    pub reply: &'a str,
    pub user_id: i64,
    pub reply_note_id: i64,
}

/// Keeps `item` (once per reply note) and drops the project's oldest past
/// [`KEEP_PER_PROJECT`]; whether it was new.
pub async fn record(
    db: &impl Queries,
    item: &NewFeedback<'_>,
) -> Result<bool, tokio_postgres::Error> {
    let comment: String = item
        .comment
        .trim()
        .chars()
        .take(MAX_COMMENT_CHARS)
        .collect();
    let reply: String = item.reply.trim().chars().take(MAX_REPLY_CHARS).collect();
    let inserted = db
        .execute(
            "INSERT INTO duo_review_feedback
                 (project_id, merge_request_id, path, comment, reply, user_id, reply_note_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (reply_note_id) DO NOTHING",
            &[
                &item.project_id,
                &item.merge_request_id,
                &item.path,
                &comment,
                &reply,
                &item.user_id,
                &item.reply_note_id,
            ],
        )
        .await?;
    if inserted > 0 {
        db.execute(
            "DELETE FROM duo_review_feedback WHERE project_id = $1 AND id NOT IN (
                 SELECT id FROM duo_review_feedback WHERE project_id = $1
                 ORDER BY id DESC LIMIT $2)",
            &[&item.project_id, &KEEP_PER_PROJECT],
        )
        .await?;
    }
    Ok(inserted > 0)
}

/// One kept dismissal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feedback {
    pub path: String,
    pub comment: String,
    pub reply: String,
}

/// The project's feedback, newest first (at most [`KEEP_PER_PROJECT`]).
pub async fn for_project(
    db: &impl Queries,
    project_id: i64,
) -> Result<Vec<Feedback>, tokio_postgres::Error> {
    Ok(db
        .query(
            "SELECT path, comment, reply FROM duo_review_feedback
             WHERE project_id = $1 ORDER BY id DESC LIMIT $2",
            &[&project_id, &KEEP_PER_PROJECT],
        )
        .await?
        .iter()
        .map(|r| Feedback {
            path: r.get(0),
            comment: r.get(1),
            reply: r.get(2),
        })
        .collect())
}

/// The file name's extension (its language, near enough), if any.
fn extension(path: &str) -> Option<&str> {
    let name = path.rsplit('/').next()?;
    let (stem, ext) = name.rsplit_once('.')?;
    (!stem.is_empty() && !ext.is_empty()).then_some(ext)
}

/// The items that concern `path`: its own first, then files of the same
/// language, newest first within each, at most [`MAX_SHOWN`].
pub fn relevant<'a>(items: &'a [Feedback], path: &str) -> Vec<&'a Feedback> {
    let same_file = items.iter().filter(|f| f.path == path);
    let same_language = items.iter().filter(|f| {
        f.path != path && extension(path).is_some_and(|e| extension(&f.path) == Some(e))
    });
    same_file.chain(same_language).take(MAX_SHOWN).collect()
}

fn quote(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > QUOTE_CHARS {
        format!("{}…", flat.chars().take(QUOTE_CHARS).collect::<String>())
    } else {
        flat
    }
}

/// The prompt's text for the items ("" for none), within its size cap.
pub fn prompt_text(items: &[&Feedback]) -> String {
    let mut out = String::new();
    for item in items {
        let entry = format!(
            "- On `{}` you commented: \"{}\"\n  A developer replied: \"{}\"\n",
            item.path,
            quote(&item.comment),
            quote(&item.reply)
        );
        if out.len() + entry.len() > MAX_SHOWN_CHARS {
            break;
        }
        out.push_str(&entry);
    }
    out.trim_end().to_owned()
}

/// Whether `comment` on `path` repeats one developers dismissed there.
pub fn dismissed_before(items: &[Feedback], path: &str, comment: &str) -> bool {
    let text = normalized(comment);
    !text.is_empty()
        && items
            .iter()
            .any(|f| f.path == path && normalized(&f.comment) == text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dismissals_are_recognised() {
        for reply in [
            "false positive: this is intended",
            "This is intended.",
            "Intentional, the list is never empty here",
            "Not an issue — the caller validates.",
            "won’t fix",
            "Won't fix, legacy code.",
            "We don't do early returns here.",
            "That's fine, it's by design",
            "> dividing by len(values) fails\nThat can't happen: values is checked upstream.",
            "I disagree; the cache is per request",
        ] {
            assert!(dismisses(reply), "{reply}");
        }
    }

    #[test]
    fn agreements_questions_and_negations_are_not_dismissals() {
        for reply in [
            "Good catch, this was not intended.",
            "Is this intended?",
            "This is not intended, fixing it now",
            "Thanks! Will fix.",
            "You're right.",
            "It isn't a false positive, see the trace",
            "Could you explain why this is a problem?",
            "> This is intended behaviour?\nHmm, let me check.",
            "unintended side effect, yes",
            "",
        ] {
            assert!(!dismisses(reply), "{reply}");
        }
    }

    #[test]
    fn comments_compare_by_their_words() {
        assert_eq!(
            normalized("  Dividing by `len(values)` FAILS\nfor an empty list. "),
            "dividing by len values fails for an empty list"
        );
        let items = vec![Feedback {
            path: "app.py".into(),
            comment: "Dividing by len(values) fails for an empty list.".into(),
            reply: "intended".into(),
        }];
        assert!(dismissed_before(
            &items,
            "app.py",
            "dividing by len(values) fails for an empty list"
        ));
        assert!(!dismissed_before(
            &items,
            "lib.py",
            "Dividing by len(values) fails for an empty list."
        ));
        assert!(!dismissed_before(&items, "app.py", "Another point."));
    }

    #[test]
    fn the_same_file_comes_first_then_the_same_language() {
        let item = |path: &str, n: u32| Feedback {
            path: path.into(),
            comment: format!("comment {n}"),
            reply: "by design".into(),
        };
        let items = vec![
            item("lib/b.py", 1),
            item("app.py", 2),
            item("web/x.rs", 3),
            item("Makefile", 4),
            item("app.py", 5),
        ];
        let shown: Vec<&str> = relevant(&items, "app.py")
            .iter()
            .map(|f| f.comment.as_str())
            .collect();
        assert_eq!(shown, ["comment 2", "comment 5", "comment 1"]);
        assert!(relevant(&items, "Dockerfile").is_empty());
        let text = prompt_text(&relevant(&items, "app.py"));
        assert!(text.starts_with("- On `app.py` you commented: \"comment 2\""));
        assert!(text.contains("A developer replied: \"by design\""));
        assert_eq!(prompt_text(&[]), "");
    }
}
