//! Who is calling: users and service accounts, personal access tokens (hashed
//! at rest), browser sessions, passwords and failed sign-ins of the web pages,
//! the request's credentials, and the RS256 keys the monolith signs its
//! gateway tokens with.

pub mod credentials;
pub mod jwt;
pub mod oauth;
pub mod oauth_clients;
pub mod passwords;
pub mod request;
pub mod secret_box;
pub mod sessions;
pub mod sign_in_throttle;
pub mod tokens;
pub mod users;
