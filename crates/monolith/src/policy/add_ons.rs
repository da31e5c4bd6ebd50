//! Which unit primitives each Duo add-on grants: configuration, not code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use contracts::UnitPrimitive;
use serde::Deserialize;

/// The copy shipped with the repository, used when no file is found at run time.
const BUILT_IN: &str = include_str!("../../../../config/duo_add_ons.yml");

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AddOn {
    DuoPro,
    DuoEnterprise,
}

impl AddOn {
    pub fn as_str(self) -> &'static str {
        match self {
            AddOn::DuoPro => "duo_pro",
            AddOn::DuoEnterprise => "duo_enterprise",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "duo_pro" => Some(AddOn::DuoPro),
            "duo_enterprise" => Some(AddOn::DuoEnterprise),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AddOnConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid add-on configuration: {0}")]
    Parse(String),
}

#[derive(Debug, Deserialize)]
struct File {
    add_ons: BTreeMap<AddOn, Entry>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    unit_primitives: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddOnCatalogue {
    grants: BTreeMap<AddOn, BTreeSet<UnitPrimitive>>,
}

impl AddOnCatalogue {
    pub fn built_in() -> Result<Self, AddOnConfigError> {
        Self::from_yaml(BUILT_IN)
    }

    /// Reads `path`; falls back to the built-in copy when the file does not exist.
    pub fn load(path: &Path) -> Result<Self, AddOnConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::from_yaml(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::built_in(),
            Err(source) => Err(AddOnConfigError::Read {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    pub fn from_yaml(text: &str) -> Result<Self, AddOnConfigError> {
        let file: File =
            serde_norway::from_str(text).map_err(|e| AddOnConfigError::Parse(e.to_string()))?;
        let mut grants = BTreeMap::new();
        for (add_on, entry) in file.add_ons {
            let mut set = BTreeSet::new();
            for name in entry.unit_primitives {
                let up = name
                    .parse::<UnitPrimitive>()
                    .map_err(|e| AddOnConfigError::Parse(format!("{}: {e}", add_on.as_str())))?;
                set.insert(up);
            }
            grants.insert(add_on, set);
        }
        Ok(Self { grants })
    }

    pub fn unit_primitives(&self, add_on: AddOn) -> BTreeSet<UnitPrimitive> {
        self.grants.get(&add_on).cloned().unwrap_or_default()
    }

    pub fn union<'a>(
        &self,
        add_ons: impl IntoIterator<Item = &'a AddOn>,
    ) -> BTreeSet<UnitPrimitive> {
        add_ons
            .into_iter()
            .flat_map(|a| self.unit_primitives(*a))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_file_parses_and_enterprise_extends_pro() {
        let c = AddOnCatalogue::built_in().unwrap();
        let pro = c.unit_primitives(AddOn::DuoPro);
        let ent = c.unit_primitives(AddOn::DuoEnterprise);
        assert!(pro.contains(&UnitPrimitive::DuoChat));
        assert!(!pro.contains(&UnitPrimitive::AskIssue));
        assert!(ent.contains(&UnitPrimitive::AskIssue));
        assert!(pro.is_subset(&ent));
    }

    #[test]
    fn unknown_unit_primitive_is_rejected() {
        let err =
            AddOnCatalogue::from_yaml("add_ons:\n  duo_pro:\n    unit_primitives: [duo_chatt]\n")
                .unwrap_err();
        assert!(err.to_string().contains("duo_chatt"));
    }
}
