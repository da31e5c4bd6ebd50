//! Where a request may send the gateway: the rules for model endpoints that a
//! caller names (`model_metadata.endpoint`, `x-gitlab-agent-platform-model-metadata`).
//!
//! Three rules, in order:
//! 1. **Vouched.** A caller-named endpoint must be one the monolith signed for
//!    (the token's `model_endpoints` claim: the self-hosted models its admin
//!    configured). A bare header or body field never chooses a host.
//! 2. **Allowed.** When `AIGW_CUSTOM_MODELS__EGRESS_ALLOW_LIST` is set, the
//!    endpoint's host must match one of its hosts (`llm.internal`,
//!    `*.example.com`) or its addresses one of its networks (`10.0.0.0/8`).
//! 3. **Not a metadata service.** Link-local and cloud metadata addresses
//!    (`169.254.0.0/16`, `fe80::/10`, `fd00:ec2::254`) are refused unless the
//!    allow-list names a network inside them, for names as well as literals:
//!    [`EgressResolver`] filters what DNS answers at connect time, so a name
//!    cannot be re-pointed after the check (DNS rebinding).
//!
//! The gateway's own provider credentials never go to a caller-named
//! endpoint: [`CallerEndpoint`] carries only the caller's key, and the
//! router sends configured keys only to configured endpoints.

use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// Networks refused unless allowed explicitly: link-local (where cloud
/// metadata services answer) and AWS's IPv6 metadata address.
const BLOCKED_NETWORKS: [IpNet; 3] = [
    IpNet::new_assert(IpAddr::V4(Ipv4Addr::new(169, 254, 0, 0)), 16),
    IpNet::new_assert(IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)), 10),
    IpNet::new_assert(
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
        128,
    ),
];

/// One entry of the allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AllowRule {
    /// An exact host name (lower case).
    Host(String),
    /// `*.example.com`: any name below `example.com` (not the name itself).
    Suffix(String),
    /// An address or network.
    Network(IpNet),
}

/// `AIGW_CUSTOM_MODELS__EGRESS_ALLOW_LIST`, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Empty: any host, but never the blocked networks.
    rules: Vec<AllowRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    #[error("the model endpoint {0:?} is not an http(s) URL")]
    NotHttp(String),
    #[error("the model endpoint must not carry credentials in its URL")]
    Credentials,
    #[error(
        "the model endpoint {0} is not one this GitLab instance configured (self-hosted models are chosen by an administrator)"
    )]
    NotVouched(String),
    #[error(
        "the model endpoint's host {0} is not in the gateway's egress allow-list (AIGW_CUSTOM_MODELS__EGRESS_ALLOW_LIST)"
    )]
    NotAllowed(String),
    #[error(
        "the model endpoint's address {0} is link-local or a cloud metadata address; allow it explicitly in AIGW_CUSTOM_MODELS__EGRESS_ALLOW_LIST"
    )]
    Blocked(IpAddr),
    #[error("invalid AIGW_CUSTOM_MODELS__EGRESS_ALLOW_LIST entry {0:?}")]
    BadRule(String),
}

impl EgressPolicy {
    /// No allow-list: any host but the blocked networks.
    pub const OPEN: EgressPolicy = EgressPolicy { rules: Vec::new() };

