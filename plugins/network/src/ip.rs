//! CIDRs and addresses of a Network spec: parsed, checked, and the allocation pools Neutron needs
//! when the gateway moves (the pool must not contain the gateway).

use std::fmt;
use std::net::IpAddr;

/// A network prefix whose host bits are zero: `10.0.0.0/24`, `fd00::/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
        IpAddr::V6(v6) => (u128::from(v6), 128),
    }
}

fn from_bits(n: u128, width: u8) -> IpAddr {
    if width == 32 {
        IpAddr::V4(std::net::Ipv4Addr::from(n as u32))
    } else {
        IpAddr::V6(std::net::Ipv6Addr::from(n))
    }
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR (address/prefix, e.g. 10.0.0.0/24)"))?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not a CIDR: {addr:?} is not an IP address"))?;
        let (n, width) = bits(addr);
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= width)
            .ok_or_else(|| format!("{s:?} is not a CIDR: the prefix must be 0-{width}"))?;
        let cidr = Cidr { addr, prefix };
        if n & cidr.host_mask() != 0 {
            let network = from_bits(n & !cidr.host_mask(), width);
            return Err(format!(
                "{s:?} has host bits set: the network is {network}/{prefix}"
            ));
        }
        Ok(cidr)
    }

    fn width(&self) -> u8 {
        bits(self.addr).1
    }

    fn host_mask(&self) -> u128 {
        let host_bits = u32::from(self.width() - self.prefix);
        if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        }
    }

    pub fn ip_version(&self) -> u8 {
        if self.width() == 32 { 4 } else { 6 }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let (n, width) = bits(ip);
        width == self.width() && n & !self.host_mask() == bits(self.addr).0
    }

    /// The first and last addresses hosts may use: IPv4 leaves out the network and broadcast
    /// addresses, IPv6 the subnet-router anycast address (as Neutron does).
    fn usable(&self) -> Option<(u128, u128)> {
        let first = bits(self.addr).0;
        let last = first | self.host_mask();
        let (lo, hi) = (
            first.checked_add(1)?,
            if self.ip_version() == 4 {
                last.checked_sub(1)?
            } else {
                last
            },
        );
        (lo <= hi).then_some((lo, hi))
    }

    /// Checks that `gateway` can be this network's gateway.
    pub fn check_gateway(&self, gateway: &str) -> Result<IpAddr, String> {
        let ip: IpAddr = gateway
            .parse()
            .map_err(|_| format!("gateway {gateway:?} is not an IP address"))?;
        if !self.contains(ip) {
            return Err(format!("gateway {ip} is outside {self}"));
        }
        let (lo, hi) = self
            .usable()
            .ok_or_else(|| format!("{self} has no room for hosts"))?;
        let n = bits(ip).0;
        if n < lo || n > hi {
            return Err(format!(
                "gateway {ip} is the network or broadcast address of {self}"
            ));
        }
        Ok(ip)
    }

    /// The allocation pools of the whole usable range without `gateway`: `[start, end]` pairs.
    pub fn pools_without(&self, gateway: IpAddr) -> Vec<(IpAddr, IpAddr)> {
        let Some((lo, hi)) = self.usable() else {
            return Vec::new();
        };
        let width = self.width();
        let g = bits(gateway).0;
        let mut pools = Vec::new();
        if g > lo {
            pools.push((from_bits(lo, width), from_bits(g - 1, width)));
        }
        if g < hi {
            pools.push((from_bits(g + 1, width), from_bits(hi, width)));
        }
        if !(lo..=hi).contains(&g) {
            return vec![(from_bits(lo, width), from_bits(hi, width))];
        }
        pools
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_are_parsed_strictly() {
        assert_eq!(
            Cidr::parse("10.0.0.0/24").unwrap().to_string(),
            "10.0.0.0/24"
        );
        assert_eq!(Cidr::parse("fd00::/64").unwrap().ip_version(), 6);
        let host_bits = Cidr::parse("10.0.0.5/24").unwrap_err();
        assert!(host_bits.contains("10.0.0.0/24"), "{host_bits}");
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/24", "10.0.0.0/-1", ""] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn gateways_must_be_usable_addresses_inside() {
        let c = Cidr::parse("192.168.0.0/24").unwrap();
        assert_eq!(c.check_gateway("192.168.0.1"), Ok(ip("192.168.0.1")));
        assert!(
            c.check_gateway("192.168.1.1")
                .unwrap_err()
                .contains("outside")
        );
        assert!(c.check_gateway("192.168.0.0").is_err());
        assert!(c.check_gateway("192.168.0.255").is_err());
        assert!(c.check_gateway("fd00::1").is_err());
        assert!(c.check_gateway("gw").is_err());
        assert!(
            Cidr::parse("10.0.0.0/32")
                .unwrap()
                .check_gateway("10.0.0.0")
                .is_err()
        );
    }

    #[test]
    fn pools_leave_out_the_gateway() {
        let c = Cidr::parse("10.0.0.0/24").unwrap();
        assert_eq!(
            c.pools_without(ip("10.0.0.1")),
            vec![(ip("10.0.0.2"), ip("10.0.0.254"))]
        );
        assert_eq!(
            c.pools_without(ip("10.0.0.100")),
            vec![
                (ip("10.0.0.1"), ip("10.0.0.99")),
                (ip("10.0.0.101"), ip("10.0.0.254"))
            ]
        );
        assert_eq!(
            c.pools_without(ip("10.0.0.254")),
            vec![(ip("10.0.0.1"), ip("10.0.0.253"))]
        );
        let v6 = Cidr::parse("fd00::/120").unwrap();
        assert_eq!(
            v6.pools_without(ip("fd00::1")),
            vec![(ip("fd00::2"), ip("fd00::ff"))]
        );
    }
}
