//! What a GraphQL request may cost before it runs, measured on the document with
//! its fragment spreads expanded (a fragment spread ten times counts ten times),
//! for HTTP documents, each document of a batch (whose costs add up), and
//! documents sent over WebSocket subscriptions.
//!
//! The numbers follow GitLab's schema: depth 15 for anonymous callers and 20
//! for signed-in users, complexity (fields after expansion) 200 / 250 / 300 for
//! anonymous users, signed-in users and admins. Introspection may nest its
//! list fields (`fields`, `interfaces`, `possibleTypes`, `inputFields`) at most
//! three deep, the rule graphql-js applies: the standard introspection query
//! needs two, and each further level multiplies the answer by the size of the
//! schema. The expansion is computed once per fragment, so the check takes time
//! linear in the document's size however much it would expand.

use std::collections::{HashMap, HashSet};

use juniper::{DefaultScalarValue, Definition, Selection};

use super::Schema;

/// Largest query document accepted, in bytes.
pub const MAX_QUERY_BYTES: usize = 20_000;
/// Deepest field nesting for anonymous callers (GitLab's default).
pub const MAX_QUERY_DEPTH: usize = 15;
/// Deepest field nesting for signed-in users.
pub const MAX_AUTHENTICATED_QUERY_DEPTH: usize = 20;
/// Most fields after fragment expansion, anonymous callers (GitLab's default).
pub const MAX_QUERY_COMPLEXITY: usize = 200;
/// Most fields after fragment expansion, signed-in users.
pub const MAX_AUTHENTICATED_QUERY_COMPLEXITY: usize = 250;
/// Most fields after fragment expansion, admins.
pub const MAX_ADMIN_QUERY_COMPLEXITY: usize = 300;
/// Deepest nesting of introspection's list fields.
pub const MAX_INTROSPECTION_LIST_DEPTH: usize = 3;
/// Most operations in one batched request (a JSON array of requests).
pub const MAX_BATCH_SIZE: usize = 10;
/// Largest answer for anonymous callers, in bytes.
pub const MAX_ANONYMOUS_RESPONSE_BYTES: usize = 1024 * 1024;
/// Largest answer for signed-in users, in bytes.
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// Juniper's own parser limits, a second line behind [`check_document`]: they also
/// hold for documents this module never sees.
pub const PARSER_MAX_DEPTH: usize = 40;
pub const PARSER_MAX_TOKENS: usize = 6_000;
pub const PARSER_MAX_FIELDS: usize = 5_000;

/// The schema documents are parsed with for measuring: the same types, but no
/// field limit in the parser, so an oversized expansion is counted and reported
/// in GitLab's words instead of stopping the parse. (juniper's parser walks the
/// expansion in linear time, so this costs nothing more.)
static MEASURING: std::sync::LazyLock<Schema> = std::sync::LazyLock::new(|| {
    Schema::new(super::Query, super::Mutation, super::Subscription)
        .limit_depth(PARSER_MAX_DEPTH)
        .limit_tokens(PARSER_MAX_TOKENS)
        .limit_fields(usize::MAX)
});

/// Who is asking, which decides the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    Anonymous,
    User,
    Admin,
}

impl Caller {
    pub fn max_depth(self) -> usize {
        match self {
            Caller::Anonymous => MAX_QUERY_DEPTH,
            Caller::User | Caller::Admin => MAX_AUTHENTICATED_QUERY_DEPTH,
        }
    }

    pub fn max_complexity(self) -> usize {
        match self {
            Caller::Anonymous => MAX_QUERY_COMPLEXITY,
            Caller::User => MAX_AUTHENTICATED_QUERY_COMPLEXITY,
            Caller::Admin => MAX_ADMIN_QUERY_COMPLEXITY,
        }
    }

    pub fn max_response_bytes(self) -> usize {
        match self {
            Caller::Anonymous => MAX_ANONYMOUS_RESPONSE_BYTES,
            Caller::User | Caller::Admin => MAX_RESPONSE_BYTES,
        }
    }
}

/// A refused request: the GraphQL error code and the message the client reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitError {
    pub code: &'static str,
    pub message: String,
}

impl LimitError {
    fn new(code: &'static str, message: String) -> Self {
        Self { code, message }
    }
}

/// The cost of one document (its costliest operation, or the named one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    pub depth: usize,
    pub complexity: usize,
    pub introspection_list_depth: usize,
}

/// Measures a document (once per text and operation name: the result is
/// kept). A document that does not parse costs nothing here: the executor
/// answers it with its own parse error, bounded by the parser limits.
pub fn measure(query: &str, operation_name: Option<&str>) -> Result<Cost, LimitError> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(LimitError::new(
            "QUERY_TOO_LARGE",
            format!("Query is too large (maximum is {MAX_QUERY_BYTES} bytes)"),
        ));
    }
    COSTS.get_or_learn(query, operation_name, || {
        measure_parsed(query, operation_name)
    })
}

/// What documents cost, by text and operation name.
static COSTS: std::sync::LazyLock<super::document_cache::DocumentCache<Result<Cost, LimitError>>> =
    std::sync::LazyLock::new(Default::default);

