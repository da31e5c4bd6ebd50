//! Admin pages for model selection: self-hosted model definitions (create,
//! edit, delete, test the connection through the AI gateway) and, per AI
//! feature, which model serves it: the gateway's default, a self-hosted model,
//! or none (off). An API key goes in and is never shown again: pages say only
//! whether one is set.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};
use serde::Deserialize;

use super::PageError;
use super::admin_frame::{
    Flash, NoticeQuery, admin_page, admin_session, back_to, check_form_token, hidden_token,
};
use crate::ai_models::{
    ACCEPTED_MODELS, Feature, FeatureSetting, ModelInput, ModelsError, Provider, SelfHostedModel,
};
use crate::app_state::AppState;
use crate::gateway_client::{GatewayAuth, GatewayClient, GatewaySettings, ModelCheck};
use crate::identity::sessions::SessionUser;

const MODELS: &str = "/admin/ai/duo_self_hosted";
const FEATURES: &str = "/admin/ai/duo_self_hosted/features";
/// The longest a connection test waits for the model.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(MODELS, web::get().to(list))
        .route(MODELS, web::post().to(create))
        .route("/admin/ai/duo_self_hosted/new", web::get().to(new_form))
        .route(FEATURES, web::get().to(features_page))
        .route(FEATURES, web::post().to(update_features))
        .route(
            "/admin/ai/duo_self_hosted/{id}/edit",
            web::get().to(edit_form),
        )
        .route("/admin/ai/duo_self_hosted/{id}", web::post().to(update))
        .route(
            "/admin/ai/duo_self_hosted/{id}/delete",
            web::post().to(delete),
        )
        .route(
            "/admin/ai/duo_self_hosted/{id}/test",
            web::post().to(test_connection),
        );
}

impl From<ModelsError> for PageError {
    fn from(e: ModelsError) -> Self {
        match e {
            ModelsError::NotFound => PageError::NotFound,
            other => PageError::Internal(other.to_string()),
        }
    }
}

fn parse_id(text: &str) -> Result<i64, PageError> {
    text.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or(PageError::NotFound)
}

// ---- the list ---------------------------------------------------------------------

async fn list_response(
    state: &AppState,
    session: &SessionUser,
    status: StatusCode,
    flash: &Flash,
) -> Result<HttpResponse, PageError> {
    let db = state.pool.get().await?;
    let models = state.models.list_models(&*db).await?;
    let settings = state.models.feature_settings(&*db).await?;
    let body = html! {
        p class="hint" {
            "Models your organisation runs itself (vLLM, Ollama, a cloud provider's endpoint, ...). "
            "The AI gateway calls them on the instance's behalf; choose which feature uses which model under "
            a href=(FEATURES) { "AI features" } "."
        }
        p { a class="button primary" href="/admin/ai/duo_self_hosted/new" id="new-model" { "Add self-hosted model" } }
        table class="admin-table" id="models" {
            thead { tr { th { "Name" } th { "Model family" } th { "Endpoint" } th { "Identifier" } th { "API key" } th { "Used by" } th { "Actions" } } }
            tbody {
                @for m in &models {
                    @let used: Vec<&str> = settings.iter()
                        .filter(|s| s.self_hosted_model.as_ref().is_some_and(|x| x.id == m.id))
                        .map(|s| s.feature.title()).collect();
                    tr data-model=(m.name) {
                        td { strong { (m.name) } }
                        td { code { (m.model) } }
                        td { code class="wrap" { (m.endpoint) } }
                        td { @if let Some(i) = &m.identifier { code { (i) } } @else { span class="muted" { "none" } } }
                        td { @if m.has_api_token { span class="badge opened" { "set" } } @else { span class="badge" { "not set" } } }
                        td { @if used.is_empty() { span class="muted" { "no feature" } } @else { (used.join(", ")) } }
                        td class="actions" {
                            a class="button small" href={ (MODELS) "/" (m.id) "/edit" } { "Edit" }
                            form method="post" action={ (MODELS) "/" (m.id) "/test" } class="inline" {
                                (hidden_token(session))
                                button type="submit" class="small test-connection" { "Test connection" }
                            }
                            form method="post" action={ (MODELS) "/" (m.id) "/delete" } class="inline" {
                                (hidden_token(session))
                                button type="submit" class="small danger" aria-label={ "Delete " (m.name) } { "Delete" }
                            }
                        }
                    }
                }
                @if models.is_empty() { tr { td colspan="7" class="muted" { "No self-hosted models yet." } } }
            }
        }
    };
    Ok(admin_page(
        session,
        status,
        MODELS,
        "Self-hosted models",
        flash,
        body,
    ))
}