    /// Reads a comma- or space-separated list of hosts, `*.suffix` patterns,
    /// addresses and CIDR networks.
    pub fn parse(list: &str) -> Result<Self, EgressError> {
        let mut rules = Vec::new();
        for entry in list
            .split([',', ' ', '\n', '\t'])
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let lower = entry.to_ascii_lowercase();
            let rule = if let Ok(net) = lower.parse::<IpNet>() {
                AllowRule::Network(net)
            } else if let Ok(ip) = lower.trim_matches(['[', ']']).parse::<IpAddr>() {
                AllowRule::Network(IpNet::from(ip))
            } else if let Some(suffix) = lower.strip_prefix("*.") {
                if !valid_host_name(suffix) {
                    return Err(EgressError::BadRule(entry.to_owned()));
                }
                AllowRule::Suffix(suffix.to_owned())
            } else if valid_host_name(&lower) {
                AllowRule::Host(lower)
            } else {
                return Err(EgressError::BadRule(entry.to_owned()));
            };
            rules.push(rule);
        }
        Ok(Self { rules })
    }

    pub fn is_restricted(&self) -> bool {
        !self.rules.is_empty()
    }

    fn host_named(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.rules.iter().any(|rule| match rule {
            AllowRule::Host(name) => *name == host,
            AllowRule::Suffix(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.ends_with('.')),
            AllowRule::Network(_) => false,
        })
    }

    /// Whether the address may be reached for `host` (the name the URL
    /// gave, or the literal address).
    pub fn admits_address(&self, host: &str, ip: IpAddr) -> Result<(), EgressError> {
        let ip = canonical(ip);
        // A blocked address passes only through a network rule that lies
        // inside a blocked network: `0.0.0.0/0` does not open the metadata
        // service, `169.254.169.254/32` does.
        for blocked in BLOCKED_NETWORKS {
            if blocked.contains(&ip) {
                let explicitly = self.rules.iter().any(|rule| {
                    matches!(rule, AllowRule::Network(net) if net.contains(&ip) && blocked.contains(net))
                });
                return if explicitly {
                    Ok(())
                } else {
                    Err(EgressError::Blocked(ip))
                };
            }
        }
        if !self.is_restricted() || self.host_named(host) {
            return Ok(());
        }
        let in_network = self
            .rules
            .iter()
            .any(|rule| matches!(rule, AllowRule::Network(net) if net.contains(&ip)));
        if in_network {
            Ok(())
        } else {
            Err(EgressError::NotAllowed(host.to_owned()))
        }
    }

    /// The checks that need no DNS: the URL's shape, a host name against
    /// the allow-list, a literal address against every rule. Names are
    /// checked again, address by address, by [`EgressResolver`].
    pub fn check_url(&self, url: &url::Url) -> Result<(), EgressError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(EgressError::NotHttp(url.to_string()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(EgressError::Credentials);
        }
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.admits_address(&ip.to_string(), IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.admits_address(&ip.to_string(), IpAddr::V6(ip)),
            Some(url::Host::Domain(name)) => {
                if self.is_restricted()
                    && !self.host_named(name)
                    && !self
                        .rules
                        .iter()
                        .any(|r| matches!(r, AllowRule::Network(_)))
                {
                    return Err(EgressError::NotAllowed(name.to_owned()));
                }
                Ok(())
            }
            None => Err(EgressError::NotHttp(url.to_string())),
        }
    }
}

/// An IPv4-mapped IPv6 address is checked as the IPv4 address it carries.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn valid_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The form endpoints are compared in: parsed, no trailing slash, no query
/// or fragment. Both the monolith's claim and the caller's field go through
/// this, so `http://h:80/v1/` and `http://h/v1` are the same endpoint.
pub fn normalize_endpoint(raw: &str) -> Option<String> {
    let url = url::Url::parse(raw.trim()).ok()?;
    if url.query().is_some() || url.fragment().is_some() || url.cannot_be_a_base() {
        return None;
    }
    let mut text = url.to_string();
    while text.ends_with('/') {
        text.pop();
    }
    Some(text)
}

/// A model endpoint a request named, admitted by [`EndpointGuard::admit`]:
/// the only way a call reaches a host the configuration did not name.
#[derive(Clone, PartialEq)]
pub struct CallerEndpoint {
    base_url: String,
    api_key: Option<String>,
}

impl std::fmt::Debug for CallerEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerEndpoint")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

impl CallerEndpoint {
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The caller's own key, if it sent one; never one of the gateway's.
    pub fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }
}

/// What one request may name: the endpoints its token vouches for, under
/// the gateway's egress policy.
#[derive(Debug, Clone, Copy)]
pub struct EndpointGuard<'a> {
    /// The token's `model_endpoints` claim, normalized.
    pub vouched: &'a [String],
    /// Authentication is bypassed (development): any endpoint is vouched
    /// for, the egress policy still applies.
    pub debug: bool,
    pub policy: &'a EgressPolicy,
}

