//! `trusted_proxies`: the peers whose `X-Forwarded-Proto` / `-Host` the gateway keeps.

use std::fmt;
use std::net::IpAddr;

/// An address block such as `10.0.0.0/8` or `fd00::/8` (a bare address is a /32 or /128).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("invalid address {text:?} (expected e.g. \"10.0.0.0/8\" or \"::1\")"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => return Err(format!("invalid prefix length in {text:?} (0..={max})")),
            },
        };
        let cidr = Cidr { network, prefix };
        if cidr.mask(network) != network {
            return Err(format!(
                "{text:?} has host bits set (did you mean {}/{prefix}?)",
                cidr.mask(network)
            ));
        }
        Ok(cidr)
    }

    fn mask(&self, addr: IpAddr) -> IpAddr {
        match addr {
            IpAddr::V4(a) => {
                let bits = u32::from(a) & u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::from(bits.to_be_bytes())
            }
            IpAddr::V6(a) => {
                let bits = u128::from(a) & u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::from(bits.to_be_bytes())
            }
        }
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        // A dual-stack listener reports IPv4 peers as ::ffff:a.b.c.d.
        let addr = match addr {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
            v4 => v4,
        };
        addr.is_ipv4() == self.network.is_ipv4() && self.mask(addr) == self.network
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Whether any block contains `addr`.
pub fn trusted(blocks: &[Cidr], addr: IpAddr) -> bool {
    blocks.iter().any(|c| c.contains(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn blocks_contain_their_addresses_only() {
        let ten = Cidr::parse("10.0.0.0/8").expect("cidr");
        assert!(ten.contains(ip("10.1.2.3")));
        assert!(ten.contains(ip("::ffff:10.1.2.3")));
        assert!(!ten.contains(ip("11.0.0.1")));
        assert!(!ten.contains(ip("::1")));
        let one = Cidr::parse("192.0.2.7").expect("cidr");
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let v6 = Cidr::parse("fd00::/8").expect("cidr");
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        assert!(Cidr::parse("0.0.0.0/0").expect("cidr").contains(ip("203.0.113.9")));
    }

    #[test]
    fn bad_blocks_say_why() {
        assert!(
            Cidr::parse("10.0.0.0/33")
                .expect_err("refused")
                .contains("prefix length")
        );
        assert!(
            Cidr::parse("10.0.0.1/8")
                .expect_err("refused")
                .contains("did you mean 10.0.0.0/8")
        );
        assert!(Cidr::parse("ten").expect_err("refused").contains("invalid address"));
    }
}
