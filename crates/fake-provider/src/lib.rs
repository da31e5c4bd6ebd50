//! A scriptable fake model provider.
