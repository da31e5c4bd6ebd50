//! GitLab's ID scalars (carried as their global-ID text) and `JSON`.

use juniper::GraphQLScalar;

macro_rules! id_scalar {
    ($rust:ident, $name:literal) => {
        #[derive(Debug, Clone, PartialEq, GraphQLScalar)]
        #[graphql(name = $name, transparent)]
        pub struct $rust(pub String);
    };
}

id_scalar!(AiModelId, "AiModelID");
id_scalar!(AiAgentVersionId, "AiAgentVersionID");
id_scalar!(AiConversationThreadId, "AiConversationThreadID");
id_scalar!(ProjectId, "ProjectID");
id_scalar!(NamespaceId, "NamespaceID");
id_scalar!(GroupId, "GroupID");
id_scalar!(UserId, "UserID");
id_scalar!(Time, "Time");
id_scalar!(AiSelfHostedModelId, "AiSelfHostedModelID");
id_scalar!(AiDuoWorkflowsWorkflowId, "AiDuoWorkflowsWorkflowID");
/// GitLab's `JSON`: any JSON value, carried as its serialised text. juniper
/// checks variables of a scalar type to be scalars, so objects and arrays sent
/// in variables are serialised by [`normalize_json_variables`] before juniper
/// sees them (with a marker, so they come back as JSON rather than as strings);
/// strings, numbers, booleans arrive as they are.
#[derive(Debug, Clone, PartialEq, GraphQLScalar)]
#[graphql(
    name = "JSON",
    with = json_scalar,
    to_output_with = json_scalar::to_output,
    parse_token(String, i32, f64, bool)
)]
pub struct Json(pub String);

/// Marks a variable value that was an object or array before it was
/// serialised for juniper's scalar checks.
pub(crate) const JSON_MARKER: &str = "\u{1}json:";

mod json_scalar {
    use juniper::{Scalar, ScalarValue};

    use super::{JSON_MARKER, Json};

    pub(super) fn to_output(v: &Json) -> String {
        v.0.clone()
    }

    pub(super) fn from_input(v: &Scalar<impl ScalarValue>) -> Result<Json, Box<str>> {
        if let Ok(s) = v.try_to::<&str>() {
            if let Some(json) = s.strip_prefix(JSON_MARKER) {
                return Ok(Json(json.to_owned()));
            }
            return Ok(Json(serde_json::Value::String(s.to_owned()).to_string()));
        }
        if let Some(b) = v.try_to_bool() {
            return Ok(Json(b.to_string()));
        }
        if let Some(i) = v.try_to_int() {
            return Ok(Json(i.to_string()));
        }
        if let Some(f) = v.try_to_float() {
            return Ok(Json(
                serde_json::Number::from_f64(f)
                    .map_or_else(|| "null".to_owned(), |n| n.to_string()),
            ));
        }
        Err("expected a JSON value".into())
    }
}

impl Json {
    /// The JSON value (a plain string when the text is not JSON).
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or_else(|_| serde_json::Value::String(self.0.clone()))
    }
}