async fn list(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<NoticeQuery>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    list_response(&state, &session, StatusCode::OK, &query.flash()).await
}

// ---- the form ---------------------------------------------------------------------

#[derive(Deserialize, Default)]
struct ModelForm {
    #[serde(default)]
    authenticity_token: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    endpoint: String,
    #[serde(default)]
    identifier: String,
    #[serde(default)]
    api_token: String,
    remove_api_token: Option<String>,
}

/// What the form shows: the stored model, or what was entered.
struct FormState<'a> {
    /// `Some` when editing.
    id: Option<i64>,
    name: &'a str,
    model: &'a str,
    endpoint: &'a str,
    identifier: &'a str,
    has_api_token: bool,
    /// A key was entered with a refused form: it is not shown again.
    key_dropped: bool,
}

fn model_form(session: &SessionUser, f: &FormState<'_>) -> Markup {
    let action = match f.id {
        Some(id) => format!("{MODELS}/{id}"),
        None => MODELS.to_owned(),
    };
    html! {
        form method="post" action=(action) class="stack admin-form" id="model-form" autocomplete="off" {
            (hidden_token(session))
            label for="name" { "Name" }
            input id="name" name="name" required maxlength="255" value=(f.name) placeholder="team-mistral";
            label for="model" { "Model family" }
            select id="model" name="model" required {
                option value="" disabled selected[f.model.is_empty()] { "Choose a model family" }
                @for family in ACCEPTED_MODELS {
                    option value=(family) selected[*family == f.model] { (family) }
                }
            }
            p class="hint" { "The family picks the prompts written for it; models served OpenAI-compatibly work with any family." }
            label for="endpoint" { "Endpoint" }
            input id="endpoint" name="endpoint" type="url" required maxlength="255" value=(f.endpoint)
                placeholder="http://vllm.internal:8000/v1";
            label for="identifier" { "Model identifier (optional)" }
            input id="identifier" name="identifier" maxlength="255" value=(f.identifier)
                placeholder="custom_openai/mistral-7b-instruct";
            p class="hint" { "As the provider names the model, e.g. " code { "custom_openai/mistral-7b-instruct" } " or " code { "bedrock/..." } "." }
            label for="api_token" { "API key" }
            // Never filled in: a stored key is not shown again.
            input id="api_token" name="api_token" type="password" maxlength="255" value=""
                autocomplete="new-password" aria-describedby="api_token_hint";
            p class="hint" id="api_token_hint" {
                @if f.id.is_some() {
                    "Currently " strong { (if f.has_api_token { "set" } else { "not set" }) } ". Leave empty to keep it; changing the endpoint, or a family served by another provider, removes it unless you enter it again."
                } @else {
                    "Stored encrypted and never shown again."
                }
                @if f.key_dropped { " " strong { "The key you entered was not kept: enter it again." } }
            }
            @if f.id.is_some() && f.has_api_token {
                label class="check" {
                    input type="checkbox" name="remove_api_token" value="1";
                    " Remove the stored API key"
                }
            }
            div {
                button type="submit" class="primary" { (if f.id.is_some() { "Save changes" } else { "Create self-hosted model" }) }
                " " a href=(MODELS) { "Cancel" }
            }
        }
    }
}

