//! `epic_reader`: reads one epic the user may see (see
//! [`super::resource_identifier`] for identification and authorization).

use super::resource_identifier::{ReaderKind, ResourceReader};

pub fn epic_reader() -> ResourceReader {
    ResourceReader {
        kind: ReaderKind::Epic,
    }
}
