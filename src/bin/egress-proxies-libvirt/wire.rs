//! The helper's side of the wire (src/provider/kvm/protocol.rs): events
//! out on stdout, one JSON object per line, and each libvirt call wrapped
//! in a `Start`/`End` pair.

use std::io::Write;

use egress_proxies_operator::provider::kvm::protocol::{Event, LibvirtError};

/// Writes one event line and flushes it, so the operator sees each call
/// as it begins. A closed stdout means the operator is gone: exit.
pub fn emit(e: &Event) {
    let mut out = std::io::stdout().lock();
    let ok = serde_json::to_writer(&mut out, e).is_ok()
        && out.write_all(b"\n").is_ok()
        && out.flush().is_ok();
    if !ok {
        std::process::exit(0);
    }
}

/// A note for the operator's debug log.
pub fn note(message: &str, subject: Option<&str>) {
    emit(&Event::Debug {
        message: message.to_string(),
        subject: subject.map(str::to_string),
    });
}

/// libvirt's error as it goes on the wire.
pub fn mirror(e: &virt::error::Error) -> LibvirtError {
    LibvirtError {
        code: code_of(e),
        domain: e.domain().to_raw() as i64,
        message: e.message().to_string(),
    }
}

/// The raw code of a libvirt error.
pub fn code_of(e: &virt::error::Error) -> i64 {
    e.code().to_raw() as i64
}

/// Runs one libvirt call between a `Start` and an `End` event (the
/// operator's `libvirt.rpc` span and debug line, kvm.md §11).
pub fn rpc<T>(
    name: &'static str,
    f: impl FnOnce() -> Result<T, virt::error::Error>,
) -> Result<T, virt::error::Error> {
    emit(&Event::Start { rpc: name.into() });
    let res = f();
    emit(&Event::End {
        error: res.as_ref().err().map(mirror),
    });
    res
}

/// A call's answer with libvirt's "no such object" (`missing`, its code)
/// read as `None`: what is already gone is not a failure.
pub fn absent<T>(
    r: Result<T, virt::error::Error>,
    missing: i64,
) -> Result<Option<T>, virt::error::Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if code_of(&e) == missing => Ok(None),
        Err(e) => Err(e),
    }
}
