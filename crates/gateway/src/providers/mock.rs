//! `AIGW_MOCK_MODEL_RESPONSES`: every mocked call answers `mock`.

use super::TextStream;
use futures::StreamExt;

pub(crate) const MOCK_ANSWER: &str = "mock";

pub(crate) fn stream() -> TextStream {
    futures::stream::once(async { Ok(MOCK_ANSWER.to_owned()) }).boxed()
}
