//! Loading prompt definitions from disk and resolving them by id, model
//! family and version constraint.

use super::schema::{ModelConfig, PromptFile, PromptParams, TemplateRole};
use super::version::VersionConstraint;
use super::{PromptError, PromptLoadError};
use crate::config::ProvidersConfig;
use crate::providers::{
    ChatMessage, ChatRole, CustomModel, EndpointGuard, ModelCall, ModelParams, ModelTarget,
    ProviderKind,
};
use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior, Value};
use semver::Version;
use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path};
use std::sync::Arc;
use std::time::Duration;

/// Every prompt definition found under the prompts directory, with its
/// templates compiled once at start-up.
pub struct PromptRegistry {
    /// id → family → versions in ascending order.
    prompts: BTreeMap<String, BTreeMap<String, Vec<Arc<PromptDefinition>>>>,
    env: Environment<'static>,
    /// Renders whose inputs repeat across requests (see
    /// [`PromptDefinition::render_roles_cached`]).
    render_cache: RenderCache,
}

/// Rendered messages by key; `None` when the templates need more inputs.
/// Looked up twice per agent request with a key of a hundred bytes or more:
/// foldhash instead of SipHash (a bounded cache needs no flooding defence).
type RenderedByKey = HashMap<String, Option<Arc<[RenderedMessage]>>, foldhash::fast::RandomState>;

/// Rendered messages kept by definition, roles and the caller's key of their
/// inputs; `None` remembers that the templates read more than those inputs.
/// Bounded: when full it starts over (the keys in use come back at once; a
/// caller that varies its key per request cannot grow it).
#[derive(Default)]
struct RenderCache(std::sync::Mutex<RenderedByKey>);

/// Entries [`RenderCache`] holds before it starts over.
const RENDER_CACHE_ENTRIES: usize = 256;

impl RenderCache {
    fn get(&self, key: &str) -> Option<Option<Arc<[RenderedMessage]>>> {
        self.0.lock().ok()?.get(key).cloned()
    }

    fn put(&self, key: String, rendered: Option<Arc<[RenderedMessage]>>) {
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= RENDER_CACHE_ENTRIES {
                map.clear();
            }
            map.insert(key, rendered);
        }
    }
}

