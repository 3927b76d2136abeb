//! Where `fetch_url` may connect: public addresses only, unless the
//! operator allowed a host or a network. Checked on the URL (an address
//! written in it), on every redirect, and on every address a name resolves
//! to (the connection goes only to the addresses that passed, so a name
//! that resolves elsewhere the second time gains nothing).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
};

use ipnet::IpNet;

/// Why a URL or an address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// The operator's exceptions, and the rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetGuard {
    hosts: Vec<String>,
    nets: Vec<IpNet>,
}

impl NetGuard {
    /// `list`: host names, addresses or networks (`intranet.example`,
    /// `10.1.2.3`, `10.0.0.0/8`), comma-separated.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut guard = Self::default();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if let Ok(net) = entry.parse::<IpNet>() {
                guard.nets.push(net);
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                guard.nets.push(IpNet::from(ip));
            } else if entry
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            {
                guard.hosts.push(entry.to_ascii_lowercase());
            } else {
                return Err(format!(
                    "{entry:?} is neither a host name, an address nor a network"
                ));
            }
        }
        Ok(guard)
    }

    /// Whether the operator allowed this host by name.
    pub fn allows_name(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.hosts.contains(&host)
    }

    /// Whether a connection to `ip` may be made.
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        is_public(ip) || self.nets.iter().any(|n| n.contains(&ip))
    }

    /// Checks a URL before it is requested (the first one and each
    /// redirect): http or https, and an address written in it must be
    /// allowed. Names are checked when they resolve.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), Refused> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refused(format!(
                "only http and https URLs can be fetched, not {}",
                url.scheme()
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Refused("URLs with credentials are not fetched".into()));
        }
        match url.host() {
            None => Err(Refused("the URL has no host".into())),
            Some(url::Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)),
            Some(url::Host::Domain(_)) => Ok(()),
        }
    }

    fn check_ip(&self, ip: IpAddr) -> Result<(), Refused> {
        if self.allows_ip(ip) {
            Ok(())
        } else {
            Err(Refused(format!(
                "{ip} is a loopback, private, link-local or otherwise internal address"
            )))
        }
    }
}

impl std::str::FromStr for NetGuard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

/// Whether `ip` is an address on the public internet.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            is_public_v6(v6)
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local() // 169.254/16: the cloud metadata address
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || a >= 240) // reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    // NAT64 (64:ff9b::/96) reaches the IPv4 address it embeds.
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [.., hi, lo] = segments;
        let embedded = Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
        return is_public_v4(embedded);
    }
    // 6to4 (2002::/16) reaches the IPv4 address in its next 32 bits.
    if segments[0] == 0x2002 {
        let embedded = Ipv4Addr::from((u32::from(segments[1]) << 16) | u32::from(segments[2]));
        return is_public_v4(embedded);
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || segments[..3] == [0x64, 0xff9b, 1] // local-use NAT64 (64:ff9b:1::/48)
        || segments[..6] == [0, 0, 0, 0, 0xffff, 0] // SIIT's IPv4-translated (::ffff:0:0:0/96)
        || (segments[0] & 0xfe00) == 0xfc00 // unique local
        || (segments[0] & 0xffc0) == 0xfe80 // link-local
        || (segments[0] & 0xffc0) == 0xfec0 // site-local (deprecated, still routed inside sites)
        || (segments[0] == 0x2001 && segments[1] == 0x0db8) // documentation
        || ip.to_ipv4().is_some()) // IPv4-compatible (deprecated)
}

/// A resolver that hands reqwest only the addresses the guard allows.
pub struct GuardedResolver(pub Arc<NetGuard>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if guard.allows_name(&host) {
                return Ok(Box::new(found.into_iter()) as reqwest::dns::Addrs);
            }
            let allowed: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| guard.allows_ip(a.ip()))
                .collect();
            if allowed.is_empty() {
                let error: Box<dyn std::error::Error + Send + Sync> = Box::new(Refused(format!(
                    "{host} resolves only to loopback, private, link-local or otherwise internal addresses"
                )));
                return Err(error);
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_not_public() {
        for internal in [
            "127.0.0.1",
            "127.8.9.10",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "198.18.0.1",
            "240.0.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
            "2001:db8::1",
            // Local-use NAT64: whatever it embeds, a network of the site.
            "64:ff9b:1::101:101",
            "64:ff9b:1:ffff::a00:1",
            // SIIT's IPv4-translated addresses.
            "::ffff:0:a00:1",
            "::ffff:0:101:101",
            // 6to4 of private, loopback and metadata addresses.
            "2002:a00:1::1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            // Site-local.
            "fec0::1",
            "feff::1",
        ] {
            assert!(!is_public(internal.parse().unwrap()), "{internal}");
        }
        for public in [
            "93.184.215.14",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "64:ff9b::101:101",
            "2002:101:101::1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn urls_are_checked_before_they_are_requested() {
        let guard = NetGuard::default();
        let check = |url: &str| guard.check_url(&reqwest::Url::parse(url).unwrap());
        for refused in [
            "http://127.0.0.1/",
            "http://[::1]:8080/",
            "http://169.254.169.254/latest/meta-data/",
            "http://0x7f000001/",
            "http://2130706433/",
            "http://[::ffff:7f00:1]/",
            "http://10.1.2.3/",
            "file:///etc/passwd",
            "ftp://example.org/",
            "http://user:pass@example.org/",
        ] {
            assert!(check(refused).is_err(), "{refused}");
        }
        assert!(check("https://example.org/page").is_ok());
        let allowing = NetGuard::parse("10.0.0.0/8, 127.0.0.1, intranet.example").unwrap();
        assert!(
            allowing
                .check_url(&reqwest::Url::parse("http://10.1.2.3/").unwrap())
                .is_ok()
        );
        assert!(
            allowing
                .check_url(&reqwest::Url::parse("http://127.0.0.1/").unwrap())
                .is_ok()
        );
        assert!(
            allowing
                .check_url(&reqwest::Url::parse("http://127.0.0.2/").unwrap())
                .is_err()
        );
        assert!(allowing.allows_name("Intranet.Example."));
        assert!(NetGuard::parse("not a host!").is_err());
    }
}