fn form_response(
    session: &SessionUser,
    status: StatusCode,
    flash: &Flash,
    f: &FormState<'_>,
) -> HttpResponse {
    let title = if f.id.is_some() {
        "Edit self-hosted model"
    } else {
        "Add self-hosted model"
    };
    admin_page(
        session,
        status,
        MODELS,
        title,
        flash,
        model_form(session, f),
    )
}

async fn new_form(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    Ok(form_response(
        &session,
        StatusCode::OK,
        &Flash::default(),
        &FormState {
            id: None,
            name: "",
            model: "",
            endpoint: "",
            identifier: "",
            has_api_token: false,
            key_dropped: false,
        },
    ))
}

async fn edit_form(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    let id = parse_id(&path)?;
    let db = state.pool.get().await?;
    let m = state.models.model(&*db, id).await?;
    Ok(form_response(
        &session,
        StatusCode::OK,
        &Flash::default(),
        &FormState {
            id: Some(id),
            name: &m.name,
            model: &m.model,
            endpoint: &m.endpoint,
            identifier: m.identifier.as_deref().unwrap_or(""),
            has_api_token: m.has_api_token,
            key_dropped: false,
        },
    ))
}

/// The refused form again, with what was entered (but the key).
fn refused(
    session: &SessionUser,
    form: &ModelForm,
    id: Option<i64>,
    has_api_token: bool,
    why: String,
) -> HttpResponse {
    form_response(
        session,
        StatusCode::UNPROCESSABLE_ENTITY,
        &Flash::error(why),
        &FormState {
            id,
            name: &form.name,
            model: &form.model,
            endpoint: form.endpoint.trim(),
            identifier: form.identifier.trim(),
            has_api_token,
            key_dropped: !form.api_token.is_empty(),
        },
    )
}

fn model_input(form: &ModelForm, editing: bool) -> ModelInput {
    let api_token = if editing && form.remove_api_token.is_some() {
        Some(String::new())
    } else if form.api_token.is_empty() {
        None
    } else {
        Some(form.api_token.clone())
    };
    ModelInput {
        name: form.name.clone(),
        model: form.model.clone(),
        endpoint: form.endpoint.trim().to_owned(),
        identifier: Some(form.identifier.trim().to_owned()),
        api_token,
    }
}

async fn create(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<ModelForm>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    check_form_token(&session, &form.authenticity_token)?;
    let db = state.pool.get().await?;
    match state
        .models
        .create_model(&*db, &model_input(&form, false))
        .await
    {
        Ok(_) => Ok(back_to(MODELS, "created")),
        Err(ModelsError::Invalid(why)) => Ok(refused(&session, &form, None, false, why)),
        Err(e) => Err(e.into()),
    }
}

async fn update(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    form: web::Form<ModelForm>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    check_form_token(&session, &form.authenticity_token)?;
    let id = parse_id(&path)?;
    let db = state.pool.get().await?;
    let current = state.models.model(&*db, id).await?;
    match state
        .models
        .update_model(&*db, id, &model_input(&form, true))
        .await
    {
        Ok(_) => Ok(back_to(MODELS, "updated")),
        Err(ModelsError::Invalid(why)) => Ok(refused(
            &session,
            &form,
            Some(id),
            current.has_api_token,
            why,
        )),
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize)]
struct TokenForm {
    #[serde(default)]
    authenticity_token: String,
}

async fn delete(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    check_form_token(&session, &form.authenticity_token)?;
    let id = parse_id(&path)?;
    let db = state.pool.get().await?;
    let outcome = state.models.delete_model(&*db, id).await;
    drop(db);
    match outcome {
        Ok(_) => Ok(back_to(MODELS, "deleted")),
        Err(ModelsError::InUse(features)) => {
            list_response(
                &state,
                &session,
                StatusCode::CONFLICT,
                &Flash::error(format!(
                    "This model is still selected for: {features}. Choose another model for them under AI features first."
                )),
            )
            .await
        }
        Err(e) => Err(e.into()),
    }
}

