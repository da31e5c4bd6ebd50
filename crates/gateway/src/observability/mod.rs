//! observability
