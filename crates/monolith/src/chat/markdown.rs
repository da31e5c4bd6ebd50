//! The HTML form of a chat answer (`contentHtml`).

/// Renders Markdown to HTML with everything unsafe removed.
pub fn render_markdown(content: &str) -> String {
    let parser = pulldown_cmark::Parser::new_ext(content, pulldown_cmark::Options::all());
    let mut html = String::new();
    pulldown_cmark::html::push_html(&mut html, parser);
    ammonia::clean(&html)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_is_rendered_and_sanitised() {
        let html = render_markdown("**bold** <script>alert(1)</script> [x](javascript:alert(1))");
        assert!(html.contains("<strong>bold</strong>"));
        assert!(!html.contains("<script"));
        assert!(!html.contains("javascript:"));
    }
}