impl EndpointGuard<'static> {
    /// Vouches for nothing: for calls that name no endpoint.
    pub const NOTHING: EndpointGuard<'static> = EndpointGuard {
        vouched: &[],
        debug: false,
        policy: &EgressPolicy::OPEN,
    };
}

impl EndpointGuard<'_> {
    /// Admits `endpoint` (with the caller's `api_key`) or says why not.
    pub fn admit(
        &self,
        endpoint: &str,
        api_key: Option<&str>,
    ) -> Result<CallerEndpoint, EgressError> {
        let normalized = normalize_endpoint(endpoint)
            .ok_or_else(|| EgressError::NotHttp(endpoint.to_owned()))?;
        let url =
            url::Url::parse(&normalized).map_err(|_| EgressError::NotHttp(endpoint.to_owned()))?;
        self.policy.check_url(&url)?;
        if !self.debug && !self.vouched.contains(&normalized) {
            return Err(EgressError::NotVouched(normalized));
        }
        Ok(CallerEndpoint {
            base_url: normalized,
            api_key: api_key.filter(|k| !k.is_empty()).map(str::to_owned),
        })
    }
}

/// Resolves names for calls to caller-named endpoints and drops every
/// address the egress policy refuses, so the address connected to is one
/// that was checked.
#[derive(Debug, Clone)]
pub struct EgressResolver {
    policy: Arc<EgressPolicy>,
}

impl EgressResolver {
    pub fn new(policy: Arc<EgressPolicy>) -> Self {
        Self { policy }
    }
}

impl reqwest::dns::Resolve for EgressResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refusal = None;
            let admitted: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|addr| match policy.admits_address(&host, addr.ip()) {
                    Ok(()) => true,
                    Err(err) => {
                        refusal = Some(err);
                        false
                    }
                })
                .collect();
            if admitted.is_empty() {
                let err: Box<dyn std::error::Error + Send + Sync> = match refusal {
                    Some(err) => Box::new(err),
                    None => format!("{host} did not resolve").into(),
                };
                return Err(err);
            }
            let addrs: reqwest::dns::Addrs = Box::new(admitted.into_iter());
            Ok(addrs)
        })
    }
}

