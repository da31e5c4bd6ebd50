//! Write parameters as GitLab takes them: a JSON body, a form body
//! (`application/x-www-form-urlencoded`, as `curl --data` sends), or query
//! parameters, merged (the body wins). Form and query values are text, so they
//! are read leniently: `"true"`/`"1"` for booleans, `"42"` for numbers,
//! `"a,b"` or `key[]=a&key[]=b` for lists, as Grape coerces them.

use std::ops::Deref;

use actix_web::{FromRequest, HttpMessage, HttpRequest, dev, web};
use futures::future::LocalBoxFuture;
use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::ApiError;

/// The merged, typed parameters of a write request.
#[derive(Debug)]
pub struct Params<T>(pub T);

impl<T> Params<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> Deref for Params<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: DeserializeOwned + 'static> FromRequest for Params<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut dev::Payload) -> Self::Future {
        let query = req.query_string().to_owned();
        let content_type = req.content_type().to_ascii_lowercase();
        let body = web::Bytes::from_request(req, payload);
        Box::pin(async move {
            let body = body
                .await
                .map_err(|e| ApiError::BadRequest(format!("could not read the body: {e}")))?;
            let json = content_type.is_empty() || content_type.contains("json");
            if query.is_empty()
                && json
                && let Ok(typed) = serde_json::from_slice::<T>(&body)
            {
                // Already of the right types: no coercion needed, and a large
                // body (a long run's checkpoint) is read once, not copied
                // into a map first. Anything else takes the lenient path.
                return Ok(Params(typed));
            }
            let mut merged = form_values(&query);
            let from_body = if body.iter().all(u8::is_ascii_whitespace) {
                Map::new()
            } else if content_type.starts_with("application/x-www-form-urlencoded") {
                let text = std::str::from_utf8(&body)
                    .map_err(|_| ApiError::BadRequest("the body is not UTF-8".into()))?;
                form_values(text)
            } else if json {
                match serde_json::from_slice::<Value>(&body) {
                    Ok(Value::Object(map)) => map,
                    Ok(_) => {
                        return Err(ApiError::BadRequest(
                            "the body must be a JSON object".into(),
                        ));
                    }
                    Err(e) => return Err(ApiError::BadRequest(format!("invalid JSON: {e}"))),
                }
            } else {
                return Err(ApiError::BadRequest(format!(
                    "unsupported content type {content_type}: send JSON or form parameters"
                )));
            };
            merged.extend(from_body);
            T::deserialize(Lenient(Value::Object(merged)))
                .map(Params)
                .map_err(|e| ApiError::BadRequest(gitlab_message(&e.to_string())))
        })
    }
}

/// serde's "missing field `title`" in Grape's words ("title is missing").
fn gitlab_message(serde: &str) -> String {
    if let Some(rest) = serde.strip_prefix("missing field `")
        && let Some(field) = rest.split('`').next()
    {
        return format!("{field} is missing");
    }
    serde.to_owned()
}

/// Form or query pairs as JSON: `k=v` → text, `k[]=v` → a list of texts
/// (repeated), `k[a][b]=v` → nested objects (Rack's nested parameters, as
/// GitLab takes `ai_settings_attributes[duo_workflow_mcp_enabled]=true`),
/// `k=v1&k=v2` → the last value. A key that is not of these shapes, or
/// nests deeper than [`MAX_FORM_NESTING`], is taken as it is.
pub fn form_values(text: &str) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in url::form_urlencoded::parse(text.as_bytes()) {
        let value = Value::String(value.into_owned());
        match nested_key(&key) {
            Some((base, path, list)) => insert_nested(&mut out, base, &path, list, value),
            None => {
                out.insert(key.into_owned(), value);
            }
        }
    }
    out
}

/// Deepest `[a][b]…` nesting a form key may have; deeper keys stay literal
/// (and so match no parameter): nesting is what a body's size cannot bound.
const MAX_FORM_NESTING: usize = 4;

/// `k[a][b][]` → (`k`, [`a`, `b`], a list); `None` when the key has no
/// brackets or is not made only of `[segment]` groups after its name.
fn nested_key(key: &str) -> Option<(&str, Vec<&str>, bool)> {
    let open = key.find('[')?;
    let base = &key[..open];
    if base.is_empty() {
        return None;
    }
    let mut rest = &key[open..];
    let mut path = Vec::new();
    let mut list = false;
    while !rest.is_empty() {
        let inner = rest.strip_prefix('[')?;
        let close = inner.find(']')?;
        let segment = &inner[..close];
        rest = &inner[close + 1..];
        if segment.contains('[') {
            return None;
        }
        if segment.is_empty() {
            // `[]` only at the end: lists of objects are not taken.
            if !rest.is_empty() {
                return None;
            }
            list = true;
        } else {
            path.push(segment);
        }
    }
    (path.len() <= MAX_FORM_NESTING).then_some((base, path, list))
}

