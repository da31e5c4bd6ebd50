//! `merge_request_reader`: reads one merge request the user may see (see
//! [`super::resource_identifier`] for identification and authorization).

use super::resource_identifier::{ReaderKind, ResourceReader};

pub fn merge_request_reader() -> ResourceReader {
    ResourceReader {
        kind: ReaderKind::MergeRequest,
    }
}
