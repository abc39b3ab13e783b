//! `egress-proxies-libvirt URI`: the kvm provider's libvirt helper, the one
//! program of the project that links libvirt (docs/architecture.md,
//! "libvirt only where kvm is configured"). The operator starts one per
//! libvirt operation with the operation's bridged URI; it connects, then
//! serves the operator's requests on stdin until stdin closes. The wire is
//! described in src/provider/kvm/protocol.rs.

mod domains;
mod volumes;
mod wire;

use std::io::{BufRead, BufReader};

use egress_proxies_operator::provider::kvm::protocol::{Event, Request};
use serde::Serialize;
use virt::connect::Connect;

use crate::wire::{emit, mirror};

/// libvirt's "no flags" argument: every call here asks for the default
/// behaviour, and a named zero keeps bare numbers out of libvirt calls.
pub const NO_FLAGS: u32 = 0;

/// Offset and length of a whole-volume stream transfer (libvirt reads a
/// zero length as "to the end").
pub const WHOLE_VOLUME: (u64, u64) = (0, 0);

const USAGE: &str = "usage: egress-proxies-libvirt URI\n\n\
The kvm provider's libvirt helper: the operator starts it for each libvirt \
operation and speaks JSON lines with it on stdin and stdout \
(src/provider/kvm/protocol.rs). Not meant to be run by hand.";

fn main() {
    let uri = match std::env::args().nth(1) {
        Some(a) if a == "--version" => {
            println!("egress-proxies-libvirt {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        Some(a) if !a.starts_with('-') => a,
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    // libvirt's default handler prints every error; they go on the wire.
    virt::error::clear_error_callback();
    let conn = match Connect::open(Some(&uri)) {
        Ok(c) => c,
        Err(e) => {
            emit(&Event::Failed(mirror(&e)));
            std::process::exit(1);
        }
    };
    emit(&Event::Ready);
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut line = String::new();
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.trim().is_empty() {
            continue;
        }
        let req: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                // An operator of another version: say so and stop.
                eprintln!("egress-proxies-libvirt: unreadable request: {e}");
                std::process::exit(2);
            }
        };
        serve(&conn, &mut input, req);
    }
    drop(conn);
}

/// Runs one request and writes its answer.
fn serve(c: &Connect, input: &mut impl std::io::Read, req: Request) {
    match req {
        Request::Check { pool } => answer(volumes::check(c, &pool)),
        Request::ReadDomain { name } => answer(domains::read_domain(c, &name)),
        Request::ListManaged => answer(domains::list_managed(c)),
        Request::DeleteDomain { name, pool } => answer(domains::delete_domain(c, &name, &pool)),
        Request::Existing { name, uid, pool } => answer(domains::existing(c, &name, &uid, &pool)),
        Request::Build(b) => answer(domains::build(c, &b)),
        Request::BaseReady { pool, base, sha256 } => {
            answer(volumes::base_ready(c, &pool, &base, sha256.as_deref()))
        }
        Request::RemoveBase { pool, base } => answer(volumes::remove_base(c, &pool, &base)),
        Request::PoolAvailable { pool } => answer(volumes::pool_available(c, &pool)),
        Request::RemoveVolume { pool, volume } => answer(volumes::remove_volume(c, &pool, &volume)),
        Request::WriteMarker { pool, base, digest } => {
            answer(volumes::write_marker(c, &pool, &base, &digest))
        }
        Request::Upload {
            pool,
            base,
            len,
            format,
        } => {
            let up = volumes::upload(c, input, &pool, &base, len, format);
            answer(up.result);
            // Answered first: the operator stops sending, then says so.
            volumes::drain(input, up.unread);
        }
    }
}

fn answer<T: Serialize>(r: Result<T, virt::error::Error>) {
    match r {
        Ok(v) => match serde_json::to_value(v) {
            Ok(v) => emit(&Event::Answer(v)),
            Err(e) => {
                eprintln!("egress-proxies-libvirt: unwritable answer: {e}");
                std::process::exit(2);
            }
        },
        Err(e) => emit(&Event::Failed(mirror(&e))),
    }
}