fn insert_nested(
    out: &mut Map<String, Value>,
    base: &str,
    path: &[&str],
    list: bool,
    value: Value,
) {
    let mut map = out;
    let mut name = base;
    for segment in path {
        let entry = map
            .entry(name.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        let Value::Object(inner) = entry else {
            return;
        };
        map = inner;
        name = segment;
    }
    if list {
        let entry = map
            .entry(name.to_owned())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(items) = entry {
            items.push(value);
        } else {
            *entry = Value::Array(vec![value]);
        }
    } else {
        map.insert(name.to_owned(), value);
    }
}

/// The name serde_json gives `RawValue` when it asks a deserializer for one.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// A JSON value read with Grape's coercions (see the module doc).
pub struct Lenient(pub Value);

/// A boolean parameter as clients send it: `true`, `True` (Python's
/// requests, so python-gitlab), `1`, `yes`, `on`, `t`, and their opposites.
pub fn boolean(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" | "t" => Some(true),
        "false" | "0" | "no" | "off" | "f" => Some(false),
        _ => None,
    }
}

/// A flag parameter: on only when it says so.
pub fn flag(text: Option<&str>) -> bool {
    text.and_then(boolean).unwrap_or(false)
}

impl<'de> IntoDeserializer<'de, serde_json::Error> for Lenient {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

fn text_as<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, serde_json::Error> {
    s.trim()
        .parse()
        .map_err(|_| de::Error::custom(format_args!("{s:?} is not {what}")))
}

macro_rules! lenient_number {
    ($method:ident, $visit:ident, $ty:ty, $what:literal) => {
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            match self.0 {
                Value::String(s) => visitor.$visit(text_as::<$ty>(&s, $what)?),
                other => other.$method(visitor),
            }
        }
    };
}

