//! Feature flags with GitLab's (Flipper's) gates: a flag is on for everyone
//! (`boolean`), for named actors (`actors`: users, groups, projects), for a
//! feature group (`groups`), for a stable share of actors
//! (`percentage_of_actors`) or for a share of checks (`percentage_of_time`).
//!
//! - [`registry`]: the flags the code knows and their defaults;
//! - [`store`]: the gates in PostgreSQL (`features`, `feature_gates`);
//! - here: the evaluation, which needs no database.
//!
//! A flag nobody set is as its definition's default (unknown flags: off).
//! Once any gate is set, the gates alone decide, as in GitLab; deleting the
//! flag returns it to its default. Who may change flags is the policy's
//! question (instance admins), asked by the callers.

pub mod registry;
pub mod store;

use std::collections::BTreeSet;

pub use registry::{DEFINITIONS, Definition, FEATURE_GROUPS};
pub use store::{enabled, enabled_flags};

/// Longest flag name.
pub const MAX_NAME_CHARS: usize = 100;

/// Whether `name` may name a flag: lower-case letters, digits and
/// underscores, starting with a letter.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_NAME_CHARS
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Who a flag is asked about. A question's actors are its user and, when it
/// is about a resource, that project and its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagActor {
    User { id: i64, admin: bool },
    Group(i64),
    Project(i64),
}

impl FlagActor {
    /// Flipper's id of the actor, as `actors` gates store it.
    pub fn flipper_id(&self) -> String {
        match self {
            FlagActor::User { id, .. } => format!("User:{id}"),
            FlagActor::Group(id) => format!("Group:{id}"),
            FlagActor::Project(id) => format!("Project:{id}"),
        }
    }

    /// Whether the actor belongs to the feature group `name`.
    fn in_feature_group(&self, name: &str) -> bool {
        match self {
            FlagActor::User { admin, .. } => name == registry::INSTANCE_ADMINS && *admin,
            _ => false,
        }
    }
}

/// GitLab's `state` of a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagState {
    On,
    Off,
    Conditional,
}

impl FlagState {
    pub fn as_str(self) -> &'static str {
        match self {
            FlagState::On => "on",
            FlagState::Off => "off",
            FlagState::Conditional => "conditional",
        }
    }
}

/// The gate values of one stored flag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gates {
    pub boolean: bool,
    /// Flipper ids (`User:1`, `Group:2`, `Project:3`).
    pub actors: BTreeSet<String>,
    /// Feature group names.
    pub groups: BTreeSet<String>,
    pub percentage_of_actors: u8,
    pub percentage_of_time: u8,
}

/// Flipper's resolution of percentages: a share is compared in thousandths
/// of a percent.
const SCALE: u32 = 1_000;

impl Gates {
    /// On for everyone, off for everyone, or depending on who asks (and when).
    pub fn state(&self) -> FlagState {
        if self.boolean || self.percentage_of_time == 100 || self.percentage_of_actors == 100 {
            FlagState::On
        } else if !self.actors.is_empty()
            || !self.groups.is_empty()
            || self.percentage_of_actors > 0
            || self.percentage_of_time > 0
        {
            FlagState::Conditional
        } else {
            FlagState::Off
        }
    }

    /// Whether `flag` with these gates is on for `actors`; `draw` gives a
    /// random number for `percentage_of_time` (asked only when that gate
    /// matters).
    ///
    /// Any actor named in `actors` or belonging to a feature group turns it
    /// on. `percentage_of_actors` looks only at the first actor (a
    /// question's user), so a rollout to 10% of users stays 10% of users
    /// whatever project they ask about.
    pub fn enabled_with(
        &self,
        flag: &str,
        actors: &[FlagActor],
        draw: impl FnOnce() -> u32,
    ) -> bool {
        if self.boolean {
            return true;
        }
        if actors.iter().any(|a| self.actors.contains(&a.flipper_id())) {
            return true;
        }
        if actors
            .iter()
            .any(|a| self.groups.iter().any(|g| a.in_feature_group(g)))
        {
            return true;
        }
        if let Some(first) = actors.first()
            && actor_bucket(flag, first) < u32::from(self.percentage_of_actors) * SCALE
        {
            return true;
        }
        self.percentage_of_time > 0
            && draw() % (100 * SCALE) < u32::from(self.percentage_of_time) * SCALE
    }

