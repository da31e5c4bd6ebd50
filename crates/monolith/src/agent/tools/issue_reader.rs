//! `issue_reader`: reads one issue the user may see (see
//! [`super::resource_identifier`] for identification and authorization).

use super::resource_identifier::{ReaderKind, ResourceReader};

pub fn issue_reader() -> ResourceReader {
    ResourceReader {
        kind: ReaderKind::Issue,
    }
}