impl<'de> Deserializer<'de> for Lenient {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Array(items) => {
                let mut seq = SeqDeserializer::new(items.into_iter().map(Lenient));
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Value::Object(map) => {
                let mut access =
                    MapDeserializer::new(map.into_iter().map(|(k, v)| (k, Lenient(v))));
                let value = visitor.visit_map(&mut access)?;
                access.end()?;
                Ok(value)
            }
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::String(s) => match boolean(&s) {
                Some(b) => visitor.visit_bool(b),
                None => Err(de::Error::custom(format_args!("{s:?} is not a boolean"))),
            },
            other => other.deserialize_bool(visitor),
        }
    }

    lenient_number!(deserialize_i8, visit_i8, i8, "a number");
    lenient_number!(deserialize_i16, visit_i16, i16, "a number");
    lenient_number!(deserialize_i32, visit_i32, i32, "a number");
    lenient_number!(deserialize_i64, visit_i64, i64, "a number");
    lenient_number!(deserialize_u8, visit_u8, u8, "a number");
    lenient_number!(deserialize_u16, visit_u16, u16, "a number");
    lenient_number!(deserialize_u32, visit_u32, u32, "a number");
    lenient_number!(deserialize_u64, visit_u64, u64, "a number");
    lenient_number!(deserialize_f32, visit_f32, f32, "a number");
    lenient_number!(deserialize_f64, visit_f64, f64, "a number");

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(Lenient(other)),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            // `a,b` for a list, as GitLab reads comma-separated parameters.
            Value::String(s) => {
                let items: Vec<Lenient> = s
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(|p| Lenient(Value::String(p.to_owned())))
                    .collect();
                let mut seq = SeqDeserializer::new(items.into_iter());
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            other => Lenient(other).deserialize_any(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        // serde_json's raw JSON text (`Box<RawValue>`, a checkpoint's body)
        // takes the value as it is, without coercion.
        if name == RAW_VALUE_TOKEN {
            return self.0.deserialize_newtype_struct(name, visitor);
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    serde::forward_to_deserialize_any! {
        i128 u128 char str string bytes byte_buf unit unit_struct tuple
        tuple_struct map struct identifier ignored_any
    }
}

/// GitLab's `labels`: a comma-separated text or a list of texts (python-gitlab
/// sends a list); blanks dropped, order kept, duplicates removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelList(pub Vec<String>);

impl<'de> Deserialize<'de> for LabelList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            List(Vec<String>),
        }
        let parts: Vec<String> = match Raw::deserialize(deserializer)? {
            Raw::Text(text) => text.split(',').map(str::to_owned).collect(),
            Raw::List(items) => items
                .iter()
                .flat_map(|i| i.split(','))
                .map(str::to_owned)
                .collect(),
        };
        let mut out: Vec<String> = Vec::new();
        for part in parts {
            let label = part.trim();
            if !label.is_empty() && !out.iter().any(|l| l == label) {
                out.push(label.to_owned());
            }
        }
        Ok(LabelList(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Sample {
        title: String,
        confidential: Option<bool>,
        assignee_ids: Option<Vec<i64>>,
        labels: Option<LabelList>,
        weight: Option<i32>,
    }

    fn read(value: Value) -> Result<Sample, String> {
        Sample::deserialize(Lenient(value)).map_err(|e| gitlab_message(&e.to_string()))
    }

    #[test]
    fn forms_json_and_query_read_alike() {
        let form = Value::Object(form_values(
            "title=Bug&confidential=true&assignee_ids[]=3&assignee_ids[]=4&labels=a,%20b&weight=2",
        ));
        let json = serde_json::json!({
            "title": "Bug", "confidential": true, "assignee_ids": [3, 4], "labels": ["a", "b"], "weight": 2
        });
        let expected = Sample {
            title: "Bug".into(),
            confidential: Some(true),
            assignee_ids: Some(vec![3, 4]),
            labels: Some(LabelList(vec!["a".into(), "b".into()])),
            weight: Some(2),
        };
        assert_eq!(read(form).unwrap(), expected);
        assert_eq!(read(json).unwrap(), expected);
        let csv = Value::Object(form_values("title=Bug&assignee_ids=3,4&confidential=0"));
        let parsed = read(csv).unwrap();
        assert_eq!(parsed.assignee_ids, Some(vec![3, 4]));
        assert_eq!(parsed.confidential, Some(false));
    }

    #[test]
    fn raw_json_is_taken_as_it_is_on_the_lenient_path() {
        #[derive(Deserialize)]
        struct WithRaw {
            count: i64,
            body: Box<serde_json::value::RawValue>,
        }
        let value = serde_json::json!({"count": "3", "body": {"n": "4", "list": [1, "x"]}});
        let read = WithRaw::deserialize(Lenient(value)).unwrap();
        assert_eq!(read.count, 3);
        assert_eq!(read.body.get(), r#"{"n":"4","list":[1,"x"]}"#);
    }

    #[test]
    fn refusals_are_worded_like_gitlab() {
        assert_eq!(read(serde_json::json!({})).unwrap_err(), "title is missing");
        assert!(read(Value::Object(form_values("title=x&weight=heavy"))).is_err());
        assert!(read(Value::Object(form_values("title=x&confidential=maybe"))).is_err());
    }

    #[test]
    fn nested_form_keys_become_objects() {
        let values = Value::Object(form_values(
            "ai_settings_attributes[duo_workflow_mcp_enabled]=true&a[b][c]=1&a[b][d][]=x&a[b][d][]=y&plain=p",
        ));
        assert_eq!(
            values,
            serde_json::json!({
                "ai_settings_attributes": {"duo_workflow_mcp_enabled": "true"},
                "a": {"b": {"c": "1", "d": ["x", "y"]}},
                "plain": "p",
            })
        );
        // Malformed or too deep keys are taken literally.
        let literal = form_values("[x]=1&k[=2&k[a]b=3&k[][a]=4&d[1][2][3][4][5]=5&k]=6");
        let keys: Vec<&str> = literal.keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 6, "{keys:?}");
        for key in ["[x]", "k[", "k[a]b", "k[][a]", "d[1][2][3][4][5]", "k]"] {
            assert!(literal.contains_key(key), "{key}");
        }
        // A nested value replaces a plain one of the same name, and back.
        let replaced = form_values("k=1&k[a]=2");
        assert_eq!(replaced["k"], serde_json::json!({"a": "2"}));
        assert_eq!(form_values("k[a]=2&k=1")["k"], "1");
    }

    #[test]
    fn labels_are_deduplicated_and_trimmed() {
        let l: LabelList =
            serde_json::from_value(serde_json::json!(["x", "y,x", " ", "z"])).unwrap();
        assert_eq!(l.0, vec!["x", "y", "z"]);
    }
}
