//! GitLab's offset pagination: `page` / `per_page` parameters and the `X-*` and
//! `Link` headers.

use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder};
use serde::Deserialize;
use serde_json::Value;

pub const DEFAULT_PER_PAGE: usize = 20;
pub const MAX_PER_PAGE: usize = 100;

/// One page of an already filtered list, with GitLab's pagination headers.
pub(super) fn paged(req: &HttpRequest, params: PageParams, items: Vec<Value>) -> HttpResponse {
    let page = params.resolve();
    let total = items.len();
    let mut builder = HttpResponse::Ok();
    page.headers(&mut builder, req, total);
    builder.json(page.slice(items))
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct PageParams {
    pub page: Option<usize>,
    pub per_page: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub page: usize,
    pub per_page: usize,
}

impl PageParams {
    /// The page parameters of a list's own query parameters.
    pub fn new(page: Option<usize>, per_page: Option<usize>) -> Self {
        PageParams { page, per_page }
    }

    pub fn resolve(self) -> Page {
        Page {
            page: self.page.filter(|p| *p > 0).unwrap_or(1),
            per_page: self
                .per_page
                .filter(|p| *p > 0)
                .unwrap_or(DEFAULT_PER_PAGE)
                .min(MAX_PER_PAGE),
        }
    }
}

impl Page {
    /// Cuts one page out of an already filtered list.
    pub fn slice<T>(&self, items: Vec<T>) -> Vec<T> {
        let start = (self.page - 1).saturating_mul(self.per_page);
        items.into_iter().skip(start).take(self.per_page).collect()
    }

    pub fn headers(&self, builder: &mut HttpResponseBuilder, req: &HttpRequest, total: usize) {
        let total_pages = total.div_ceil(self.per_page).max(1);
        builder.insert_header(("X-Page", self.page.to_string()));
        builder.insert_header(("X-Per-Page", self.per_page.to_string()));
        builder.insert_header(("X-Total", total.to_string()));
        builder.insert_header(("X-Total-Pages", total_pages.to_string()));
        let next = (self.page < total_pages).then(|| self.page + 1);
        let prev = (self.page > 1).then(|| self.page - 1);
        builder.insert_header((
            "X-Next-Page",
            next.map(|n| n.to_string()).unwrap_or_default(),
        ));
        builder.insert_header((
            "X-Prev-Page",
            prev.map(|n| n.to_string()).unwrap_or_default(),
        ));
        let link = |page: usize, rel: &str| {
            let info = req.connection_info();
            let mut query: Vec<(String, String)> =
                url::form_urlencoded::parse(req.query_string().as_bytes())
                    .filter(|(k, _)| k != "page" && k != "per_page")
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect();
            query.push(("page".into(), page.to_string()));
            query.push(("per_page".into(), self.per_page.to_string()));
            let qs = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(query)
                .finish();
            format!(
                "<{}://{}{}?{qs}>; rel=\"{rel}\"",
                info.scheme(),
                info.host(),
                req.path()
            )
        };
        let mut links = Vec::new();
        if let Some(p) = prev {
            links.push(link(p, "prev"));
        }
        if let Some(n) = next {
            links.push(link(n, "next"));
        }
        links.push(link(1, "first"));
        links.push(link(total_pages, "last"));
        builder.insert_header(("Link", links.join(", ")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bounds() {
        let p = PageParams {
            page: None,
            per_page: None,
        }
        .resolve();
        assert_eq!(
            p,
            Page {
                page: 1,
                per_page: 20
            }
        );
        let p = PageParams {
            page: Some(0),
            per_page: Some(1000),
        }
        .resolve();
        assert_eq!(
            p,
            Page {
                page: 1,
                per_page: 100
            }
        );
        let p = Page {
            page: 2,
            per_page: 2,
        };
        assert_eq!(p.slice(vec![1, 2, 3, 4, 5]), vec![3, 4]);
    }
}
