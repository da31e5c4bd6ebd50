//! The `web` role's HTTP server: routes and server settings. Handlers live in
//! `rest` and `graphql`; this module only wires them.

use std::net::TcpListener;

use actix_web::{App, HttpResponse, HttpServer, web};

use crate::app_state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/-/health",
        web::get().to(|| async { HttpResponse::Ok().body("GitLab OK") }),
    )
    .route(
        "/.well-known/openid-configuration",
        web::get().to(crate::rest::oidc::openid_configuration),
    )
    .route(
        "/oauth/discovery/keys",
        web::get().to(crate::rest::oidc::jwks),
    )
    .route("/api/graphql", web::post().to(crate::graphql::handle))
    // GET with `Upgrade: websocket` opens a subscription socket.
    .route("/api/graphql", web::get().to(crate::graphql::handle_get))
    .service(
        web::scope("/api/v4")
            .configure(crate::rest::users::routes)
            .configure(crate::rest::resources::routes),
    );
}

/// Serves on an already bound listener (tests bind port 0).
pub fn serve(state: AppState, listener: TcpListener) -> std::io::Result<actix_web::dev::Server> {
    let data = web::Data::new(state);
    let schema = web::Data::new(crate::graphql::schema());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(schema.clone())
            .app_data(web::PayloadConfig::default().limit(8 * 1024 * 1024))
            .app_data(
                web::JsonConfig::default()
                    .limit(4 * 1024 * 1024)
                    .error_handler(|err, _req| {
                        let message = err.to_string();
                        actix_web::error::InternalError::from_response(
                            err,
                            HttpResponse::BadRequest()
                                .json(serde_json::json!({ "error": message })),
                        )
                        .into()
                    }),
            )
            .wrap(actix_web::middleware::from_fn(
                crate::rest::path_ids::resolve_path_ids,
            ))
            // Registered last, so it runs first: nothing with a NUL reaches the
            // path lookup above or any handler.
            .wrap(actix_web::middleware::from_fn(
                crate::rest::input_guard::reject_nul,
            ))
            .configure(configure)
    })
    .listen(listener)?
    .run();
    Ok(server)
}