impl std::fmt::Debug for PromptRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptRegistry")
            .field("prompts", &self.prompts.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// One prompt file, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptDefinition {
    pub id: String,
    pub family: String,
    pub version: Version,
    pub name: String,
    pub model: ModelConfig,
    pub unit_primitives: Vec<String>,
    /// Message order is template order.
    pub prompt_template: Vec<(TemplateRole, String)>,
    pub params: PromptParams,
    /// Chosen only when the request announces this feature flag.
    pub feature_flag: Option<String>,
    /// Names of the compiled templates in the registry's environment, one per
    /// `prompt_template` entry.
    template_names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedMessage {
    pub role: TemplateRole,
    pub content: String,
}

/// `custom_llm_provider` (and `model_metadata.provider`) naming Vertex AI.
use crate::providers::route::VERTEX_AI;

/// Timeout for prompts that set none (GitLab's tool prompts use 60 s).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

impl PromptRegistry {
    /// Loads every `<prompt id>/<family>/<semver>.yml` under `dir`; every
    /// `*.jinja` file becomes a partial named by its path relative to `dir`.
    pub fn load(dir: &Path) -> Result<Self, PromptLoadError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // Block tags on their own lines leave no blank lines behind.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            // A partial ending in a newline keeps it where it is included.
            .keep_trailing_newline(true)
            .build()
            .map_err(|e| PromptLoadError::Environment(e.to_string()))?;
        env.set_syntax(syntax);
        // Prompts are plain text: never HTML-escape inputs.
        env.set_auto_escape_callback(|_| AutoEscape::None);

        let mut files = Vec::new();
        collect_files(dir, dir, &mut files)?;
        files.sort();

        let mut prompts: BTreeMap<String, BTreeMap<String, Vec<Arc<PromptDefinition>>>> =
            BTreeMap::new();
        for relative in files {
            let path = dir.join(&relative);
            let name = relative.replace('\\', "/");
            if name.ends_with(".jinja") {
                let source = read(&path)?;
                env.add_template_owned(name.clone(), source)
                    .map_err(|e| PromptLoadError::invalid(&path, template_error(&e)))?;
            } else if name.ends_with(".yml") || name.ends_with(".yaml") {
                let definition = load_definition(&mut env, &path, &name)?;
                let versions = prompts
                    .entry(definition.id.clone())
                    .or_default()
                    .entry(definition.family.clone())
                    .or_default();
                if versions.iter().any(|d| d.version == definition.version) {
                    return Err(PromptLoadError::invalid(
                        &path,
                        format!(
                            "version {} of {}/{} is defined twice",
                            definition.version, definition.id, definition.family
                        ),
                    ));
                }
                versions.push(Arc::new(definition));
            }
        }
        for families in prompts.values_mut() {
            for versions in families.values_mut() {
                versions.sort_by(|a, b| a.version.cmp(&b.version));
            }
        }
        Ok(Self {
            prompts,
            env,
            render_cache: RenderCache::default(),
        })
    }

    /// The definition of `prompt_id` for `family` whose version is the highest
    /// matching `constraint` (`None` means `^1.0.0`); versions behind a
    /// feature flag are left out.
    pub fn resolve(
        &self,
        prompt_id: &str,
        family: &str,
        constraint: Option<&str>,
    ) -> Result<Arc<PromptDefinition>, PromptError> {
        self.resolve_with_flags(prompt_id, family, constraint, &[])
    }

    /// [`PromptRegistry::resolve`] for a request announcing `flags`: a
    /// version behind one of them may be chosen too, so a new prompt
    /// version ships to the instances, groups or users that have its flag.
    pub fn resolve_with_flags(
        &self,
        prompt_id: &str,
        family: &str,
        constraint: Option<&str>,
        flags: &[&str],
    ) -> Result<Arc<PromptDefinition>, PromptError> {
        let versions = self
            .versions(prompt_id, family)
            .ok_or_else(|| PromptError::NotFound(prompt_id.to_owned()))?;
        let constraint =
            VersionConstraint::parse(constraint).ok_or(PromptError::InvalidVersionConstraint)?;
        versions
            .iter()
            .filter(|d| constraint.matches(&d.version))
            .filter(|d| d.feature_flag.as_deref().is_none_or(|f| flags.contains(&f)))
            .max_by(|a, b| a.version.cmp(&b.version))
            .cloned()
            .ok_or(PromptError::NoMatchingVersion)
    }

    /// All versions of `prompt_id` for `family`, ascending; `None` when there
    /// are none or the id is not a safe relative path.
    pub fn versions(&self, prompt_id: &str, family: &str) -> Option<&[Arc<PromptDefinition>]> {
        if !is_safe_prompt_id(prompt_id) {
            return None;
        }
        self.prompts
            .get(prompt_id)
            .and_then(|families| families.get(family))
            .map(Vec::as_slice)
    }

    /// Whether any version of `prompt_id` exists for `family`.
    pub fn has(&self, prompt_id: &str, family: &str) -> bool {
        self.versions(prompt_id, family).is_some()
    }

    pub fn prompt_ids(&self) -> impl Iterator<Item = &str> {
        self.prompts.keys().map(String::as_str)
    }

    /// The families `prompt_id` is defined for.
    pub fn families(&self, prompt_id: &str) -> impl Iterator<Item = &str> {
        self.prompts
            .get(prompt_id)
            .into_iter()
            .flat_map(|families| families.keys().map(String::as_str))
    }

    /// Every loaded definition, in id, family, version order.
    pub fn definitions(&self) -> impl Iterator<Item = &Arc<PromptDefinition>> {
        self.prompts
            .values()
            .flat_map(|families| families.values().flatten())
    }
}

/// Prompt ids come from URLs: anything that could climb out of the prompts
/// directory or name a file oddly is treated as unknown.
fn is_safe_prompt_id(id: &str) -> bool {
    !id.is_empty()
        && !id.starts_with('/')
        && !id.contains('\\')
        && !id.contains('\0')
        && id
            .split('/')
            .all(|segment| !segment.is_empty() && segment != "." && segment != "..")
}

