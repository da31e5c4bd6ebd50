//! Variables as GitLab's clients send them, made acceptable to juniper: a value
//! of GitLab's `JSON` scalar may be any JSON (the VS Code extension sends
//! `additionalContext[].metadata` as an object), while juniper only lets
//! scalars through as scalars. Objects and arrays at `JSON` positions
//! (found through the operation's variable types and the input objects they
//! name) are serialised with [`JSON_MARKER`], which the scalar turns back.

use juniper::meta::MetaType;
use juniper::{DefaultScalarValue, Definition};
use serde_json::Value;

use std::sync::Arc;

use super::Schema;
use super::document_cache::DocumentCache;
use super::scalars::JSON_MARKER;

/// How deep input objects may nest before the walk stops (juniper refuses
/// deeper documents anyway).
const MAX_DEPTH: usize = 32;

/// Rewrites `JSON`-typed values in `variables` for `query`'s operation.
pub fn normalize_json_variables(
    schema: &Schema,
    query: &str,
    operation_name: Option<&str>,
    variables: &mut Value,
) {
    let Value::Object(vars) = variables else {
        return;
    };
    if vars.is_empty() {
        return;
    }
    let declared = DECLARED.get_or_learn(query, operation_name, || {
        declared_variables(schema, query, operation_name)
    });
    for variable in declared.iter() {
        if let Some(value) = vars.get_mut(&variable.name) {
            walk(schema, value, &variable.type_name, variable.lists, 0);
        }
    }
}

/// A variable an operation declares: the innermost name of its type and how
/// many list levels wrap it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Declared {
    name: String,
    type_name: String,
    lists: usize,
}

/// The variables of documents, by text and operation name.
static DECLARED: std::sync::LazyLock<DocumentCache<Arc<[Declared]>>> =
    std::sync::LazyLock::new(Default::default);

/// The variables `query` declares for `operation_name` (every operation's
/// when none is named, or the document's only one is unnamed); none when it
/// does not parse (juniper answers it with the parse error).
fn declared_variables(
    schema: &Schema,
    query: &str,
    operation_name: Option<&str>,
) -> Arc<[Declared]> {
    let Ok(document) =
        juniper::parser::parse_document_source::<DefaultScalarValue>(query, &schema.schema)
    else {
        return Arc::default();
    };
    let mut declared = Vec::new();
    for definition in &document {
        let Definition::Operation(op) = definition else {
            continue;
        };
        let name = op.item.name.as_ref().map(|n| n.item);
        if operation_name.is_some() && name.is_some() && name != operation_name {
            continue;
        }
        let Some(defs) = &op.item.variables_definition else {
            continue;
        };
        for (var_name, def) in defs.item.iter() {
            let ty = &def.var_type.item;
            declared.push(Declared {
                name: var_name.item.to_owned(),
                type_name: ty.innermost_name().to_owned(),
                lists: lists(&ty.to_string()),
            });
        }
    }
    declared.into()
}

/// How many list levels a type has, from its GraphQL spelling (`[[X!]]` has two).
fn lists(spelled: &str) -> usize {
    spelled.matches('[').count()
}

fn walk(schema: &Schema, value: &mut Value, type_name: &str, list_depth: usize, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    if list_depth > 0
        && let Value::Array(items) = value
    {
        for item in items {
            walk(schema, item, type_name, list_depth - 1, depth + 1);
        }
        return;
    }
    if type_name == "JSON" {
        if matches!(value, Value::Object(_) | Value::Array(_)) {
            *value = Value::String(format!("{JSON_MARKER}{value}"));
        }
        return;
    }
    let Some(MetaType::InputObject(input)) = schema.schema.concrete_type_by_name(type_name) else {
        return;
    };
    let Value::Object(fields) = value else {
        return;
    };
    for field in &input.input_fields {
        if let Some(inner) = fields.get_mut(field.name.as_str()) {
            walk(
                schema,
                inner,
                field.arg_type.innermost_name(),
                lists(&field.arg_type.to_string()),
                depth + 1,
            );
        }
    }
}
