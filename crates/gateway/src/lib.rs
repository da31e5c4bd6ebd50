//! Gateway library.