fn measure_parsed(query: &str, operation_name: Option<&str>) -> Result<Cost, LimitError> {
    let document = match juniper::parser::parse_document_source::<DefaultScalarValue>(
        query,
        &MEASURING.schema,
    ) {
        Ok(document) => document,
        // The parser's own limits are refusals too; other parse errors are
        // reported by the executor in GraphQL's usual words.
        Err(e) => {
            let text = e.item.to_string();
            if text.contains("exceeds the limit") {
                return Err(LimitError::new("QUERY_TOO_COMPLEX", text));
            }
            return Ok(Cost::default());
        }
    };
    Ok(Expander::new(&document).cost(operation_name))
}

/// Checks one document against the caller's limits.
pub fn check_document(
    caller: Caller,
    query: &str,
    operation_name: Option<&str>,
) -> Result<Cost, LimitError> {
    let cost = measure(query, operation_name)?;
    check_cost(caller, cost)?;
    Ok(cost)
}

/// Checks a measured cost (a document's, or a batch's sum) against the limits.
pub fn check_cost(caller: Caller, cost: Cost) -> Result<(), LimitError> {
    if cost.depth > caller.max_depth() {
        return Err(LimitError::new(
            "QUERY_TOO_DEEP",
            format!(
                "Query has depth of {}, which exceeds max depth of {}",
                cost.depth,
                caller.max_depth()
            ),
        ));
    }
    if cost.complexity > caller.max_complexity() {
        return Err(LimitError::new(
            "QUERY_TOO_COMPLEX",
            format!(
                "Query has complexity of {}, which exceeds max complexity of {}",
                cost.complexity,
                caller.max_complexity()
            ),
        ));
    }
    if cost.introspection_list_depth > MAX_INTROSPECTION_LIST_DEPTH {
        return Err(LimitError::new(
            "QUERY_TOO_DEEP",
            "Maximum introspection depth exceeded".to_owned(),
        ));
    }
    Ok(())
}

/// Checks the batch size and the summed cost of a batch (the deepest document
/// counts for depth; complexity adds up, as one request does the work of all).
pub fn check_batch(caller: Caller, documents: &[(&str, Option<&str>)]) -> Result<(), LimitError> {
    if documents.len() > MAX_BATCH_SIZE {
        return Err(LimitError::new(
            "BATCH_TOO_LARGE",
            format!(
                "Batch has {} queries, which exceeds the maximum of {MAX_BATCH_SIZE}",
                documents.len()
            ),
        ));
    }
    let mut total = Cost::default();
    for (query, operation) in documents {
        let cost = check_document(caller, query, *operation)?;
        total.depth = total.depth.max(cost.depth);
        total.complexity = total.complexity.saturating_add(cost.complexity);
        total.introspection_list_depth = total
            .introspection_list_depth
            .max(cost.introspection_list_depth);
    }
    check_cost(caller, total)
}

/// Introspection fields that return lists of schema parts: nesting them is what
/// makes an introspection answer grow with the schema's size to a power.
fn is_introspection_list(name: &str) -> bool {
    matches!(
        name,
        "fields" | "interfaces" | "possibleTypes" | "inputFields"
    )
}

type Selections<'a> = [Selection<'a, DefaultScalarValue>];

/// Cost of a selection set relative to where it sits; fragments memoized.
struct Expander<'a, 'd> {
    document: &'d [Definition<'a, DefaultScalarValue>],
    fragments: HashMap<&'a str, &'d Selections<'a>>,
    done: HashMap<&'a str, Cost>,
    open: HashSet<&'a str>,
}

impl<'a, 'd> Expander<'a, 'd> {
    fn new(document: &'d [Definition<'a, DefaultScalarValue>]) -> Self {
        let fragments = document
            .iter()
            .filter_map(|d| match d {
                Definition::Fragment(f) => {
                    Some((f.item.name.item, f.item.selection_set.as_slice()))
                }
                Definition::Operation(_) => None,
            })
            .collect();
        Self {
            document,
            fragments,
            done: HashMap::new(),
            open: HashSet::new(),
        }
    }

    /// The named operation's cost, or the costliest operation's when no name is
    /// given (or the name matches none: the executor then refuses the request).
    fn cost(mut self, operation_name: Option<&str>) -> Cost {
        let mut worst = Cost::default();
        for definition in self.document {
            let Definition::Operation(op) = definition else {
                continue;
            };
            let named = op.item.name.as_ref().map(|n| n.item);
            if operation_name.is_some() && named.is_some() && named != operation_name {
                continue;
            }
            let cost = self.selections(&op.item.selection_set);
            worst.depth = worst.depth.max(cost.depth);
            worst.complexity = worst.complexity.max(cost.complexity);
            worst.introspection_list_depth = worst
                .introspection_list_depth
                .max(cost.introspection_list_depth);
        }
        worst
    }

    fn selections(&mut self, selections: &'d Selections<'a>) -> Cost {
        let mut total = Cost::default();
        for selection in selections {
            let part = match selection {
                Selection::Field(field) => {
                    let child = match &field.item.selection_set {
                        Some(nested) => self.selections(nested),
                        None => Cost::default(),
                    };
                    Cost {
                        depth: child.depth.saturating_add(1),
                        complexity: child.complexity.saturating_add(1),
                        introspection_list_depth: child.introspection_list_depth
                            + usize::from(is_introspection_list(field.item.name.item)),
                    }
                }
                Selection::InlineFragment(inline) => self.selections(&inline.item.selection_set),
                Selection::FragmentSpread(spread) => self.fragment(spread.item.name.item),
            };
            total.depth = total.depth.max(part.depth);
            total.complexity = total.complexity.saturating_add(part.complexity);
            total.introspection_list_depth = total
                .introspection_list_depth
                .max(part.introspection_list_depth);
        }
        total
    }

    fn fragment(&mut self, name: &'a str) -> Cost {
        if let Some(cost) = self.done.get(name) {
            return *cost;
        }
        // A cycle or an unknown fragment: validation refuses the document.
        if !self.open.insert(name) {
            return Cost::default();
        }
        let Some(selections) = self.fragments.get(name).copied() else {
            return Cost::default();
        };
        let cost = self.selections(selections);
        self.open.remove(name);
        self.done.insert(name, cost);
        cost
    }
}