// ---- test connection --------------------------------------------------------------

/// A gateway client for the web role (the worker keeps its own).
fn gateway(state: &AppState) -> Result<GatewayClient, PageError> {
    let settings = GatewaySettings {
        timeout: state.config.ai_gateway_timeout.min(CHECK_TIMEOUT),
        ..GatewaySettings::from_config(&state.config)
    };
    GatewayClient::with_shared_keys(state.keys.clone(), settings)
        .map_err(|e| PageError::Internal(e.to_string()))
}

async fn test_connection(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    check_form_token(&session, &form.authenticity_token)?;
    let id = parse_id(&path)?;
    let db = state.pool.get().await?;
    let model = state.models.model(&*db, id).await?;
    let metadata = state.models.metadata_of(&*db, id).await?;
    let (realm, gateway_url) = crate::gateway_client::instance_route(&*db).await?;
    drop(db);
    // The check is the instance's, as GitLab's: its token carries only the
    // unit primitive of the prompt it runs.
    let auth = GatewayAuth {
        user_id: session.user.id,
        scopes: vec![contracts::UnitPrimitive::ExplainCode.as_str().to_owned()],
        realm,
        request_id: uuid::Uuid::new_v4(),
        gateway_url,
    };
    let started = Instant::now();
    let outcome = gateway(&state)?.check_model(&auth, &metadata).await;
    let elapsed = started.elapsed().as_millis();
    // A provider's error could quote the key back; it never reaches the page.
    let redact = |text: String| match metadata.api_key.as_deref() {
        Some(key) if !key.is_empty() => text.replace(key, "[API key]"),
        _ => text,
    };
    let flash = match outcome {
        Ok(ModelCheck::Answered(answer)) => Flash::notice(format!(
            "Connection to {} works: the model answered through the AI gateway in {elapsed} ms: “{}”",
            model.name,
            redact(answer)
        )),
        Ok(ModelCheck::Refused { status, detail }) => Flash::error(format!(
            "Connection to {} failed: the AI gateway answered HTTP {status}: {}",
            model.name,
            redact(detail)
        )),
        Err(e) => Flash::error(format!(
            "Connection to {} failed: {}",
            model.name,
            redact(e.to_string())
        )),
    };
    list_response(&state, &session, StatusCode::OK, &flash).await
}

// ---- per-feature model selection ---------------------------------------------------

/// The form value of a setting: `vendored`, `disabled` or `self_hosted:<id>`.
fn choice_value(setting: &FeatureSetting) -> String {
    match (setting.provider, &setting.self_hosted_model) {
        (Provider::SelfHosted, Some(m)) => format!("self_hosted:{}", m.id),
        (Provider::Disabled, _) | (Provider::SelfHosted, None) => "disabled".into(),
        (Provider::Vendored, _) => "vendored".into(),
    }
}

fn parse_choice(value: &str) -> Option<(Provider, Option<i64>)> {
    match value {
        "vendored" => Some((Provider::Vendored, None)),
        "disabled" => Some((Provider::Disabled, None)),
        other => {
            let id = other.strip_prefix("self_hosted:")?.parse::<i64>().ok()?;
            Some((Provider::SelfHosted, Some(id)))
        }
    }
}

