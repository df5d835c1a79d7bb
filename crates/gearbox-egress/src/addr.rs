//! Addresses a run never reaches through the proxy, whatever its grant: the host's own
//! loopback, link-local (cloud metadata at 169.254.169.254 among them), unspecified,
//! multicast and reserved; and private ranges unless `[network] allow_private` lists them.
//! The proxy checks every address a name resolves to and connects to a checked address
//! itself, so a name that resolves differently on a second lookup (DNS rebinding) gains
//! nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Never reachable: loopback, link-local, unspecified, multicast, reserved.
    Never(&'static str),
    /// A private range: reachable only where `allow_private` lists it.
    Private(&'static str),
}

/// The class of `ip` when a run must not reach it by default; `None` for a public address.
pub fn classify(ip: IpAddr) -> Option<Refused> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return classify_v4(v4);
            }
            let s = v6.segments();
            // NAT64 (64:ff9b::/96) carries an IPv4 address in its last 32 bits.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return classify_v4(Ipv4Addr::new(
                    (s[6] >> 8) as u8,
                    s[6] as u8,
                    (s[7] >> 8) as u8,
                    s[7] as u8,
                ));
            }
            classify_v6(v6)
        }
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Refused> {
    let o = ip.octets();
    Some(match o {
        [127, ..] => Refused::Never("loopback 127.0.0.0/8"),
        [0, ..] => Refused::Never("\"this network\" 0.0.0.0/8"),
        [169, 254, ..] => Refused::Never("link-local 169.254.0.0/16 (cloud metadata)"),
        [224..=239, ..] => Refused::Never("multicast 224.0.0.0/4"),
        [240..=255, ..] => Refused::Never("reserved 240.0.0.0/4"),
        [10, ..] => Refused::Private("private 10.0.0.0/8"),
        [172, 16..=31, ..] => Refused::Private("private 172.16.0.0/12"),
        [192, 168, ..] => Refused::Private("private 192.168.0.0/16"),
        [100, 64..=127, ..] => Refused::Private("shared 100.64.0.0/10"),
        [192, 0, 0, _] => Refused::Private("IETF protocol assignments 192.0.0.0/24"),
        [198, 18..=19, ..] => Refused::Private("benchmarking 198.18.0.0/15"),
        _ => return None,
    })
}

fn classify_v6(ip: Ipv6Addr) -> Option<Refused> {
    let s = ip.segments();
    Some(if ip.is_loopback() {
        Refused::Never("loopback ::1")
    } else if ip.is_unspecified() {
        Refused::Never("unspecified ::")
    } else if s[0] & 0xffc0 == 0xfe80 {
        Refused::Never("link-local fe80::/10")
    } else if s[0] & 0xff00 == 0xff00 {
        Refused::Never("multicast ff00::/8")
    } else if s[..6] == [0, 0, 0, 0, 0, 0] {
        Refused::Never("IPv4-compatible ::/96")
    } else if s[0] & 0xfe00 == 0xfc00 {
        Refused::Private("unique-local fc00::/7")
    } else if s[0] & 0xffc0 == 0xfec0 {
        Refused::Private("site-local fec0::/10")
    } else {
        return None;
    })
}

/// Parse `[network] allow_private`: CIDRs inside the private ranges only; a range that
/// touches loopback, link-local or the like is refused (those are never reachable).
pub fn parse_allow_private(list: &[String]) -> Result<Vec<IpNet>, String> {
    let mut out = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let net: IpNet = s
            .parse()
            .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
            .map_err(|e| format!("[network] allow_private[{i}]: {s:?}: {e}"))?;
        for ip in [net.network(), net.broadcast()] {
            match classify(ip) {
                Some(Refused::Private(_)) => {}
                Some(Refused::Never(class)) => {
                    return Err(format!(
                        "[network] allow_private[{i}]: {s} reaches {class}, which no run may \
                         reach"
                    ));
                }
                None => {
                    return Err(format!(
                        "[network] allow_private[{i}]: {s} is not (wholly) a private range; \
                         public addresses need no exemption"
                    ));
                }
            }
        }
        out.push(net);
    }
    Ok(out)
}

/// Whether a run may connect to `ip`, given the exempted private ranges; the refusal names
/// the range.
pub fn admit(ip: IpAddr, allow_private: &[IpNet]) -> Result<(), String> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match classify(ip) {
        None => Ok(()),
        Some(Refused::Never(class)) => Err(format!("{ip} is in {class}: never reachable")),
        Some(Refused::Private(class)) => {
            if allow_private.iter().any(|n| n.contains(&ip)) {
                Ok(())
            } else {
                Err(format!(
                    "{ip} is in {class}: not reachable unless [network] allow_private lists it"
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn the_ranges_a_run_must_not_reach_are_refused() {
        for never in [
            "127.0.0.1",
            "127.255.0.9",
            "0.0.0.0",
            "169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
            "::127.0.0.1",
        ] {
            assert!(
                matches!(classify(ip(never)), Some(Refused::Never(_))),
                "{never}"
            );
            assert!(admit(ip(never), &[]).is_err(), "{never}");
        }
        for private in [
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "fd00::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(
                matches!(classify(ip(private)), Some(Refused::Private(_))),
                "{private}"
            );
        }
        for public in [
            "8.8.8.8",
            "172.32.0.1",
            "203.0.113.2",
            "2001:db8::1",
            "2606:4700::1",
            "100.128.0.1",
        ] {
            assert_eq!(classify(ip(public)), None, "{public}");
            assert!(admit(ip(public), &[]).is_ok(), "{public}");
        }
    }

    #[test]
    fn allow_private_exempts_private_ranges_only() {
        let nets = parse_allow_private(&["10.20.0.0/16".into(), "fd00::5".into()]).expect("ok");
        assert!(admit(ip("10.20.3.4"), &nets).is_ok());
        assert!(admit(ip("::ffff:10.20.3.4"), &nets).is_ok());
        assert!(admit(ip("10.21.0.1"), &nets).is_err());
        assert!(admit(ip("fd00::5"), &nets).is_ok());
        for bad in [
            "127.0.0.0/8",
            "169.254.0.0/16",
            "8.8.8.0/24",
            "0.0.0.0/0",
            "fe80::/10",
            "x",
        ] {
            assert!(parse_allow_private(&[bad.into()]).is_err(), "{bad}");
        }
    }
}
