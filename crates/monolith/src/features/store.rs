//! Flags and their gates in PostgreSQL: a row in `features` once anyone set
//! the flag, one row in `feature_gates` per gate value.

use std::collections::BTreeMap;

use super::{FeatureError, FlagActor, GateChange, Gates, evaluate, registry};
use crate::queries::Queries;

/// Every stored flag with its gates, by name.
pub async fn stored(db: &impl Queries) -> Result<BTreeMap<String, Gates>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT f.key, g.key, g.value
             FROM features f LEFT JOIN feature_gates g ON g.feature_key = f.key
             ORDER BY f.key",
            &[],
        )
        .await?;
    let mut flags: BTreeMap<String, Gates> = BTreeMap::new();
    for row in rows {
        let gates = flags.entry(row.get(0)).or_default();
        let (Some(key), Some(value)) = (
            row.get::<_, Option<String>>(1),
            row.get::<_, Option<String>>(2),
        ) else {
            continue;
        };
        match key.as_str() {
            "boolean" => gates.boolean = value == "true",
            "actors" => {
                gates.actors.insert(value);
            }
            "groups" => {
                gates.groups.insert(value);
            }
            "percentage_of_actors" => gates.percentage_of_actors = percentage(&value),
            "percentage_of_time" => gates.percentage_of_time = percentage(&value),
            _ => {}
        }
    }
    Ok(flags)
}

fn percentage(text: &str) -> u8 {
    text.parse::<u8>().map_or(0, |p| p.min(100))
}

/// The stored gates of one flag; `None` when nobody set it.
pub async fn find(db: &impl Queries, name: &str) -> Result<Option<Gates>, tokio_postgres::Error> {
    // Few flags exist; reading them all keeps one parser.
    Ok(stored(db).await?.remove(name))
}

/// Every flag worth showing: the stored ones and the known ones, by name.
pub async fn all(db: &impl Queries) -> Result<Vec<super::Flag>, tokio_postgres::Error> {
    let mut flags: BTreeMap<String, Option<Gates>> = stored(db)
        .await?
        .into_iter()
        .map(|(name, gates)| (name, Some(gates)))
        .collect();
    for d in registry::DEFINITIONS {
        flags.entry(d.name.to_owned()).or_insert(None);
    }
    Ok(flags
        .into_iter()
        .map(|(name, gates)| super::Flag { name, gates })
        .collect())
}

/// Whether `flag` is on for `actors`.
pub async fn enabled(
    db: &impl Queries,
    flag: &str,
    actors: &[FlagActor],
) -> Result<bool, tokio_postgres::Error> {
    Ok(Snapshot::read(db).await?.enabled(flag, actors))
}

/// The names of every flag, known or stored, that is on for `actors`,
/// sorted: what a request announces to the AI gateway.
pub async fn enabled_flags(
    db: &impl Queries,
    actors: &[FlagActor],
) -> Result<Vec<String>, tokio_postgres::Error> {
    Ok(Snapshot::read(db).await?.enabled_flags(actors))
}

/// Every stored flag read once, so one request can ask about several flags
/// and actors (a chat answer's announced flags and its categorisation
/// switch) in a single statement.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    stored: BTreeMap<String, Gates>,
}

impl Snapshot {
    pub async fn read(db: &impl Queries) -> Result<Self, tokio_postgres::Error> {
        Ok(Self {
            stored: stored(db).await?,
        })
    }

    /// Whether `flag` is on for `actors`.
    pub fn enabled(&self, flag: &str, actors: &[FlagActor]) -> bool {
        evaluate(flag, self.stored.get(flag), actors)
    }

    /// The names of every flag, known or stored, that is on for `actors`
    /// and announced to the gateway, sorted.
    pub fn enabled_flags(&self, actors: &[FlagActor]) -> Vec<String> {
        let mut names: Vec<&str> = self.stored.keys().map(String::as_str).collect();
        names.extend(registry::DEFINITIONS.iter().map(|d| d.name));
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .filter(|name| registry::definition(name).is_none_or(|d| d.announced))
            .filter(|name| self.enabled(name, actors))
            .map(str::to_owned)
            .collect()
    }
}

