//! Splits a Markdown page into the sections the documentation search returns:
//! one per `## ` heading, plus the text before the first one.

/// One searchable piece of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The page's `# ` title, or its file name when it has none.
    pub page_title: String,
    /// The `## ` heading; the page title for the text before the first one.
    pub heading: String,
    /// The anchor a Markdown renderer gives the heading; empty for the
    /// text before the first heading (a link to the page itself).
    pub anchor: String,
    /// The section's Markdown, heading line included.
    pub text: String,
}

/// Cuts `markdown` into sections. Headings inside fenced code blocks are not
/// headings. Sections with no text besides their heading are dropped.
pub fn split_sections(markdown: &str, fallback_title: &str) -> Vec<Section> {
    let page_title = page_title(markdown).unwrap_or_else(|| fallback_title.to_owned());
    let mut sections = Vec::new();
    let mut heading: Option<String> = None;
    let mut text = String::new();
    let mut in_fence = false;

    for line in markdown.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_fence = !in_fence;
        }
        if !in_fence && let Some(title) = line.strip_prefix("## ") {
            push_section(&mut sections, &page_title, heading.take(), &text);
            text.clear();
            heading = Some(title.trim().to_owned());
        }
        text.push_str(line);
        text.push('\n');
    }
    push_section(&mut sections, &page_title, heading, &text);
    sections
}

fn push_section(
    sections: &mut Vec<Section>,
    page_title: &str,
    heading: Option<String>,
    text: &str,
) {
    let body_lines = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("# ") && !l.starts_with("## "))
        .count();
    if body_lines == 0 {
        return;
    }
    let (heading, anchor) = match heading {
        Some(h) => {
            let anchor = anchor_for(&h);
            (h, anchor)
        }
        None => (page_title.to_owned(), String::new()),
    };
    sections.push(Section {
        page_title: page_title.to_owned(),
        heading,
        anchor,
        text: text.trim().to_owned(),
    });
}

fn page_title(markdown: &str) -> Option<String> {
    markdown
        .lines()
        .find_map(|l| l.strip_prefix("# "))
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
}

/// The anchor GitHub-style renderers derive from a heading: lower case,
/// punctuation other than `-` and `_` dropped, spaces turned into `-`.
pub fn anchor_for(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_follow_the_renderer() {
        assert_eq!(anchor_for("Error A1000"), "error-a1000");
        assert_eq!(
            anchor_for("`POST /v1/prompts/{prompt_id}`"),
            "post-v1promptsprompt_id"
        );
        assert_eq!(
            anchor_for("Choosing a family and a version"),
            "choosing-a-family-and-a-version"
        );
    }

    #[test]
    fn splits_on_level_two_headings_outside_code() {
        let page = "# Guide\n\nIntro text.\n\n## First\nOne.\n### Detail\nMore.\n\n```md\n## not a heading\n```\n## Empty\n\n## Last\nTwo.\n";
        let sections = split_sections(page, "guide");
        let headings: Vec<_> = sections
            .iter()
            .map(|s| (s.heading.as_str(), s.anchor.as_str()))
            .collect();
        assert_eq!(
            headings,
            [("Guide", ""), ("First", "first"), ("Last", "last")]
        );
        assert!(sections[1].text.contains("### Detail\nMore."));
        assert!(sections[1].text.contains("## not a heading"));
        assert!(sections.iter().all(|s| s.page_title == "Guide"));
    }

    #[test]
    fn a_page_without_title_uses_the_file_name() {
        let sections = split_sections("Just text.\n", "notes");
        assert_eq!(sections[0].page_title, "notes");
        assert_eq!(sections[0].heading, "notes");
    }
}