#[cfg(test)]
mod tests {
    use egress_proxies_operator::provider::kvm::classify::{code, state};
    use virt::sys;

    /// The operator branches on these numbers without linking libvirt.
    #[test]
    fn the_operators_libvirt_numbers_are_libvirts() {
        let codes = [
            (code::INTERNAL_ERROR, sys::VIR_ERR_INTERNAL_ERROR),
            (code::NO_SUPPORT, sys::VIR_ERR_NO_SUPPORT),
            (code::INVALID_ARG, sys::VIR_ERR_INVALID_ARG),
            (code::OPERATION_FAILED, sys::VIR_ERR_OPERATION_FAILED),
            (code::XML_ERROR, sys::VIR_ERR_XML_ERROR),
            (code::OPERATION_DENIED, sys::VIR_ERR_OPERATION_DENIED),
            (code::XML_DETAIL, sys::VIR_ERR_XML_DETAIL),
            (code::SYSTEM_ERROR, sys::VIR_ERR_SYSTEM_ERROR),
            (code::RPC, sys::VIR_ERR_RPC),
            (code::NO_DOMAIN, sys::VIR_ERR_NO_DOMAIN),
            (code::AUTH_FAILED, sys::VIR_ERR_AUTH_FAILED),
            (code::NO_STORAGE_POOL, sys::VIR_ERR_NO_STORAGE_POOL),
            (code::NO_STORAGE_VOL, sys::VIR_ERR_NO_STORAGE_VOL),
            (code::OPERATION_INVALID, sys::VIR_ERR_OPERATION_INVALID),
            (code::CONFIG_UNSUPPORTED, sys::VIR_ERR_CONFIG_UNSUPPORTED),
            (
                code::ARGUMENT_UNSUPPORTED,
                sys::VIR_ERR_ARGUMENT_UNSUPPORTED,
            ),
            (code::NO_DOMAIN_METADATA, sys::VIR_ERR_NO_DOMAIN_METADATA),
            (
                code::OPERATION_UNSUPPORTED,
                sys::VIR_ERR_OPERATION_UNSUPPORTED,
            ),
            (code::AGENT_UNRESPONSIVE, sys::VIR_ERR_AGENT_UNRESPONSIVE),
            (code::RESOURCE_BUSY, sys::VIR_ERR_RESOURCE_BUSY),
            (code::ACCESS_DENIED, sys::VIR_ERR_ACCESS_DENIED),
            (code::STORAGE_VOL_EXIST, sys::VIR_ERR_STORAGE_VOL_EXIST),
            (code::XML_INVALID_SCHEMA, sys::VIR_ERR_XML_INVALID_SCHEMA),
        ];
        for (ours, theirs) in codes {
            assert_eq!(ours, theirs as i64);
        }
        assert_eq!(code::FROM_RPC, sys::VIR_FROM_RPC as i64);
        let states = [
            (state::DOMAIN_NOSTATE, sys::VIR_DOMAIN_NOSTATE),
            (state::DOMAIN_RUNNING, sys::VIR_DOMAIN_RUNNING),
            (state::DOMAIN_BLOCKED, sys::VIR_DOMAIN_BLOCKED),
            (state::POOL_INACTIVE, sys::VIR_STORAGE_POOL_INACTIVE),
            (state::POOL_BUILDING, sys::VIR_STORAGE_POOL_BUILDING),
            (state::POOL_RUNNING, sys::VIR_STORAGE_POOL_RUNNING),
            (state::POOL_DEGRADED, sys::VIR_STORAGE_POOL_DEGRADED),
            (state::POOL_INACCESSIBLE, sys::VIR_STORAGE_POOL_INACCESSIBLE),
        ];
        for (ours, theirs) in states {
            assert_eq!(ours, theirs);
        }
        assert_eq!(state::IP_ADDR_IPV4, sys::VIR_IP_ADDR_TYPE_IPV4 as i64);
    }
}
