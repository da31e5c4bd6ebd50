//! Size limits of the request schemas, enforced while a body is parsed: an
//! array stops being read at its limit (so a body of a hundred thousand tiny
//! items costs no more than the limit's worth of them), a string over its limit
//! fails the parse. The numbers are documented in `docs/configuration.md`
//! ("Request limits"); the totals (all text together) are checked by the
//! gateway after parsing.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// Messages (history plus the question) in one agent request.
pub const MAX_MESSAGES: usize = 200;
/// Characters of one message's content.
pub const MAX_MESSAGE_CONTENT: usize = 400_000;
/// Additional-context items of one message.
pub const MAX_CONTEXT_ITEMS: usize = 100;
/// Characters of one additional-context item's content (GitLab's limit).
pub const MAX_CONTEXT_CONTENT: usize = 600_000;
/// Characters of ids, categories, file paths and similar short fields.
pub const MAX_SHORT_FIELD: usize = 1_000;
/// Keys of one additional-context item's metadata object.
pub const MAX_METADATA_KEYS: usize = 64;
/// Characters of the page resource's content or the current file's data.
pub const MAX_RESOURCE_CONTENT: usize = 1_000_000;
/// Scratchpad steps of one agent request (the monolith stops at 10).
pub const MAX_SCRATCHPAD_STEPS: usize = 50;
/// Characters of a step's thought, tool or tool input.
pub const MAX_STEP_FIELD: usize = 20_000;
/// Characters of a step's observation.
pub const MAX_OBSERVATION: usize = 400_000;
/// Entries of `unavailable_resources`.
pub const MAX_UNAVAILABLE_RESOURCES: usize = 20;
/// Inputs of one prompt invocation.
pub const MAX_PROMPT_INPUTS: usize = 64;

/// A `Vec<T>` of at most `MAX` elements.
pub fn vec_max<'de, D, T, const MAX: usize>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T, const MAX: usize>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>, const MAX: usize> Visitor<'de> for Bounded<T, MAX> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a list of at most {MAX} items")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX).min(64));
            while let Some(item) = seq.next_element()? {
                if items.len() == MAX {
                    return Err(de::Error::custom(format_args!(
                        "a list of at most {MAX} items is allowed"
                    )));
                }
                items.push(item);
            }
            Ok(items)
        }
    }

    deserializer.deserialize_seq(Bounded::<T, MAX>(PhantomData))
}

/// An optional list of at most `MAX` elements (`null` or absent is `None`).
pub fn opt_vec_max<'de, D, T, const MAX: usize>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct OptVisitor<T, const MAX: usize>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>, const MAX: usize> Visitor<'de> for OptVisitor<T, MAX> {
        type Value = Option<Vec<T>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "null or a list of at most {MAX} items")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            vec_max::<D2, T, MAX>(d).map(Some)
        }
    }
    deserializer.deserialize_option(OptVisitor::<T, MAX>(PhantomData))
}

/// A string of at most `MAX` characters.
pub fn string_max<'de, D, const MAX: usize>(deserializer: D) -> Result<String, D::Error>
where
    D: Deserializer<'de>,
{
    let s = String::deserialize(deserializer)?;
    check_len::<D::Error, MAX>(&s)?;
    Ok(s)
}

/// An optional string of at most `MAX` characters.
pub fn opt_string_max<'de, D, const MAX: usize>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
{
    let s = Option::<String>::deserialize(deserializer)?;
    if let Some(s) = &s {
        check_len::<D::Error, MAX>(s)?;
    }
    Ok(s)
}

fn check_len<E: de::Error, const MAX: usize>(s: &str) -> Result<(), E> {
    // Bytes bound characters from above: only count when it could matter.
    if s.len() > MAX && s.chars().count() > MAX {
        return Err(E::custom(format_args!(
            "a text of at most {MAX} characters is allowed"
        )));
    }
    Ok(())
}

/// A JSON object of at most `MAX` keys.
pub fn map_max<'de, D, const MAX: usize>(
    deserializer: D,
) -> Result<serde_json::Map<String, serde_json::Value>, D::Error>
where
    D: Deserializer<'de>,
{
    struct Bounded<const MAX: usize>;

    impl<'de, const MAX: usize> Visitor<'de> for Bounded<MAX> {
        type Value = serde_json::Map<String, serde_json::Value>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "an object of at most {MAX} keys")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = serde_json::Map::new();
            while let Some((key, value)) = map.next_entry::<String, serde_json::Value>()? {
                if out.len() == MAX {
                    return Err(de::Error::custom(format_args!(
                        "an object of at most {MAX} keys is allowed"
                    )));
                }
                out.insert(key, value);
            }
            Ok(out)
        }
    }

    deserializer.deserialize_map(Bounded::<MAX>)
}

/// An optional JSON object of at most `MAX` keys.
pub fn opt_map_max<'de, D, const MAX: usize>(
    deserializer: D,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, D::Error>
where
    D: Deserializer<'de>,
{
    struct OptVisitor<const MAX: usize>;
    impl<'de, const MAX: usize> Visitor<'de> for OptVisitor<MAX> {
        type Value = Option<serde_json::Map<String, serde_json::Value>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "null or an object of at most {MAX} keys")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            map_max::<D2, MAX>(d).map(Some)
        }
    }
    deserializer.deserialize_option(OptVisitor::<MAX>)
}