/// Whether any string in a JSON value (keys included) holds a NUL character:
/// PostgreSQL cannot store one, so it is refused before anything runs.
pub fn json_has_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(json_has_nul),
        serde_json::Value::Object(map) => {
            map.iter().any(|(k, v)| k.contains('\0') || json_has_nul(v))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(query: &str) -> Cost {
        measure(query, None).unwrap()
    }

    #[test]
    fn depth_and_complexity_count_fields() {
        let c = cost("query { currentUser { id username } }");
        assert_eq!(c.depth, 2);
        assert_eq!(c.complexity, 3);
        let deep = format!("query {}{}", "{ a ".repeat(21), "}".repeat(21));
        let c = cost(&deep);
        assert_eq!(c.depth, 21);
        assert_eq!(
            check_cost(Caller::User, c).unwrap_err().code,
            "QUERY_TOO_DEEP"
        );
    }

    #[test]
    fn fragments_are_expanded_once_per_spread() {
        // Each fragment spreads the next five times: 5^4 copies of `name`.
        let mut query = String::from("query { __schema { types { ...F0 } } }");
        for level in 0..4 {
            let next = level + 1;
            query.push_str(&format!(
                " fragment F{level} on __Type {{ ...F{next} ...F{next} ...F{next} ...F{next} ...F{next} }}"
            ));
        }
        query.push_str(" fragment F4 on __Type { name }");
        let c = cost(&query);
        assert_eq!(c.complexity, 2 + 625);
        assert_eq!(
            check_cost(Caller::Anonymous, c).unwrap_err().code,
            "QUERY_TOO_COMPLEX"
        );
    }

    #[test]
    fn nested_introspection_lists_are_refused() {
        let query =
            "{ __schema { types { fields { type { fields { type { fields { name } } } } } } } }";
        let c = cost(query);
        assert_eq!(c.introspection_list_depth, 3);
        assert!(check_cost(Caller::Anonymous, c).is_ok());
        let deeper = "{ __schema { types { fields { type { fields { type { fields { type { interfaces { name } } } } } } } } } }";
        let c = cost(deeper);
        assert_eq!(c.introspection_list_depth, 4);
        assert_eq!(
            check_cost(Caller::Admin, c).unwrap_err().message,
            "Maximum introspection depth exceeded"
        );
    }

    #[test]
    fn fragment_cycles_and_unknown_fragments_cost_nothing_extra() {
        let c = cost("query { currentUser { ...A } } fragment A on CurrentUser { id ...A ...B }");
        assert_eq!(c.complexity, 2);
    }

    #[test]
    fn batches_are_bounded_in_size_and_summed_cost() {
        let small = "query { currentUser { id } }";
        let eleven: Vec<(&str, Option<&str>)> = (0..11).map(|_| (small, None)).collect();
        assert_eq!(
            check_batch(Caller::User, &eleven).unwrap_err().code,
            "BATCH_TOO_LARGE"
        );
        let wide = format!("query {{ currentUser {{ {} }} }}", "id ".repeat(70));
        let four: Vec<(&str, Option<&str>)> = (0..4).map(|_| (wide.as_str(), None)).collect();
        let one = check_document(Caller::User, &wide, None).unwrap();
        assert!(one.complexity * 4 > MAX_AUTHENTICATED_QUERY_COMPLEXITY);
        assert_eq!(
            check_batch(Caller::User, &four).unwrap_err().code,
            "QUERY_TOO_COMPLEX"
        );
    }

    #[test]
    fn nul_characters_are_found_anywhere_in_json() {
        assert!(json_has_nul(&serde_json::json!({"a": ["x", "y\u{0}"]})));
        assert!(json_has_nul(&serde_json::json!({"k\u{0}": 1})));
        assert!(!json_has_nul(&serde_json::json!({"a": ["x", 1, null]})));
    }
}
