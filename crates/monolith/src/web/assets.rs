//! CSS and JavaScript embedded in the binary (no CDN, works offline), served
//! under URLs that carry a hash of their content so browsers may cache them
//! for good: a new release has new URLs.

use std::collections::HashMap;
use std::sync::LazyLock;

use actix_web::{HttpResponse, web};
use sha2::{Digest, Sha256};

/// Every asset: name, content type, content.
const FILES: &[(&str, &str, &str)] = &[
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../assets/app.css"),
    ),
    (
        "chat.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/chat.js"),
    ),
    (
        "graphql.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/graphql.js"),
    ),
    (
        "graphql_explorer.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/graphql_explorer.js"),
    ),
    (
        "markdown.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/markdown.js"),
    ),
    (
        "workflow.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/workflow.js"),
    ),
];

struct Asset {
    content_type: &'static str,
    body: &'static str,
    url: String,
}

/// Assets by name, each with its hashed URL.
static ASSETS: LazyLock<HashMap<&'static str, Asset>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|(name, content_type, body)| {
            let hash = hex::encode(&Sha256::digest(body.as_bytes())[..6]);
            let (stem, ext) = name.rsplit_once('.').unwrap_or((name, ""));
            (
                *name,
                Asset {
                    content_type,
                    body,
                    url: format!("/assets/{stem}-{hash}.{ext}"),
                },
            )
        })
        .collect()
});

/// The URL of an asset (by its plain name).
pub fn url(name: &str) -> String {
    ASSETS
        .get(name)
        .map(|a| a.url.clone())
        .unwrap_or_else(|| format!("/assets/{name}"))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/assets/{file}", web::get().to(serve));
}

async fn serve(file: web::Path<String>) -> HttpResponse {
    let wanted = format!("/assets/{}", file.into_inner());
    // Scripts import each other by plain name (`./graphql.js`): serve those too,
    // but without the long cache.
    let plain = wanted.trim_start_matches("/assets/");
    let found = ASSETS
        .values()
        .find(|a| a.url == wanted)
        .map(|a| (a, true))
        .or_else(|| ASSETS.get(plain).map(|a| (a, false)));
    match found {
        Some((asset, hashed)) => HttpResponse::Ok()
            .content_type(asset.content_type)
            .insert_header(("X-Content-Type-Options", "nosniff"))
            .insert_header((
                "Cache-Control",
                if hashed {
                    "public, max-age=31536000, immutable"
                } else {
                    "no-cache"
                },
            ))
            .body(asset.body),
        None => HttpResponse::NotFound().finish(),
    }
}
