//! JSON Schema to llama.cpp GBNF grammars.
//!
//! The grammar accepts exactly the JSON texts that match the schema's
//! structure, so grammar-constrained sampling cannot produce anything else.
//! Keywords that only annotate (`title`, `description`, `default`, `format`,
//! ...) are ignored; keywords whose constraint a grammar cannot express here
//! (`pattern`, most numeric bounds, `allOf`, ...) are refused with a clear
//! error rather than silently widened. Object properties come out in the
//! schema's order; whitespace between tokens is bounded so a model cannot
//! pad forever.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// Schemas nest at most this deep (counting `$ref` hops).
pub const MAX_SCHEMA_DEPTH: usize = 24;
/// Grammars stay below this many rules.
pub const MAX_RULES: usize = 2_000;
/// `maxLength` / `maxItems` above these are refused: llama.cpp expands
/// bounded repetitions into one rule per step.
pub const MAX_STRING_LENGTH_BOUND: u64 = 1_000;
pub const MAX_ITEMS_BOUND: u64 = 100;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("the schema at {path} uses {keyword:?}, which this server cannot enforce")]
    Unsupported { path: String, keyword: String },
    #[error("the schema at {path} is not valid: {reason}")]
    Invalid { path: String, reason: String },
    #[error("the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels")]
    TooDeep,
    #[error("the schema needs a grammar of more than {MAX_RULES} rules")]
    TooLarge,
}

/// A GBNF grammar whose start rule is `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grammar {
    pub text: String,
}

impl Grammar {
    pub const ROOT: &'static str = "root";
}

/// Keywords that carry no constraint.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "example",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "format",
    "strict",
    "nullable",
];

const STRUCTURE: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "$ref",
    "$defs",
    "definitions",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
];

/// Whitespace between JSON tokens: nothing, one space, or a newline and a
/// little indentation.
const WS_RULE: &str = r#"( " " | "\n" " "{0,16} )?"#;
const CHAR_RULE: &str = r#"[^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )"#;

/// Builds GBNF rules; identical bodies share one rule.
#[derive(Debug, Default)]
pub struct GrammarBuilder {
    rules: Vec<(String, String)>,
    by_body: HashMap<String, String>,
    taken: HashMap<String, usize>,
    /// `$ref` target → its rule name (set before the body is built, so
    /// recursive schemas refer to themselves).
    refs: HashMap<String, String>,
}