fn features_body(
    session: &SessionUser,
    settings: &[FeatureSetting],
    models: &[SelfHostedModel],
    chosen: &HashMap<String, String>,
) -> Markup {
    let groups = ["Duo Chat", "Codebase search", "Duo Agent Platform"];
    html! {
        p class="hint" {
            "For each feature: the AI gateway's default model, one of your "
            a href=(MODELS) { "self-hosted models" } ", or off (the feature is refused)."
        }
        form method="post" action=(FEATURES) class="admin-form" id="feature-settings" {
            (hidden_token(session))
            @for group in groups {
                fieldset {
                    legend { (group) }
                    @for s in settings.iter().filter(|s| s.feature.main_feature() == group) {
                        @let key = s.feature.key();
                        @let current = chosen.get(key).cloned().unwrap_or_else(|| choice_value(s));
                        div class="feature-row" {
                            label for={ "feature-" (key) } { (s.feature.title()) }
                            select id={ "feature-" (key) } name=(key) {
                                option value="vendored" selected[current == "vendored"] { "AI gateway default model" }
                                @for m in models {
                                    @let value = format!("self_hosted:{}", m.id);
                                    option value=(value) selected[current == value] { "Self-hosted: " (m.name) " (" (m.model) ")" }
                                }
                                option value="disabled" selected[current == "disabled"] { "Off" }
                            }
                        }
                    }
                }
            }
            div { button type="submit" class="primary" { "Save model selection" } }
        }
    }
}

async fn features_response(
    state: &AppState,
    session: &SessionUser,
    status: StatusCode,
    flash: &Flash,
    chosen: &HashMap<String, String>,
) -> Result<HttpResponse, PageError> {
    let db = state.pool.get().await?;
    let settings = state.models.feature_settings(&*db).await?;
    let models = state.models.list_models(&*db).await?;
    Ok(admin_page(
        session,
        status,
        FEATURES,
        "AI features: model selection",
        flash,
        features_body(session, &settings, &models, chosen),
    ))
}

async fn features_page(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<NoticeQuery>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    features_response(
        &state,
        &session,
        StatusCode::OK,
        &query.flash(),
        &HashMap::new(),
    )
    .await
}

async fn update_features(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<HashMap<String, String>>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    let form = form.into_inner();
    check_form_token(
        &session,
        form.get("authenticity_token").map_or("", String::as_str),
    )?;
    let mut changes = Vec::new();
    let mut problem = None;
    for feature in Feature::ALL {
        let Some(value) = form.get(feature.key()) else {
            continue;
        };
        match parse_choice(value) {
            Some((provider, model)) => changes.push((feature, provider, model)),
            None => {
                problem = Some(format!(
                    "{}: choose the default model, a self-hosted model or off.",
                    feature.title()
                ));
                break;
            }
        }
    }
    if problem.is_none() && changes.is_empty() {
        problem = Some("Nothing to save: choose a model for at least one feature.".into());
    }
    if problem.is_none() {
        let mut db = state.pool.get().await?;
        let tx = db.transaction().await?;
        for (feature, provider, model) in &changes {
            match state
                .models
                .update_features(&tx, &[*feature], *provider, *model)
                .await
            {
                Ok(()) => {}
                Err(ModelsError::NotFound) => {
                    problem = Some(format!(
                        "{}: that self-hosted model no longer exists.",
                        feature.title()
                    ));
                    break;
                }
                Err(ModelsError::Invalid(why)) => {
                    problem = Some(format!("{}: {why}", feature.title()));
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if problem.is_none() {
            tx.commit().await?;
            return Ok(back_to(FEATURES, "features"));
        }
    }
    // Nothing was saved: the page again, with every choice as entered.
    features_response(
        &state,
        &session,
        StatusCode::UNPROCESSABLE_ENTITY,
        &Flash::error(problem.unwrap_or_default()),
        &form,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_back_to_their_values() {
        assert_eq!(parse_choice("vendored"), Some((Provider::Vendored, None)));
        assert_eq!(parse_choice("disabled"), Some((Provider::Disabled, None)));
        assert_eq!(
            parse_choice("self_hosted:7"),
            Some((Provider::SelfHosted, Some(7)))
        );
        assert_eq!(parse_choice("self_hosted:x"), None);
        assert_eq!(parse_choice("gpt"), None);
    }
}
