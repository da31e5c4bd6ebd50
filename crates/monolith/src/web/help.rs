//! `/help/error-codes`: what each Duo error code means and what to do, from
//! `docs/error-codes.md` (embedded), so the link in an error answer works on an
//! instance without internet access.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{PreEscaped, html};

use super::PageError;
use super::layout::{self, Page};
use crate::app_state::AppState;

const ERROR_CODES_MD: &str = include_str!("../../../../docs/error-codes.md");

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/help/error-codes", web::get().to(error_codes));
}

async fn error_codes(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, PageError> {
    let session = super::maybe_signed_in(&state, &req).await?;
    // Our own document, rendered and still sanitised (ammonia keeps ids off, so
    // anchors are added per code heading below).
    let html = crate::chat::render_markdown(ERROR_CODES_MD);
    let markup = layout::render(
        Page {
            title: "Duo error codes",
            session: session.as_ref(),
            scripts: &[],
            data: serde_json::Value::Null,
        },
        html! { article class="card prose" { (PreEscaped(add_code_anchors(&html))) } },
    );
    Ok(layout::html_response(StatusCode::OK, markup))
}

/// Gives each heading that names an error code (`<h3>A1000...`) an id, so
/// `/help/error-codes#a1000` jumps to it.
fn add_code_anchors(html: &str) -> String {
    let mut out = String::with_capacity(html.len() + 256);
    let mut rest = html;
    while let Some(i) = rest.find("<h") {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let level = rest.as_bytes().get(2).copied();
        let open_end = rest.find('>').map(|e| e + 1).unwrap_or(rest.len());
        let after = &rest[open_end..];
        let after = after.strip_prefix("Error ").unwrap_or(after);
        let code: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let is_code = matches!(level, Some(b'2'..=b'4'))
            && code.len() == 5
            && code.starts_with(['A', 'M', 'G'])
            && code[1..].chars().all(|c| c.is_ascii_digit());
        if is_code && open_end == 4 {
            out.push_str(&format!(
                "<h{} id=\"{}\">",
                level.map(char::from).unwrap_or('3'),
                code.to_lowercase()
            ));
        } else {
            out.push_str(&rest[..open_end]);
        }
        rest = &rest[open_end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_headings_get_anchors() {
        let html = add_code_anchors(
            "<h2>Codes</h2><h3>A1000 timeout</h3><p>x</p><h3>M3004</h3><h2>Error M2000</h2>",
        );
        assert!(html.contains("<h2 id=\"m2000\">Error M2000</h2>"), "{html}");
        assert!(
            html.contains("<h3 id=\"a1000\">A1000 timeout</h3>"),
            "{html}"
        );
        assert!(html.contains("<h3 id=\"m3004\">M3004</h3>"), "{html}");
        assert!(html.contains("<h2>Codes</h2>"));
    }
}