fn collect_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), PromptLoadError> {
    let entries = std::fs::read_dir(dir).map_err(|e| PromptLoadError::io(dir, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| PromptLoadError::io(dir, &e))?;
        let path = entry.path();
        let file_type = entry
            .file_type()
            .map_err(|e| PromptLoadError::io(&path, &e))?;
        if file_type.is_dir() {
            collect_files(root, &path, out)?;
        } else if let Ok(relative) = path.strip_prefix(root) {
            let parts: Vec<String> = relative
                .components()
                .filter_map(|c| match c {
                    Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                    _ => None,
                })
                .collect();
            out.push(parts.join("/"));
        }
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, PromptLoadError> {
    std::fs::read_to_string(path).map_err(|e| PromptLoadError::io(path, &e))
}

fn template_error(err: &minijinja::Error) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}

/// Reads `<id…>/<family>/<version>.yml`, validates it and compiles its templates.
fn load_definition(
    env: &mut Environment<'static>,
    path: &Path,
    relative: &str,
) -> Result<PromptDefinition, PromptLoadError> {
    let mut segments: Vec<&str> = relative.split('/').collect();
    let file_name = segments.pop().unwrap_or_default();
    let family = segments.pop();
    let (Some(family), false) = (family, segments.is_empty()) else {
        return Err(PromptLoadError::invalid(
            path,
            "expected <prompt id>/<family>/<version>.yml".to_owned(),
        ));
    };
    let id = segments.join("/");
    let stem = file_name
        .strip_suffix(".yml")
        .or_else(|| file_name.strip_suffix(".yaml"))
        .unwrap_or(file_name);
    let version = Version::parse(stem).map_err(|e| {
        PromptLoadError::invalid(
            path,
            format!("file name {stem:?} is not a semver version: {e}"),
        )
    })?;

    let source = read(path)?;
    let file: PromptFile = serde_norway::from_str(&source)
        .map_err(|e| PromptLoadError::invalid(path, e.to_string()))?;

    let mut template_names = Vec::with_capacity(file.prompt_template.0.len());
    for (role, template) in &file.prompt_template.0 {
        let name = format!("{relative}#{}", role.as_str());
        env.add_template_owned(name.clone(), template.clone())
            .map_err(|e| {
                PromptLoadError::invalid(
                    path,
                    format!("prompt_template.{}: {}", role.as_str(), template_error(&e)),
                )
            })?;
        template_names.push(name);
    }

    Ok(PromptDefinition {
        id,
        family: family.to_owned(),
        version,
        name: file.name,
        model: file.model.into(),
        unit_primitives: file.unit_primitives,
        prompt_template: file.prompt_template.0,
        params: file.params,
        feature_flag: file.feature_flag,
        template_names,
    })
}

/// serde_json inputs as template values. Object keys keep a stable (sorted)
/// order so rendering is byte-stable.
fn template_value(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => items.iter().map(template_value).collect(),
        serde_json::Value::Object(map) => Value::from(
            map.iter()
                .map(|(k, v)| (k.clone(), template_value(v)))
                .collect::<BTreeMap<String, Value>>(),
        ),
    }
}

impl PromptDefinition {
    /// Renders every template with `inputs`. A variable the template needs but
    /// `inputs` lacks is [`PromptError::MissingInput`].
    pub fn render(
        &self,
        registry: &PromptRegistry,
        inputs: &serde_json::Value,
    ) -> Result<Vec<RenderedMessage>, PromptError> {
        self.render_roles(registry, inputs, |_| true)
    }

