//! The `web` role: HTTP server wiring. Handlers live in `api`, `graphql` and friends.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::{App, HttpResponse, HttpServer, web};
use deadpool_postgres::Pool;

use crate::add_ons::AddOnCatalogue;
use secrecy::ExposeSecret;

use crate::chat::{ChatService, CompletionQueue, PgCompletionQueue};
use crate::config::Config;
use crate::jwt::{JwtError, KeyRing, SharedKeyRing};
use crate::policy::Policy;
use crate::subscriptions::LiveHub;

#[derive(Clone)]
pub struct AppState {
    pub pool: Pool,
    pub policy: Policy,
    pub config: Arc<Config>,
    pub chat: Arc<ChatService>,
    pub keys: SharedKeyRing,
    /// Live messages for `aiCompletionResponse` subscribers on this process.
    pub live: Arc<LiveHub>,
}

impl AppState {
    /// State whose completions go to the PostgreSQL queue (run by `worker`).
    pub fn new(pool: Pool, config: Config, catalogue: AddOnCatalogue) -> Result<Self, JwtError> {
        let queue = Arc::new(PgCompletionQueue {
            max_attempts: config.completion_max_attempts,
        });
        Self::with_queue(pool, config, catalogue, queue)
    }

    pub fn with_queue(
        pool: Pool,
        config: Config,
        catalogue: AddOnCatalogue,
        queue: Arc<dyn CompletionQueue>,
    ) -> Result<Self, JwtError> {
        let keys = SharedKeyRing::new(KeyRing::load_or_create(&config.signing_key_dir)?);
        let policy = Policy::new(Arc::new(catalogue));
        let chat = Arc::new(ChatService {
            pool: pool.clone(),
            policy: policy.clone(),
            queue,
            rate_limit: config.ai_action_rate_limit,
            rate_window: config.ai_action_rate_window,
            docs_base_url: config.docs_base_url.to_string(),
        });
        let live = LiveHub::new(config.database_url.expose_secret());
        Ok(Self {
            pool,
            policy,
            config: Arc::new(config),
            chat,
            keys,
            live,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayTokenError {
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    #[error(transparent)]
    Db(#[from] deadpool_postgres::PoolError),
    #[error(transparent)]
    Jwt(#[from] JwtError),
}

impl AppState {
    /// A gateway JWT for the user, scoped to the unit primitives their seats grant.
    pub async fn gateway_token(&self, user_id: i64) -> Result<String, GatewayTokenError> {
        let db = self.pool.get().await?;
        let scopes = self.policy.seat_unit_primitives(&**db, user_id).await?;
        let realm: String = db
            .query_one("SELECT realm FROM instance_settings", &[])
            .await
            .map_err(crate::policy::PolicyError::from)?
            .get(0);
        let claims = crate::jwt::claims_for(crate::jwt::TokenSubject {
            user_id,
            scopes: scopes.iter().map(|s| s.as_str().to_owned()).collect(),
            realm: &realm,
            instance_id: &self.config.instance_id,
            issuer: self.config.external_url.as_str(),
            audience: &self.config.gateway_audience,
        });
        Ok(self.keys.sign(&claims)?)
    }
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/-/health",
        web::get().to(|| async { HttpResponse::Ok().body("GitLab OK") }),
    )
    .route(
        "/.well-known/openid-configuration",
        web::get().to(crate::api::oidc::openid_configuration),
    )
    .route(
        "/oauth/discovery/keys",
        web::get().to(crate::api::oidc::jwks),
    )
    .route("/api/graphql", web::post().to(crate::graphql::handle))
    // GET with `Upgrade: websocket` opens a subscription socket.
    .route("/api/graphql", web::get().to(crate::graphql::handle_get))
    .service(
        web::scope("/api/v4")
            .configure(crate::api::users::routes)
            .configure(crate::api::resources::routes),
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
                crate::api::path_ids::resolve_path_ids,
            ))
            .configure(configure)
    })
    .listen(listener)?
    .run();
    Ok(server)
}