impl GrammarBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or reuses) a rule and returns its name.
    pub fn rule(&mut self, hint: &str, body: String) -> Result<String, SchemaError> {
        if let Some(name) = self.by_body.get(&body) {
            return Ok(name.clone());
        }
        let name = self.fresh_name(hint)?;
        self.by_body.insert(body.clone(), name.clone());
        self.rules.push((name.clone(), body));
        Ok(name)
    }

    fn fresh_name(&mut self, hint: &str) -> Result<String, SchemaError> {
        if self.rules.len() >= MAX_RULES {
            return Err(SchemaError::TooLarge);
        }
        let mut base: String = hint
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        base = base.trim_matches('-').to_owned();
        if base.is_empty() || base == Grammar::ROOT {
            base = "r".to_owned();
        }
        base.truncate(40);
        let count = self.taken.entry(base.clone()).or_insert(0);
        *count += 1;
        Ok(if *count == 1 {
            base
        } else {
            format!("{base}-{count}")
        })
    }

    /// Reserves a name whose body is set later with [`Self::define`].
    fn reserve(&mut self, hint: &str) -> Result<String, SchemaError> {
        self.fresh_name(hint)
    }

    fn define(&mut self, name: String, body: String) {
        self.rules.push((name, body));
    }

    pub fn ws(&mut self) -> Result<String, SchemaError> {
        self.rule("ws", WS_RULE.to_owned())
    }

    fn string_char(&mut self) -> Result<String, SchemaError> {
        self.rule("char", CHAR_RULE.to_owned())
    }

    pub fn any_string(&mut self) -> Result<String, SchemaError> {
        let c = self.string_char()?;
        self.rule("string", format!(r#""\"" {c}* "\"""#))
    }

    fn integer(&mut self, minimum: Option<i64>) -> Result<String, SchemaError> {
        match minimum {
            None => self.rule("integer", r#""-"? ( "0" | [1-9] [0-9]{0,17} )"#.to_owned()),
            Some(0) => self.rule(
                "nonneg-integer",
                r#"( "0" | [1-9] [0-9]{0,17} )"#.to_owned(),
            ),
            Some(_) => self.rule("pos-integer", r#"[1-9] [0-9]{0,17}"#.to_owned()),
        }
    }

    fn number(&mut self, non_negative: bool) -> Result<String, SchemaError> {
        let sign = if non_negative { "" } else { r#""-"? "# };
        self.rule(
            if non_negative { "nonneg-number" } else { "number" },
            format!(
                r#"{sign}( "0" | [1-9] [0-9]{{0,17}} ) ( "." [0-9]{{1,17}} )? ( [eE] [-+]? [0-9]{{1,3}} )?"#
            ),
        )
    }

    /// Any JSON value (for `{}` / `true` schemas and `json_object`).
    pub fn any_value(&mut self) -> Result<String, SchemaError> {
        if let Some(name) = self.refs.get("#any") {
            return Ok(name.clone());
        }
        let value = self.reserve("value")?;
        self.refs.insert("#any".to_owned(), value.clone());
        let ws = self.ws()?;
        let string = self.any_string()?;
        let number = self.number(false)?;
        let object = self.rule(
            "object",
            format!(
                r#""{{" {ws} ( {string} {ws} ":" {ws} {value} ( {ws} "," {ws} {string} {ws} ":" {ws} {value} )* )? {ws} "}}""#
            ),
        )?;
        let array = self.rule(
            "array",
            format!(r#""[" {ws} ( {value} ( {ws} "," {ws} {value} )* )? {ws} "]""#),
        )?;
        self.refs.insert("#any-object".to_owned(), object.clone());
        self.define(
            value.clone(),
            format!(r#"{object} | {array} | {string} | {number} | "true" | "false" | "null""#),
        );
        Ok(value)
    }

    /// Any JSON object.
    pub fn any_object(&mut self) -> Result<String, SchemaError> {
        self.any_value()?;
        self.refs
            .get("#any-object")
            .cloned()
            .ok_or_else(|| invalid("#", "the generic object rule is missing"))
    }

    /// The grammar expression for values matching `schema`; `root` resolves `$ref`s.
    pub fn schema(&mut self, schema: &Value, root: &Value) -> Result<String, SchemaError> {
        self.schema_at(schema, root, "#", 0)
    }

    fn schema_at(
        &mut self,
        schema: &Value,
        root: &Value,
        path: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        if depth > MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep);
        }
        let object = match schema {
            Value::Bool(true) => return self.any_value(),
            Value::Bool(false) => {
                return Err(invalid(path, "the schema `false` matches nothing"));
            }
            Value::Object(object) => object,
            _ => return Err(invalid(path, "a schema must be an object or a boolean")),
        };
        for key in object.keys() {
            if !ANNOTATIONS.contains(&key.as_str()) && !STRUCTURE.contains(&key.as_str()) {
                return Err(SchemaError::Unsupported {
                    path: path.to_owned(),
                    keyword: key.clone(),
                });
            }
        }
        if let Some(reference) = object.get("$ref") {
            let reference = reference
                .as_str()
                .ok_or_else(|| invalid(path, "$ref must be a string"))?;
            return self.reference(reference, root, path, depth);
        }
        if let Some(value) = object.get("const") {
            return Ok(literal(&json_text(value)));
        }
        if let Some(values) = object.get("enum") {
            let values = values
                .as_array()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| invalid(path, "enum must be a non-empty array"))?;
            let alternatives: Vec<String> = values.iter().map(|v| literal(&json_text(v))).collect();
            return Ok(format!("( {} )", alternatives.join(" | ")));
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(options) = object.get(keyword) {
                let options = options
                    .as_array()
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| {
                        invalid(path, &format!("{keyword} must be a non-empty array"))
                    })?;
                let mut alternatives = Vec::with_capacity(options.len());
                for (i, option) in options.iter().enumerate() {
                    alternatives.push(self.schema_at(
                        option,
                        root,
                        &format!("{path}/{keyword}/{i}"),
                        depth + 1,
                    )?);
                }
                return Ok(format!("( {} )", alternatives.join(" | ")));
            }
        }
        let types: Vec<&str> = match object.get("type") {
            None if object.contains_key("properties") => vec!["object"],
            None if object.contains_key("items") => vec!["array"],
            None => return self.any_value(),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(list)) if !list.is_empty() => list
                .iter()
                .map(|t| {
                    t.as_str()
                        .ok_or_else(|| invalid(path, "type must name JSON types"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid(path, "type must be a string or a list of strings")),
        };
        // `"nullable": true` (OpenAPI style) adds null.
        let nullable = object.get("nullable") == Some(&Value::Bool(true));
        let mut alternatives = Vec::new();
        for kind in types {
            alternatives.push(self.typed(kind, object, root, path, depth)?);
        }
        if nullable {
            alternatives.push(r#""null""#.to_owned());
        }
        Ok(if alternatives.len() == 1 {
            alternatives.remove(0)
        } else {
            format!("( {} )", alternatives.join(" | "))
        })
    }

    fn reference(
        &mut self,
        reference: &str,
        root: &Value,
        path: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        if let Some(name) = self.refs.get(reference) {
            return Ok(name.clone());
        }
        let target = if reference == "#" {
            root
        } else {
            let pointer = reference
                .strip_prefix('#')
                .filter(|p| p.starts_with("/$defs/") || p.starts_with("/definitions/"))
                .ok_or_else(|| SchemaError::Unsupported {
                    path: path.to_owned(),
                    keyword: format!("$ref {reference}"),
                })?;
            root.pointer(pointer)
                .ok_or_else(|| invalid(path, &format!("$ref {reference} points nowhere")))?
        };
        let hint = reference.rsplit('/').next().unwrap_or("ref");
        let name = self.reserve(hint)?;
        self.refs.insert(reference.to_owned(), name.clone());
        let body = self.schema_at(target, root, reference, depth + 1)?;
        self.define(name.clone(), body);
        Ok(name)
    }

    fn typed(
        &mut self,
        kind: &str,
        object: &Map<String, Value>,
        root: &Value,
        path: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let numeric_bounds = ["minimum", "maximum"]
            .iter()
            .any(|k| object.contains_key(*k));
        match kind {
            "string" => self.string(object, path),
            "integer" => {
                if object.contains_key("maximum") {
                    return Err(unsupported(path, "maximum"));
                }
                let minimum = match object.get("minimum") {
                    None => None,
                    Some(v) => match v.as_f64() {
                        Some(m) if m <= f64::from(i32::MIN) => None,
                        Some(0.0) => Some(0),
                        Some(1.0) => Some(1),
                        _ => return Err(unsupported(path, "minimum (other than 0 or 1)")),
                    },
                };
                self.integer(minimum)
            }
            "number" => {
                if object.contains_key("maximum") {
                    return Err(unsupported(path, "maximum"));
                }
                let non_negative = match object.get("minimum").and_then(Value::as_f64) {
                    None if !numeric_bounds => false,
                    Some(0.0) => true,
                    _ => return Err(unsupported(path, "minimum (other than 0)")),
                };
                self.number(non_negative)
            }
            "boolean" => Ok(r#"( "true" | "false" )"#.to_owned()),
            "null" => Ok(r#""null""#.to_owned()),
            "object" => self.object(object, root, path, depth),
            "array" => self.array(object, root, path, depth),
            other => Err(invalid(path, &format!("unknown type {other:?}"))),
        }
    }

    fn string(&mut self, object: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let min = bound(object, "minLength", path)?.unwrap_or(0);
        let max = bound(object, "maxLength", path)?;
        if min == 0 && max.is_none() {
            return self.any_string();
        }
        if let Some(max) = max {
            if max > MAX_STRING_LENGTH_BOUND {
                return Err(unsupported(
                    path,
                    &format!("maxLength above {MAX_STRING_LENGTH_BOUND}"),
                ));
            }
            if max < min {
                return Err(invalid(path, "maxLength is below minLength"));
            }
        }
        if min > MAX_STRING_LENGTH_BOUND {
            return Err(unsupported(
                path,
                &format!("minLength above {MAX_STRING_LENGTH_BOUND}"),
            ));
        }
        let c = self.string_char()?;
        let repeat = match max {
            Some(max) => format!("{{{min},{max}}}"),
            None => format!("{{{min},}}"),
        };
        self.rule("string", format!(r#""\"" {c}{repeat} "\"""#))
    }

    fn object(
        &mut self,
        object: &Map<String, Value>,
        root: &Value,
        path: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let ws = self.ws()?;
        let properties = match object.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return Err(invalid(path, "properties must be an object")),
        };
        let required: Vec<&str> = match object.get("required") {
            None => Vec::new(),
            Some(Value::Array(names)) => names
                .iter()
                .map(|n| {
                    n.as_str()
                        .ok_or_else(|| invalid(path, "required must list property names"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid(path, "required must be an array")),
        };
        let properties = match properties {
            Some(p) if !p.is_empty() => p,
            _ => {
                if !required.is_empty() {
                    return Err(invalid(
                        path,
                        "required names properties that are not declared",
                    ));
                }
                // A map: values follow `additionalProperties` when it is a schema.
                return match object.get("additionalProperties") {
                    Some(extra @ Value::Object(_)) => {
                        let value = self.schema_at(
                            extra,
                            root,
                            &format!("{path}/additionalProperties"),
                            depth + 1,
                        )?;
                        let key = self.any_string()?;
                        let pair = format!(r#"{key} {ws} ":" {ws} {value}"#);
                        self.rule(
                            "map",
                            format!(r#""{{" {ws} ( {pair} ( {ws} "," {ws} {pair} )* )? {ws} "}}""#),
                        )
                    }
                    Some(Value::Bool(false)) => Ok(format!(r#""{{" {ws} "}}""#)),
                    _ => self.any_object(),
                };
            }
        };
        for name in &required {
            if !properties.contains_key(*name) {
                return Err(invalid(
                    path,
                    &format!("required property {name:?} is not declared"),
                ));
            }
        }
        // One `key: value` expression per property, in schema order.
        let mut pairs = Vec::with_capacity(properties.len());
        for (name, schema) in properties {
            let value = self.schema_at(
                schema,
                root,
                &format!("{path}/properties/{name}"),
                depth + 1,
            )?;
            let key = literal(&json_text(&Value::String(name.clone())));
            pairs.push((
                required.contains(&name.as_str()),
                format!("{key} {ws} \":\" {ws} {value}"),
            ));
        }
        // `rest(i)`: the properties from i on, once one has been written
        // (each preceded by a comma); `first(i)`: from i on, none written yet.
        let rest = |from: usize| -> String {
            pairs[from..]
                .iter()
                .map(|(required, pair)| {
                    if *required {
                        format!(r#"{ws} "," {ws} {pair}"#)
                    } else {
                        format!(r#"( {ws} "," {ws} {pair} )?"#)
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let first_required = pairs.iter().position(|(required, _)| *required);
        // Build `first(i)` from the end: optional properties before the
        // first required one may each be the one written first.
        let limit = first_required.map_or(pairs.len(), |i| i + 1);
        let mut alternatives = Vec::new();
        for (i, (_, pair)) in pairs.iter().enumerate().take(limit) {
            alternatives.push(format!("{pair} {}", rest(i + 1)).trim().to_owned());
        }
        let body = alternatives.join(" | ");
        let inner = if first_required.is_some() {
            format!("( {body} )")
        } else {
            format!("( {body} )?")
        };
        self.rule("object", format!(r#""{{" {ws} {inner} {ws} "}}""#))
    }

    fn array(
        &mut self,
        object: &Map<String, Value>,
        root: &Value,
        path: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let ws = self.ws()?;
        let item = match object.get("items") {
            None => self.any_value()?,
            Some(items) => self.schema_at(items, root, &format!("{path}/items"), depth + 1)?,
        };
        let min = bound(object, "minItems", path)?.unwrap_or(0);
        let max = bound(object, "maxItems", path)?;
        if min > MAX_ITEMS_BOUND || max.is_some_and(|m| m > MAX_ITEMS_BOUND) {
            return Err(unsupported(
                path,
                &format!("minItems or maxItems above {MAX_ITEMS_BOUND}"),
            ));
        }
        if max.is_some_and(|m| m < min) {
            return Err(invalid(path, "maxItems is below minItems"));
        }
        let more = format!(r#"{ws} "," {ws} {item}"#);
        let body = match (min, max) {
            (_, Some(0)) => String::new(),
            (0, None) => format!("( {item} ( {more} )* )?"),
            (0, Some(max)) => format!("( {item} ( {more} ){{0,{}}} )?", max - 1),
            (min, None) => format!("{item} ( {more} ){{{},}}", min - 1),
            (min, Some(max)) => format!("{item} ( {more} ){{{},{}}}", min - 1, max - 1),
        };
        self.rule("array", format!(r#""[" {ws} {body} {ws} "]""#))
    }

    /// The finished grammar: `root ::= root_expr` plus every rule.
    pub fn finish(self, root_expr: &str) -> Grammar {
        let mut text = format!("{} ::= {root_expr}\n", Grammar::ROOT);
        for (name, body) in &self.rules {
            text.push_str(name);
            text.push_str(" ::= ");
            text.push_str(body);
            text.push('\n');
        }
        Grammar { text }
    }
}

fn bound(object: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, SchemaError> {
    match object.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| invalid(path, &format!("{key} must be a non-negative integer"))),
    }
}

fn invalid(path: &str, reason: &str) -> SchemaError {
    SchemaError::Invalid {
        path: path.to_owned(),
        reason: reason.to_owned(),
    }
}

fn unsupported(path: &str, keyword: &str) -> SchemaError {
    SchemaError::Unsupported {
        path: path.to_owned(),
        keyword: keyword.to_owned(),
    }
}

/// Compact JSON text of a value.
pub fn json_text(value: &Value) -> String {
    value.to_string()
}

/// A GBNF string literal matching `text` exactly.
pub fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02X}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A grammar for one JSON value matching `schema`.
pub fn schema_grammar(schema: &Value) -> Result<Grammar, SchemaError> {
    let mut builder = GrammarBuilder::new();
    let root = builder.schema(schema, schema)?;
    Ok(builder.finish(&root))
}

/// A grammar for any JSON object (`response_format: json_object`).
pub fn json_object_grammar() -> Grammar {
    let mut builder = GrammarBuilder::new();
    // Building the fixed generic rules cannot exceed any limit.
    match builder.any_object() {
        Ok(root) => builder.finish(&root),
        Err(_) => Grammar {
            text: format!(r#"{} ::= "{{}}""#, Grammar::ROOT),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literal_escapes_quotes_backslashes_and_controls() {
        assert_eq!(literal(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(literal("x\ny\u{1}"), r#""x\ny\x01""#);
    }

    #[test]
    fn object_with_required_and_optional_properties() {
        let grammar = schema_grammar(&json!({
            "type": "object",
            "properties": {
                "a": {"type": "string"},
                "b": {"type": "integer"},
                "c": {"type": "boolean"}
            },
            "required": ["b"],
            "additionalProperties": false
        }))
        .unwrap();
        insta::assert_snapshot!(grammar.text);
    }

    #[test]
    fn refuses_what_it_cannot_enforce() {
        for (schema, keyword) in [
            (json!({"type": "string", "pattern": "^a"}), "pattern"),
            (json!({"allOf": [{"type": "string"}]}), "allOf"),
            (json!({"type": "integer", "maximum": 3}), "maximum"),
        ] {
            match schema_grammar(&schema) {
                Err(SchemaError::Unsupported { keyword: k, .. }) => assert!(k.contains(keyword)),
                other => panic!("{schema}: {other:?}"),
            }
        }
        assert!(matches!(
            schema_grammar(&json!({"type": "object", "properties": {}, "required": ["x"]})),
            Err(SchemaError::Invalid { .. })
        ));
    }

    #[test]
    fn recursive_refs_become_recursive_rules() {
        let grammar = schema_grammar(&json!({
            "$defs": {"node": {"type": "object", "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            }, "required": ["name", "children"]}},
            "$ref": "#/$defs/node"
        }))
        .unwrap();
        assert!(
            grammar.text.starts_with("root ::= node\n"),
            "{}",
            grammar.text
        );
        assert!(grammar.text.contains("node ::= "));
    }

    #[test]
    fn deep_schemas_are_refused() {
        let mut schema = json!({"type": "string"});
        for _ in 0..40 {
            schema = json!({"type": "array", "items": schema});
        }
        assert_eq!(schema_grammar(&schema), Err(SchemaError::TooDeep));
    }
}