    /// [`Self::render_roles`] for the templates of `roles`, rendered once per
    /// `key` and kept: for templates whose inputs repeat across requests (the
    /// chat agent's system prompt depends only on the tools offered). `key`
    /// must identify everything `inputs` returns; `inputs` is called only
    /// when the key is new. The templates see those inputs alone: when they
    /// read anything else they cannot be kept, and the answer is `None` (for
    /// this key from then on), so the caller renders them with all its inputs.
    pub fn render_roles_cached(
        &self,
        registry: &PromptRegistry,
        roles: &[TemplateRole],
        key: &str,
        inputs: impl FnOnce() -> serde_json::Value,
    ) -> Result<Option<Arc<[RenderedMessage]>>, PromptError> {
        let full_key = self.render_cache_key(roles, key);
        if let Some(known) = registry.render_cache.get(&full_key) {
            return Ok(known);
        }
        let rendered = match self.render_roles(registry, &inputs(), |role| roles.contains(&role)) {
            Ok(messages) => Some(Arc::<[RenderedMessage]>::from(messages)),
            Err(PromptError::MissingInput(_)) => None,
            Err(e) => return Err(e),
        };
        registry.render_cache.put(full_key, rendered.clone());
        Ok(rendered)
    }

    /// The render cache's key: this prompt's id, family and version, the
    /// roles rendered and the caller's key, NUL-separated. Put together by
    /// hand: it is built on every agent request.
    fn render_cache_key(&self, roles: &[TemplateRole], key: &str) -> String {
        use std::fmt::Write as _;
        let mut full_key = String::with_capacity(
            self.id.len() + self.family.len() + key.len() + 16 + roles.len() * 10,
        );
        for part in [self.id.as_str(), "\u{0}", self.family.as_str(), "\u{0}"] {
            full_key.push_str(part);
        }
        let _ = write!(full_key, "{}", self.version);
        for role in roles {
            full_key.push('\u{0}');
            full_key.push_str(role.as_str());
        }
        full_key.push_str("\u{0}\u{0}");
        full_key.push_str(key);
        full_key
    }

    /// Renders only the templates whose role `wanted` accepts: the agent renders
    /// the system prompt and scratchpad once, and each user turn on its own with
    /// just that turn's inputs (linear in the request, not turns × prompt).
    pub fn render_roles(
        &self,
        registry: &PromptRegistry,
        inputs: &serde_json::Value,
        wanted: impl Fn(TemplateRole) -> bool,
    ) -> Result<Vec<RenderedMessage>, PromptError> {
        let context = template_value(inputs);
        let mut messages = Vec::with_capacity(self.template_names.len());
        for ((role, _), name) in self.prompt_template.iter().zip(&self.template_names) {
            if !wanted(*role) {
                continue;
            }
            let template = registry
                .env
                .get_template(name)
                .map_err(|e| PromptError::Render(template_error(&e)))?;
            let rendered = template.render(&context).map_err(|e| {
                let missing = missing_inputs(&registry.env, &template, &e, inputs);
                if missing.is_empty() {
                    PromptError::Render(format!("{name}: {}", template_error(&e)))
                } else {
                    PromptError::MissingInput(missing.join(", "))
                }
            })?;
            // Surrounding whitespace comes from YAML block scalars, and
            // Anthropic rejects an assistant prefill ending in whitespace.
            messages.push(RenderedMessage {
                role: *role,
                content: rendered.trim().to_owned(),
            });
        }
        Ok(messages)
    }

    /// The model call for rendered messages: system templates become the
    /// system prompt, the rest the conversation in order.
    pub fn model_call(&self, messages: Vec<RenderedMessage>, target: ModelTarget) -> ModelCall {
        let mut system: Vec<String> = Vec::new();
        let mut chat = Vec::with_capacity(messages.len());
        for message in messages {
            let role = match message.role {
                TemplateRole::System => {
                    system.push(message.content);
                    continue;
                }
                TemplateRole::User => ChatRole::User,
                TemplateRole::Assistant => ChatRole::Assistant,
            };
            chat.push(ChatMessage {
                role,
                content: message.content,
            });
        }
        let mut call = ModelCall::new(target, chat);
        call.system = (!system.is_empty()).then(|| system.join("\n\n"));
        call.params = self.model_params();
        call
    }

