//! Header names of the monolith-to-gateway protocol (Cloud Connector).

pub const AUTHORIZATION: &str = "authorization";
pub const AUTHENTICATION_TYPE: &str = "x-gitlab-authentication-type";
pub const REALM: &str = "x-gitlab-realm";
pub const INSTANCE_ID: &str = "x-gitlab-instance-id";
pub const GLOBAL_USER_ID: &str = "x-gitlab-global-user-id";
pub const HOST_NAME: &str = "x-gitlab-host-name";
pub const VERSION: &str = "x-gitlab-version";
pub const UNIT_PRIMITIVE: &str = "x-gitlab-unit-primitive";
pub const FEATURE_ENABLED_BY_NAMESPACE_IDS: &str = "x-gitlab-feature-enabled-by-namespace-ids";
pub const ENABLED_FEATURE_FLAGS: &str = "x-gitlab-enabled-feature-flags";
pub const RAILS_SEND_START: &str = "x-gitlab-rails-send-start";
pub const DUO_SEAT_COUNT: &str = "x-gitlab-duo-seat-count";
pub const IS_TEAM_MEMBER: &str = "x-gitlab-is-team-member";
pub const REQUEST_ID: &str = "x-request-id";
pub const PROCESS_TIME: &str = "x-process-time";
pub const BYPASS_AUTH: &str = "bypass-auth";
/// Our addition: how long the gateway itself spent on a request, in seconds,
/// excluding time spent waiting on the model.
pub const GATEWAY_OVERHEAD: &str = "x-gateway-overhead-time";

/// The only authentication type the gateway accepts.
pub const AUTHENTICATION_TYPE_OIDC: &str = "oidc";