    /// [`Gates::enabled_with`] with a random draw.
    pub fn enabled(&self, flag: &str, actors: &[FlagActor]) -> bool {
        self.enabled_with(flag, actors, rand::random::<u32>)
    }

    /// GitLab's gate list: `boolean` always, the others when set.
    pub fn gate_list(&self) -> Vec<(&'static str, serde_json::Value)> {
        let mut gates = vec![("boolean", serde_json::Value::Bool(self.boolean))];
        if !self.actors.is_empty() {
            gates.push(("actors", serde_json::json!(self.actors)));
        }
        if !self.groups.is_empty() {
            gates.push(("groups", serde_json::json!(self.groups)));
        }
        if self.percentage_of_actors > 0 {
            gates.push(("percentage_of_actors", self.percentage_of_actors.into()));
        }
        if self.percentage_of_time > 0 {
            gates.push(("percentage_of_time", self.percentage_of_time.into()));
        }
        gates
    }
}

/// Where an actor falls for a flag, in `0..100 * SCALE`: CRC32 of the flag
/// name followed by the actor's Flipper id, as Flipper computes it, so an
/// actor keeps its answer while the percentage stays.
fn actor_bucket(flag: &str, actor: &FlagActor) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(flag.as_bytes());
    crc.update(actor.flipper_id().as_bytes());
    crc.sum() % (100 * SCALE)
}

/// Whether `flag` is on for `actors`, given its stored gates (`None`: nobody
/// set it, so its default applies).
pub fn evaluate(flag: &str, stored: Option<&Gates>, actors: &[FlagActor]) -> bool {
    match stored {
        Some(gates) => gates.enabled(flag, actors),
        None => registry::definition(flag).is_some_and(|d| d.default_enabled),
    }
}

/// A flag as the API and the admin page show it: stored gates, or `None`
/// for a known flag nobody set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    pub name: String,
    pub gates: Option<Gates>,
}

impl Flag {
    pub fn definition(&self) -> Option<&'static Definition> {
        registry::definition(&self.name)
    }

    /// The state GitLab reports: from the gates, else from the default.
    pub fn state(&self) -> FlagState {
        match &self.gates {
            Some(gates) => gates.state(),
            None if self.definition().is_some_and(|d| d.default_enabled) => FlagState::On,
            None => FlagState::Off,
        }
    }
}

/// Why a flag could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum FeatureError {
    #[error(
        "the feature flag name is invalid (lower-case letters, digits and underscores, starting with a letter, at most {MAX_NAME_CHARS} characters)"
    )]
    InvalidName,
    #[error("the percentage must be an integer between 0 and 100")]
    Percentage,
    #[error("unknown feature group: {0}")]
    UnknownFeatureGroup(String),
    #[error(transparent)]
    Db(#[from] tokio_postgres::Error),
}