/// Applies `changes` to the flag `name` (creating it) in one transaction and
/// returns its gates afterwards.
pub async fn set(
    db: &mut deadpool_postgres::Client,
    name: &str,
    changes: &[GateChange],
) -> Result<Gates, FeatureError> {
    if !super::valid_name(name) {
        return Err(FeatureError::InvalidName);
    }
    for change in changes {
        match change {
            GateChange::PercentageOfActors(p) | GateChange::PercentageOfTime(p) if *p > 100 => {
                return Err(FeatureError::Percentage);
            }
            GateChange::Groups(groups, _) => {
                if let Some(unknown) = groups
                    .iter()
                    .find(|g| !registry::FEATURE_GROUPS.contains(&g.as_str()))
                {
                    return Err(FeatureError::UnknownFeatureGroup(unknown.clone()));
                }
            }
            _ => {}
        }
    }
    let tx = db.transaction().await?;
    tx.execute(
        "INSERT INTO features (key) VALUES ($1)
         ON CONFLICT (key) DO UPDATE SET updated_at = now()",
        &[&name],
    )
    .await?;
    for change in changes {
        apply(&tx, name, change).await?;
    }
    let gates = find(&tx, name).await?.unwrap_or_default();
    tx.commit().await?;
    Ok(gates)
}

async fn apply(
    tx: &impl Queries,
    name: &str,
    change: &GateChange,
) -> Result<(), tokio_postgres::Error> {
    match change {
        GateChange::Boolean(true) => set_single(tx, name, "boolean", "true").await,
        GateChange::Boolean(false) => {
            tx.execute("DELETE FROM feature_gates WHERE feature_key = $1", &[&name])
                .await?;
            Ok(())
        }
        GateChange::Actors(actors, on) => {
            for actor in actors {
                set_member(tx, name, "actors", &actor.flipper_id(), *on).await?;
            }
            Ok(())
        }
        GateChange::Groups(groups, on) => {
            for group in groups {
                set_member(tx, name, "groups", group, *on).await?;
            }
            Ok(())
        }
        GateChange::PercentageOfActors(p) => {
            set_percentage(tx, name, "percentage_of_actors", *p).await
        }
        GateChange::PercentageOfTime(p) => set_percentage(tx, name, "percentage_of_time", *p).await,
    }
}

async fn set_single(
    tx: &impl Queries,
    name: &str,
    key: &str,
    value: &str,
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        "INSERT INTO feature_gates (feature_key, key, value) VALUES ($1, $2, $3)
         ON CONFLICT (feature_key, key)
             WHERE key IN ('boolean', 'percentage_of_actors', 'percentage_of_time')
         DO UPDATE SET value = excluded.value",
        &[&name, &key, &value],
    )
    .await?;
    Ok(())
}

async fn set_percentage(
    tx: &impl Queries,
    name: &str,
    key: &str,
    percentage: u8,
) -> Result<(), tokio_postgres::Error> {
    if percentage == 0 {
        tx.execute(
            "DELETE FROM feature_gates WHERE feature_key = $1 AND key = $2",
            &[&name, &key],
        )
        .await?;
        Ok(())
    } else {
        set_single(tx, name, key, &percentage.to_string()).await
    }
}

async fn set_member(
    tx: &impl Queries,
    name: &str,
    key: &str,
    value: &str,
    on: bool,
) -> Result<(), tokio_postgres::Error> {
    if on {
        tx.execute(
            "INSERT INTO feature_gates (feature_key, key, value) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
            &[&name, &key, &value],
        )
        .await?;
    } else {
        tx.execute(
            "DELETE FROM feature_gates WHERE feature_key = $1 AND key = $2 AND value = $3",
            &[&name, &key, &value],
        )
        .await?;
    }
    Ok(())
}

/// Forgets the flag and its gates (its default applies again); whether it
/// was stored.
pub async fn delete(db: &impl Queries, name: &str) -> Result<bool, tokio_postgres::Error> {
    Ok(db
        .execute("DELETE FROM features WHERE key = $1", &[&name])
        .await?
        > 0)
}
