//! The proxies in front of the service, whose `X-Forwarded-For` names
//! the client (`HARNESS_TRUSTED_PROXIES`).

use std::str::FromStr;

/// The addresses of the proxies in front of the service (a gateway, a
/// load balancer): a request from one of them names its client in
/// `X-Forwarded-For`. Addresses or networks, comma-separated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedProxies(Vec<ipnet::IpNet>);

impl TrustedProxies {
    /// Whether `ip` is one of the proxies.
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|net| net.contains(&ip))
    }
}

impl FromStr for TrustedProxies {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut nets = Vec::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let net = match entry.parse::<ipnet::IpNet>() {
                Ok(net) => net,
                Err(_) => entry
                    .parse::<std::net::IpAddr>()
                    .map(ipnet::IpNet::from)
                    .map_err(|_| {
                        format!("{entry:?} is not an address or a network (10.0.0.0/8)")
                    })?,
            };
            nets.push(net.trunc());
        }
        if nets.is_empty() {
            return Err("lists no address (leave it unset to trust none)".to_owned());
        }
        Ok(Self(nets))
    }
}
