//! The two things the proxy reads from a request body, the model and
//! whether to stream, found in one pass without building the JSON document:
//! the body goes upstream as it came, so the rest of it is only checked to
//! be JSON. (Parsed into a `serde_json::Value`, every string and object of a
//! long prompt was allocated and dropped again on each call.)

use std::borrow::Cow;
use std::fmt;

use serde::Deserializer as _;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// What [`read`] found at the top level of a body.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BodyFacts<'a> {
    /// `model`, when it is a string (the last one, if the key repeats).
    pub model: Option<Cow<'a, str>>,
    /// `stream` is the boolean `true`.
    pub stream: bool,
}

/// The facts of a body holding exactly one JSON value; `None` when it does
/// not (malformed, empty, or followed by more than whitespace). A value that
/// is not an object has neither fact.
pub fn read(body: &[u8]) -> Option<BodyFacts<'_>> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let facts = (&mut de).deserialize_any(TopLevel).ok()?;
    de.end().ok()?;
    Some(facts)
}

/// A top-level value: an object is searched, anything else is skipped.
struct TopLevel;

impl<'de> Visitor<'de> for TopLevel {
    type Value = BodyFacts<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut facts = BodyFacts::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match key {
                Key::Model => facts.model = map.next_value_seed(ScalarSeed)?.into_str(),
                Key::Stream => facts.stream = map.next_value_seed(ScalarSeed)? == Scalar::True,
                Key::Other => map.next_value_seed(Skip)?,
            }
        }
        Ok(facts)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq).map(|()| BodyFacts::default())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(BodyFacts::default())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(BodyFacts::default())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(BodyFacts::default())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(BodyFacts::default())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(BodyFacts::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(BodyFacts::default())
    }
}

fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element_seed(Skip)?.is_some() {}
    Ok(())
}

fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_key_seed(KeySeed)?.is_some() {
        map.next_value_seed(Skip)?;
    }
    Ok(())
}

/// A value passed over. It goes through `deserialize_any`, as a whole
/// document does, so the parser's nesting limit applies alike (serde's
/// `IgnoredAny` takes a path without that limit).
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        skip_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        skip_map(map)
    }
}

/// The keys the proxy looks for; compared after unescaping, as
/// `serde_json::Value` would.
enum Key {
    Model,
    Stream,
    Other,
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Key, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
        Ok(match key {
            "model" => Key::Model,
            "stream" => Key::Stream,
            _ => Key::Other,
        })
    }
}

/// A looked-up value: kept only when it is a string or `true`.
#[derive(PartialEq)]
enum Scalar<'a> {
    Str(Cow<'a, str>),
    True,
    Other,
}

impl<'a> Scalar<'a> {
    fn into_str(self) -> Option<Cow<'a, str>> {
        match self {
            Self::Str(text) => Some(text),
            Self::True | Self::Other => None,
        }
    }
}

struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar<'de>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ScalarSeed {
    type Value = Scalar<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Borrowed(text)))
    }

    // A string with escapes arrives unescaped in a buffer of the parser's.
    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(text.to_owned())))
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Self::Value, E> {
        Ok(if value { Scalar::True } else { Scalar::Other })
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq).map(|()| Scalar::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map).map(|()| Scalar::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the proxy read before, from the whole document.
    fn from_document(body: &[u8]) -> Option<(Option<String>, bool)> {
        let json: serde_json::Value = serde_json::from_slice(body).ok()?;
        Some((
            json.get("model")
                .and_then(|m| m.as_str())
                .map(str::to_owned),
            json.get("stream").and_then(|s| s.as_bool()) == Some(true),
        ))
    }

    #[test]
    fn the_facts_are_what_the_whole_document_says() {
        let bodies: &[&str] = &[
            r#"{"model":"claude-3-5-sonnet-20240620","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            r#"{"messages":[{"model":"nested","stream":true}],"max_tokens":5}"#,
            r#"{"model":"cl\u0061ude-\"x\"","stream":false}"#,
            r#"{"model":7,"stream":"true"}"#,
            r#"{"model":null,"stream":1}"#,
            r#"{"model":{"name":"claude"},"stream":[true]}"#,
            r#"{"model":["claude"],"stream":{"on":true}}"#,
            r#"{"model":"first","model":"second","stream":true,"stream":false}"#,
            r#"{"model":"first","model":3}"#,
            r#"{"mo\u0064el":"escaped key","str\u0065am":true}"#,
            r#"  {"model" : "spaced" , "stream" : true }  "#,
            r#"{}"#,
            r#"[]"#,
            r#"["model","claude",true]"#,
            r#""model""#,
            r#"12.5e3"#,
            r#"-3"#,
            r#"true"#,
            r#"null"#,
            r#"{"model":"claude","x":{"deep":[1,2,{"a":null}]},"stream":true}"#,
            // Not one JSON value: refused.
            "",
            "   ",
            r#"{"model":"claude""#,
            r#"{"model":"claude"} {}"#,
            r#"{"model":"claude",}"#,
            r#"{model:"claude"}"#,
            r#"{"model":"claude"}x"#,
            "{\"model\":\"cl\u{0}aude\"}",
            r#"{"model":"\ud800"}"#,
            r#"[1,2"#,
            r#"nul"#,
        ];
        // Nesting deeper than the parser's limit is refused either way.
        let deep = |depth: usize| {
            format!(
                r#"{{"model":"claude","x":{}{}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        let nested = [
            deep(100),
            deep(126),
            deep(127),
            deep(128),
            deep(200),
            deep(5000),
        ];
        let bodies = bodies
            .iter()
            .copied()
            .chain(nested.iter().map(String::as_str));
        for body in bodies {
            let expected = from_document(body.as_bytes());
            let found =
                read(body.as_bytes()).map(|facts| (facts.model.map(Cow::into_owned), facts.stream));
            assert_eq!(found, expected, "body {body:?}");
        }
    }

    #[test]
    fn a_plain_model_name_is_borrowed_from_the_body() {
        let facts = read(br#"{"model":"claude-3-haiku","stream":true}"#).unwrap();
        assert!(matches!(facts.model, Some(Cow::Borrowed("claude-3-haiku"))));
        assert!(facts.stream);
    }

    #[test]
    fn bytes_that_are_not_utf8_are_not_json() {
        assert_eq!(read(b"{\"model\":\"\xff\"}"), None);
        assert_eq!(from_document(b"{\"model\":\"\xff\"}"), None);
    }
}
