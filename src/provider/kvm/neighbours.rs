//! The last address source: the host's own IPv4 neighbour table, read as
//! `/proc/net/arp` over an exec channel of the host's SSH session.
//!
//! libvirt 9.0 (Debian 12) answers its ARP source from one netlink batch
//! of that table, about 45 entries: on a host with more neighbours most
//! guests are not found there, and a guest without the agent never gets
//! an address. `/proc/net/arp` lists every entry. Where the key may not
//! run commands (`restrict`, a forced command) the exec fails and the
//! domain simply has no address yet, as before.

use std::time::Duration;

use russh::ChannelMsg;
use tracing::debug;

use super::conn::HostLink;

/// The command run on the host.
pub const COMMAND: &str = "cat /proc/net/arp";
/// The most bytes read (about 10,000 entries).
const MAX_BYTES: usize = 1 << 20;
/// The longest the read may take.
const LIMIT: Duration = Duration::from_secs(10);
/// `ATF_COM`: the entry is complete (its hardware address is known).
const COMPLETE: u32 = 0x2;

/// The IPv4 address `/proc/net/arp` (`text`) gives one of `macs` on
/// `device`, when it is complete and usable (not loopback, link-local or
/// unspecified).
pub fn address_in(text: &str, macs: &[String], device: &str) -> Option<String> {
    // IP address, HW type, Flags, HW address, Mask, Device.
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [ip, _, flags, hw, _, dev] = f.as_slice() else {
            return None;
        };
        let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
        let ip: std::net::Ipv4Addr = ip.parse().ok()?;
        let ours = macs.iter().any(|m| m.eq_ignore_ascii_case(hw));
        let usable = !(ip.is_loopback() || ip.is_link_local() || ip.is_unspecified());
        (flags & COMPLETE != 0 && ours && usable && *dev == device).then(|| ip.to_string())
    })
}

/// The address the host's neighbour table gives one of `macs` on the
/// host's bridge; `None` when it has none or cannot be read (logged).
pub async fn lookup(link: &HostLink, macs: &[String]) -> Option<String> {
    let text = match tokio::time::timeout(LIMIT, read(link)).await {
        Ok(Ok(text)) => text,
        Ok(Err(why)) => {
            debug!(host = %link.host.name, "no address from the host's neighbour table: {why}");
            return None;
        }
        Err(_) => {
            debug!(host = %link.host.name, "no address from the host's neighbour table: no answer within {LIMIT:?}");
            return None;
        }
    };
    let found = address_in(&text, macs, &link.host.bridge);
    debug!(host = %link.host.name, found = found.is_some(), "read the host's neighbour table");
    found
}

async fn read(link: &HostLink) -> Result<String, String> {
    let session = link.session().await.map_err(|e| e.to_string())?;
    let mut ch = session
        .channel_open_session()
        .await
        .map_err(|e| format!("opening an exec channel: {e}"))?;
    ch.exec(true, COMMAND)
        .await
        .map_err(|e| format!("running {COMMAND:?}: {e}"))?;
    let mut out = Vec::new();
    let mut status = None;
    while let Some(msg) = ch.wait().await {
        match msg {
            ChannelMsg::Data { data } => {
                out.extend_from_slice(&data);
                if out.len() > MAX_BYTES {
                    return Err(format!("{COMMAND:?} printed more than {MAX_BYTES} bytes"));
                }
            }
            ChannelMsg::Failure => return Err(format!("the host refused to run {COMMAND:?}")),
            ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    match status {
        Some(0) | None if !out.is_empty() => Ok(String::from_utf8_lossy(&out).into_owned()),
        other => Err(format!(
            "{COMMAND:?} ended with status {other:?} and printed nothing"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
IP address       HW type     Flags       HW address            Mask     Device
10.213.5.140     0x1         0x2         52:54:00:aa:bb:cc     *        epobr1
10.213.5.141     0x1         0x0         52:54:00:aa:bb:dd     *        epobr1
169.254.0.7      0x1         0x2         52:54:00:aa:bb:ee     *        epobr1
10.0.0.9         0x1         0x2         52:54:00:aa:bb:ff     *        eth0
10.213.5.150     0x1         0x2         52:54:00:aa:bb:ff     *        epobr1
";

    fn macs(m: &[&str]) -> Vec<String> {
        m.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_a_complete_usable_entry_of_the_domains_nic_on_the_bridge_counts() {
        let cases = [
            (
                "complete, ours",
                &["52:54:00:AA:BB:CC"][..],
                Some("10.213.5.140"),
            ),
            ("incomplete", &["52:54:00:aa:bb:dd"][..], None),
            ("link-local", &["52:54:00:aa:bb:ee"][..], None),
            (
                "another device first, then the bridge",
                &["52:54:00:aa:bb:ff"][..],
                Some("10.213.5.150"),
            ),
            ("not ours", &["52:54:00:00:00:01"][..], None),
            ("no NIC known", &[][..], None),
        ];
        for (name, m, want) in cases {
            assert_eq!(
                address_in(TABLE, &macs(m), "epobr1").as_deref(),
                want,
                "{name}"
            );
        }
        assert_eq!(
            address_in("", &macs(&["52:54:00:aa:bb:cc"]), "epobr1"),
            None
        );
        assert_eq!(address_in("garbage\nx y z\n", &macs(&["x"]), "z"), None);
    }
}
