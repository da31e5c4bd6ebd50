//! The `web` role's HTTP server: routes and server settings. Handlers live in
//! `rest` and `graphql`; this module only wires them.

use std::net::TcpListener;

use actix_web::{App, HttpResponse, HttpServer, web};

use crate::app_state::AppState;
use crate::probes::{ProbeState, Role};

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
    .configure(oauth_routes)
    .configure(crate::probes::routes)
    .route("/api/graphql", web::post().to(crate::graphql::handle))
    // GET with `Upgrade: websocket` opens a subscription socket.
    .route("/api/graphql", web::get().to(crate::graphql::handle_get))
    .service(
        web::scope("/api/v4")
            .configure(crate::rest::routes::api_v4)
            // GitLab's answer to a route that does not exist.
            .default_service(web::to(|| async {
                HttpResponse::NotFound().json(serde_json::json!({ "error": "404 Not Found" }))
            })),
    )
    // Git's smart HTTP (`/<namespace>/<project>.git/...`), before the pages.
    .configure(crate::git_http::routes)
    .configure(crate::web::routes)
    // Any other path may be a project's page: matched last.
    .configure(crate::web::resources::project_route);
}

/// Serves on an already bound listener (tests bind port 0). The server ignores
/// signals: the `web` role stops it through [`stop_gracefully`] so that
/// readiness turns false and sockets are handed off first.
pub fn serve(state: AppState, listener: TcpListener) -> std::io::Result<actix_web::dev::Server> {
    let probes = web::Data::new(ProbeState::new(
        state.pool.clone(),
        state.config.clone(),
        state.lifecycle.clone(),
        Role::Web,
    ));
    let grace = state.config.shutdown_grace;
    let data = web::Data::new(state);
    let schema = web::Data::new(crate::graphql::schema());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(probes.clone())
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
            // Outermost: one server span per request, continuing the caller's trace.
            .wrap(actix_web::middleware::from_fn(
                duo_telemetry::trace_requests,
            ))
            .configure(configure)
    })
    .on_connect(tcp_nodelay)
    .disable_signals()
    .shutdown_timeout(grace.as_secs())
    .listen(listener)?
    .run();
    Ok(server)
}

/// `HttpServer::on_connect` hook turning Nagle's algorithm off: it held a
/// response's last small write (the end of a chunked body: a streamed answer,
/// git's pack) until the client's delayed ACK, about 40 ms on every such
/// response.
pub fn tcp_nodelay(connection: &dyn std::any::Any, _: &mut actix_web::dev::Extensions) {
    if let Some(tcp) = connection.downcast_ref::<actix_web::rt::net::TcpStream>()
        && let Err(e) = tcp.set_nodelay(true)
    {
        tracing::debug!(error = %e, "TCP_NODELAY could not be set");
    }
}

/// The `web` role's stop: report "not ready" (and tell subscription sockets to
/// reconnect elsewhere), keep serving for the drain period so load balancers
/// notice, then stop accepting and let in-flight requests finish within the
/// grace period.
pub async fn stop_gracefully(state: &AppState, server: &actix_web::dev::ServerHandle) {
    state.lifecycle.begin_stopping();
    tracing::info!(
        drain_secs = state.config.shutdown_drain.as_secs(),
        grace_secs = state.config.shutdown_grace.as_secs(),
        "stopping: not ready any more"
    );
    tokio::time::sleep(state.config.shutdown_drain).await;
    server.stop(true).await;
}

/// OAuth for MCP clients (`rest::oauth_server`), at the instance's root.
fn oauth_routes(cfg: &mut web::ServiceConfig) {
    use crate::rest::oauth_server::{
        authorization_server, protected_resource, register, revoke, token,
    };
    cfg.route(
        crate::rest::mcp::RESOURCE_METADATA_PATH,
        web::get().to(protected_resource),
    )
    // Some clients look for the resource's metadata at the root.
    .route(
        "/.well-known/oauth-protected-resource",
        web::get().to(protected_resource),
    )
    .route(
        "/.well-known/oauth-authorization-server",
        web::get().to(authorization_server),
    )
    .service(
        web::resource("/oauth/register")
            .app_data(web::JsonConfig::default().limit(16 * 1024))
            .route(web::post().to(register)),
    )
    .service(
        web::resource("/oauth/token")
            .app_data(web::FormConfig::default().limit(16 * 1024))
            .route(web::post().to(token)),
    )
    .service(
        web::resource("/oauth/revoke")
            .app_data(web::FormConfig::default().limit(16 * 1024))
            .route(web::post().to(revoke)),
    );
}