    /// Sampling parameters, stop sequences and timeouts from the definition.
    pub fn model_params(&self) -> ModelParams {
        let defaults = ModelParams::default();
        let settings = &self.model.params;
        let timeout = self
            .params
            .timeout
            .filter(|t| t.is_finite() && *t > 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or(DEFAULT_TIMEOUT);
        ModelParams {
            temperature: settings.temperature,
            top_p: settings.top_p,
            top_k: settings.top_k,
            max_tokens: settings.max_tokens.unwrap_or(defaults.max_tokens),
            stop: self.params.stop.clone(),
            // The router caps this with AIGW_MODELS__FIRST_TOKEN_TIMEOUT_SECONDS.
            first_token_timeout: timeout,
            timeout,
            max_retries: settings.max_retries,
            dry_multiplier: settings.dry_multiplier,
        }
    }

    /// Where the call goes. Mock mode wins; then `model_metadata` (only when
    /// custom models are enabled, its endpoint admitted by `guard`); then
    /// the definition's model class.
    pub fn model_target(
        &self,
        cfg: &ProvidersConfig,
        model_metadata: Option<&contracts::ModelMetadata>,
        guard: &EndpointGuard<'_>,
    ) -> Result<ModelTarget, PromptError> {
        if let Some(metadata) = model_metadata {
            if !cfg.custom_models_enabled {
                return Err(PromptError::CustomModelsDisabled);
            }
            if let Some(field) = metadata.oversized_field() {
                return Err(PromptError::InvalidModelMetadata(format!(
                    "model_metadata.{field} is longer than {} characters",
                    contracts::ModelMetadata::MAX_FIELD_LEN
                )));
            }
        }
        if cfg.mock_model_responses {
            return Ok(ModelTarget::new(
                ProviderKind::Mock,
                self.model.name.clone(),
            ));
        }
        if let Some(metadata) = model_metadata {
            let custom = CustomModel {
                provider: &metadata.provider,
                name: &metadata.name,
                identifier: metadata.identifier.as_deref(),
                endpoint: &metadata.endpoint,
                api_key: metadata.api_key.as_deref(),
            };
            return custom.target(cfg, guard).map_err(PromptError::from);
        }
        let settings = &self.model.params;
        let kind = match settings.model_class_provider {
            super::ModelClassProvider::Anthropic => ProviderKind::Anthropic,
            // litellm's name for Vertex AI, as GitLab's prompt files write it.
            super::ModelClassProvider::Litellm
                if settings.custom_llm_provider.as_deref() == Some(VERTEX_AI) =>
            {
                ProviderKind::VertexAi
            }
            super::ModelClassProvider::Litellm => ProviderKind::OpenAiCompatible,
        };
        let mut target = ModelTarget::new(kind, self.model.name.clone());
        if kind == ProviderKind::VertexAi {
            target.location = self.params.vertex_location.clone();
        }
        Ok(target)
    }

    /// Whether `user` holds every unit primitive this prompt needs.
    pub fn allowed_for(&self, user: &crate::auth::GatewayUser) -> bool {
        self.unit_primitives.iter().all(|up| user.can_str(up))
    }
}

/// When rendering failed on an undefined value: the top-level variables the
/// template (or the partial where it failed) reads that `inputs` lacks, sorted.
fn missing_inputs(
    env: &Environment<'static>,
    template: &minijinja::Template<'_, '_>,
    err: &minijinja::Error,
    inputs: &serde_json::Value,
) -> Vec<String> {
    // Failures inside a partial arrive wrapped in the include's error.
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    let mut undefined_in = None;
    while let Some(error) = current {
        if let Some(jinja) = error.downcast_ref::<minijinja::Error>()
            && jinja.kind() == ErrorKind::UndefinedError
        {
            undefined_in = Some(jinja.name().map(ToOwned::to_owned));
            break;
        }
        current = error.source();
    }
    let Some(failed_template) = undefined_in else {
        return Vec::new();
    };
    let mut names = template.undeclared_variables(false);
    if let Some(partial) = failed_template.and_then(|n| env.get_template(&n).ok()) {
        names.extend(partial.undeclared_variables(false));
    }
    let globals: HashMap<&str, Value> = env.globals().collect();
    let mut missing: Vec<String> = names
        .into_iter()
        .filter(|name| !globals.contains_key(name.as_str()))
        .filter(|name| inputs.get(name).is_none())
        .collect();
    missing.sort();
    missing
}
