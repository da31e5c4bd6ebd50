//! Who is calling: personal access tokens (hashed at rest) and the RS256 keys the
//! monolith signs its gateway tokens with.

pub mod jwt;
pub mod request;
pub mod tokens;