/// One change of a flag's gates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateChange {
    /// On for everyone; off clears every gate (Flipper's `disable`).
    Boolean(bool),
    /// Adds (`true`) or removes these actors.
    Actors(Vec<FlagActor>, bool),
    /// Adds (`true`) or removes these feature groups.
    Groups(Vec<String>, bool),
    PercentageOfActors(u8),
    PercentageOfTime(u8),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn user(id: i64) -> FlagActor {
        FlagActor::User { id, admin: false }
    }

    #[test]
    fn names_are_lower_snake_case() {
        assert!(valid_name("ai_commit_reader_for_chat"));
        assert!(valid_name("a1"));
        for bad in [
            "",
            "1flag",
            "Flag",
            "a-b",
            "a b",
            "a.b",
            "_a",
            &"a".repeat(101),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn boolean_on_is_on_for_everyone() {
        let gates = Gates {
            boolean: true,
            ..Gates::default()
        };
        assert_eq!(gates.state(), FlagState::On);
        assert!(gates.enabled_with("f", &[], || panic!("no draw needed")));
        assert!(gates.enabled_with("f", &[user(1)], || 0));
    }

    #[test]
    fn nothing_set_is_off() {
        let gates = Gates::default();
        assert_eq!(gates.state(), FlagState::Off);
        assert!(!gates.enabled_with("f", &[user(1), FlagActor::Project(2)], || 0));
        assert_eq!(gates.gate_list(), vec![("boolean", false.into())]);
    }

    #[test]
    fn an_actor_gate_turns_it_on_for_that_actor_only() {
        let gates = Gates {
            actors: ["User:1".to_owned(), "Project:7".to_owned()].into(),
            ..Gates::default()
        };
        assert_eq!(gates.state(), FlagState::Conditional);
        assert!(gates.enabled("f", &[user(1)]));
        assert!(!gates.enabled("f", &[user(2)]));
        // Any actor of the question may match: the project it is about.
        assert!(gates.enabled("f", &[user(2), FlagActor::Project(7)]));
        assert!(!gates.enabled("f", &[user(2), FlagActor::Group(7)]));
    }

    #[test]
    fn a_feature_group_matches_its_members() {
        let gates = Gates {
            groups: [registry::INSTANCE_ADMINS.to_owned()].into(),
            ..Gates::default()
        };
        assert!(gates.enabled("f", &[FlagActor::User { id: 3, admin: true }]));
        assert!(!gates.enabled("f", &[user(3)]));
    }

    #[test]
    fn percentage_of_actors_is_stable_and_roughly_the_share() {
        let gates = Gates {
            percentage_of_actors: 30,
            ..Gates::default()
        };
        assert_eq!(gates.state(), FlagState::Conditional);
        let on: Vec<bool> = (1..=2000)
            .map(|id| gates.enabled_with("my_flag", &[user(id)], || panic!("no time draw")))
            .collect();
        let again: Vec<bool> = (1..=2000)
            .map(|id| gates.enabled_with("my_flag", &[user(id)], || 0))
            .collect();
        assert_eq!(on, again, "the same actor always gets the same answer");
        let share = on.iter().filter(|b| **b).count();
        assert!((500..=700).contains(&share), "{share} of 2000");
        // Another flag rolls out to other actors.
        let other: Vec<bool> = (1..=2000)
            .map(|id| gates.enabled_with("other_flag", &[user(id)], || 0))
            .collect();
        assert_ne!(on, other);
        // Raising the percentage keeps everyone who had it.
        let more = Gates {
            percentage_of_actors: 60,
            ..Gates::default()
        };
        for (id, was_on) in (1..=2000).zip(&on) {
            if *was_on {
                assert!(more.enabled_with("my_flag", &[user(id)], || 0));
            }
        }
    }

    #[test]
    fn percentage_of_actors_looks_at_the_first_actor_only() {
        let gates = Gates {
            percentage_of_actors: 50,
            ..Gates::default()
        };
        let project = FlagActor::Project(1);
        let for_users: Vec<bool> = (1..=200)
            .map(|id| gates.enabled_with("f", &[user(id), project], || 0))
            .collect();
        let alone: Vec<bool> = (1..=200)
            .map(|id| gates.enabled_with("f", &[user(id)], || 0))
            .collect();
        assert_eq!(for_users, alone);
    }

    #[test]
    fn percentage_of_time_draws_per_check() {
        let gates = Gates {
            percentage_of_time: 25,
            ..Gates::default()
        };
        assert_eq!(gates.state(), FlagState::Conditional);
        assert!(gates.enabled_with("f", &[user(1)], || 24_999));
        assert!(!gates.enabled_with("f", &[user(1)], || 25_000));
        assert!(!gates.enabled_with("f", &[user(1)], || 99_999));
        let hundred = Gates {
            percentage_of_time: 100,
            ..Gates::default()
        };
        assert_eq!(hundred.state(), FlagState::On);
        assert!(hundred.enabled("f", &[]));
        let on = (0..4000).filter(|_| gates.enabled("f", &[user(1)])).count();
        assert!((700..=1300).contains(&on), "{on} of 4000");
    }

    #[test]
    fn defaults_apply_until_a_gate_is_set() {
        assert!(evaluate("ai_commit_reader_for_chat", None, &[user(1)]));
        assert!(!evaluate("ai_react_prompt_next", None, &[user(1)]));
        assert!(!evaluate("never_heard_of_it", None, &[user(1)]));
        let cleared = Gates::default();
        assert!(!evaluate(
            "ai_commit_reader_for_chat",
            Some(&cleared),
            &[user(1)]
        ));
        let flag = Flag {
            name: "ai_commit_reader_for_chat".into(),
            gates: None,
        };
        assert_eq!(flag.state(), FlagState::On);
    }

    #[test]
    fn the_registry_names_are_valid_and_unique() {
        let mut seen = BTreeSet::new();
        for d in DEFINITIONS {
            assert!(valid_name(d.name), "{}", d.name);
            assert!(seen.insert(d.name), "{} twice", d.name);
        }
    }
}