/// The HTTP client for caller-named endpoints: its own pool, its names
/// resolved through [`EgressResolver`], and no redirects (a redirect would
/// be a second, unchecked endpoint).
pub fn caller_endpoint_client(
    policy: Arc<EgressPolicy>,
) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        .pool_idle_timeout(std::time::Duration::from_secs(90))
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(EgressResolver::new(policy))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard<'a>(vouched: &'a [String], policy: &'a EgressPolicy) -> EndpointGuard<'a> {
        EndpointGuard {
            vouched,
            debug: false,
            policy,
        }
    }

    #[test]
    fn only_vouched_endpoints_are_admitted_and_keep_only_the_callers_key() {
        let policy = EgressPolicy::default();
        let vouched = vec!["http://llm.internal:8000/v1".to_owned()];
        let admitted = guard(&vouched, &policy)
            .admit("http://LLM.internal:8000/v1/", Some("theirs"))
            .unwrap();
        assert_eq!(admitted.base_url(), "http://llm.internal:8000/v1");
        assert_eq!(admitted.api_key(), Some("theirs"));
        assert_eq!(
            guard(&vouched, &policy)
                .admit("http://llm.internal:8000/v1", None)
                .unwrap()
                .api_key(),
            None
        );
        assert_eq!(
            guard(&vouched, &policy).admit("http://evil.example/v1", None),
            Err(EgressError::NotVouched("http://evil.example/v1".into()))
        );
        // Same host, another path or port: another endpoint.
        assert!(
            guard(&vouched, &policy)
                .admit("http://llm.internal:8001/v1", None)
                .is_err()
        );
        assert!(
            guard(&vouched, &policy)
                .admit("http://llm.internal:8000/v2", None)
                .is_err()
        );
    }

    #[test]
    fn metadata_addresses_are_refused_even_when_vouched_or_debug() {
        let policy = EgressPolicy::default();
        let vouched = vec![
            "http://169.254.169.254/latest".to_owned(),
            "http://[fd00:ec2::254]/latest".to_owned(),
        ];
        for endpoint in [
            "http://169.254.169.254/latest",
            "http://[fd00:ec2::254]/latest",
        ] {
            let mut g = guard(&vouched, &policy);
            assert!(matches!(
                g.admit(endpoint, None),
                Err(EgressError::Blocked(_))
            ));
            g.debug = true;
            assert!(matches!(
                g.admit(endpoint, None),
                Err(EgressError::Blocked(_))
            ));
        }
        // IPv4-mapped IPv6 is the same address.
        assert!(matches!(
            policy.admits_address("x", "::ffff:169.254.169.254".parse().unwrap()),
            Err(EgressError::Blocked(_))
        ));
        assert!(matches!(
            policy.admits_address("x", "fe80::1".parse().unwrap()),
            Err(EgressError::Blocked(_))
        ));
    }

    #[test]
    fn a_blocked_network_opens_only_through_a_rule_inside_it() {
        let wide = EgressPolicy::parse("0.0.0.0/0, ::/0").unwrap();
        assert!(
            wide.admits_address("x", "169.254.169.254".parse().unwrap())
                .is_err()
        );
        let narrow = EgressPolicy::parse("169.254.169.254/32").unwrap();
        assert!(
            narrow
                .admits_address("x", "169.254.169.254".parse().unwrap())
                .is_ok()
        );
        assert!(
            narrow
                .admits_address("x", "169.254.0.1".parse().unwrap())
                .is_err()
        );
    }

    #[test]
    fn the_allow_list_admits_named_hosts_and_networks_only() {
        let policy = EgressPolicy::parse("llm.internal, *.models.example, 10.0.0.0/8").unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(
            policy
                .admits_address("llm.internal", ip("192.168.1.5"))
                .is_ok()
        );
        assert!(
            policy
                .admits_address("a.models.example", ip("192.168.1.5"))
                .is_ok()
        );
        assert!(
            policy
                .admits_address("models.example", ip("192.168.1.5"))
                .is_err()
        );
        assert!(
            policy
                .admits_address("evilmodels.example", ip("192.168.1.5"))
                .is_err()
        );
        assert!(policy.admits_address("other", ip("10.1.2.3")).is_ok());
        assert_eq!(
            policy.admits_address("other", ip("192.168.1.5")),
            Err(EgressError::NotAllowed("other".into()))
        );
        // Loopback is not special: the allow-list decides.
        assert!(policy.admits_address("127.0.0.1", ip("127.0.0.1")).is_err());
        assert!(
            EgressPolicy::default()
                .admits_address("127.0.0.1", ip("127.0.0.1"))
                .is_ok()
        );
    }

    #[test]
    fn endpoints_must_be_plain_http_urls() {
        let policy = EgressPolicy::default();
        let g = EndpointGuard {
            vouched: &[],
            debug: true,
            policy: &policy,
        };
        for bad in [
            "file:///etc/passwd",
            "ftp://h/x",
            "not a url",
            "http://u:p@h/v1",
            "http://h/v1?x=1",
        ] {
            assert!(g.admit(bad, None).is_err(), "{bad}");
        }
        assert!(EgressPolicy::parse("bad host!").is_err());
    }

    #[tokio::test]
    async fn the_resolver_drops_refused_addresses() {
        use reqwest::dns::Resolve;
        let policy = Arc::new(EgressPolicy::parse("10.0.0.0/8").unwrap());
        let resolver = EgressResolver::new(policy);
        let name: reqwest::dns::Name = "localhost".parse().unwrap();
        let err = match resolver.resolve(name).await {
            Ok(_) => panic!("localhost is not in 10.0.0.0/8"),
            Err(err) => err.to_string(),
        };
        assert!(err.contains("allow-list"), "{err}");
        let open = EgressResolver::new(Arc::new(EgressPolicy::default()));
        let addrs: Vec<SocketAddr> = open
            .resolve("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()) && !addrs.is_empty());
    }
}
