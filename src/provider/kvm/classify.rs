//! Error classification (kvm.md §9), one function tested by a table.

use std::error::Error as StdError;

use super::ssh::DialError;
use crate::provider::ErrorClass;

/// libvirt error codes the provider branches on (virterror.h), by their
/// `virt::sys` names.
pub mod code {
    use virt::sys;

    /// VIR_ERR_INTERNAL_ERROR
    pub const INTERNAL_ERROR: i64 = sys::VIR_ERR_INTERNAL_ERROR as i64;
    /// VIR_ERR_NO_SUPPORT
    pub const NO_SUPPORT: i64 = sys::VIR_ERR_NO_SUPPORT as i64;
    /// VIR_ERR_INVALID_ARG
    pub const INVALID_ARG: i64 = sys::VIR_ERR_INVALID_ARG as i64;
    /// VIR_ERR_OPERATION_FAILED
    pub const OPERATION_FAILED: i64 = sys::VIR_ERR_OPERATION_FAILED as i64;
    /// VIR_ERR_XML_ERROR
    pub const XML_ERROR: i64 = sys::VIR_ERR_XML_ERROR as i64;
    /// VIR_ERR_OPERATION_DENIED
    pub const OPERATION_DENIED: i64 = sys::VIR_ERR_OPERATION_DENIED as i64;
    /// VIR_ERR_XML_DETAIL
    pub const XML_DETAIL: i64 = sys::VIR_ERR_XML_DETAIL as i64;
    /// VIR_ERR_SYSTEM_ERROR
    pub const SYSTEM_ERROR: i64 = sys::VIR_ERR_SYSTEM_ERROR as i64;
    /// VIR_ERR_RPC
    pub const RPC: i64 = sys::VIR_ERR_RPC as i64;
    /// VIR_ERR_NO_DOMAIN
    pub const NO_DOMAIN: i64 = sys::VIR_ERR_NO_DOMAIN as i64;
    /// VIR_ERR_AUTH_FAILED
    pub const AUTH_FAILED: i64 = sys::VIR_ERR_AUTH_FAILED as i64;
    /// VIR_ERR_NO_STORAGE_POOL
    pub const NO_STORAGE_POOL: i64 = sys::VIR_ERR_NO_STORAGE_POOL as i64;
    /// VIR_ERR_NO_STORAGE_VOL
    pub const NO_STORAGE_VOL: i64 = sys::VIR_ERR_NO_STORAGE_VOL as i64;
    /// VIR_ERR_OPERATION_INVALID
    pub const OPERATION_INVALID: i64 = sys::VIR_ERR_OPERATION_INVALID as i64;
    /// VIR_ERR_CONFIG_UNSUPPORTED
    pub const CONFIG_UNSUPPORTED: i64 = sys::VIR_ERR_CONFIG_UNSUPPORTED as i64;
    /// VIR_ERR_ARGUMENT_UNSUPPORTED
    pub const ARGUMENT_UNSUPPORTED: i64 = sys::VIR_ERR_ARGUMENT_UNSUPPORTED as i64;
    /// VIR_ERR_NO_DOMAIN_METADATA
    pub const NO_DOMAIN_METADATA: i64 = sys::VIR_ERR_NO_DOMAIN_METADATA as i64;
    /// VIR_ERR_OPERATION_UNSUPPORTED
    pub const OPERATION_UNSUPPORTED: i64 = sys::VIR_ERR_OPERATION_UNSUPPORTED as i64;
    /// VIR_ERR_AGENT_UNRESPONSIVE
    pub const AGENT_UNRESPONSIVE: i64 = sys::VIR_ERR_AGENT_UNRESPONSIVE as i64;
    /// VIR_ERR_RESOURCE_BUSY
    pub const RESOURCE_BUSY: i64 = sys::VIR_ERR_RESOURCE_BUSY as i64;
    /// VIR_ERR_ACCESS_DENIED
    pub const ACCESS_DENIED: i64 = sys::VIR_ERR_ACCESS_DENIED as i64;
    /// VIR_ERR_STORAGE_VOL_EXIST
    pub const STORAGE_VOL_EXIST: i64 = sys::VIR_ERR_STORAGE_VOL_EXIST as i64;
    /// VIR_ERR_XML_INVALID_SCHEMA
    pub const XML_INVALID_SCHEMA: i64 = sys::VIR_ERR_XML_INVALID_SCHEMA as i64;
    /// VIR_FROM_RPC (error domain)
    pub const FROM_RPC: i64 = sys::VIR_FROM_RPC as i64;
}

/// The raw code of a libvirt error.
pub fn code_of(e: &virt::error::Error) -> i64 {
    e.code().to_raw() as i64
}

/// The raw error domain of a libvirt error.
pub fn domain_of(e: &virt::error::Error) -> i64 {
    e.domain().to_raw() as i64
}

/// The class of a libvirt error code.
pub fn class_of_code(c: i64) -> ErrorClass {
    use code::*;
    match c {
        NO_DOMAIN | NO_STORAGE_VOL => ErrorClass::NotFound,
        NO_STORAGE_POOL
        | XML_ERROR
        | XML_DETAIL
        | XML_INVALID_SCHEMA
        | CONFIG_UNSUPPORTED
        | NO_SUPPORT
        | OPERATION_UNSUPPORTED
        | ARGUMENT_UNSUPPORTED
        | INVALID_ARG
        | AUTH_FAILED
        | ACCESS_DENIED
        | OPERATION_DENIED => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// Whether libvirt's message reports a full pool or disk (ENOSPC).
pub fn is_out_of_space(message: &str) -> bool {
    message.contains("No space left on device")
}

/// Classifies an untagged error: a dial error keeps its class, a libvirt
/// error goes by its code, anything else is Transient.
pub fn classify(err: &(dyn StdError + 'static)) -> ErrorClass {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(d) = e.downcast_ref::<DialError>() {
            return d.class;
        }
        if let Some(v) = e.downcast_ref::<virt::error::Error>() {
            if is_out_of_space(v.message()) {
                return ErrorClass::QuotaExceeded;
            }
            return class_of_code(code_of(v));
        }
        cur = e.source();
    }
    ErrorClass::Transient
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_table() {
        for (c, want) in [
            (42, ErrorClass::NotFound),
            (50, ErrorClass::NotFound),
            (49, ErrorClass::Permanent),
            (27, ErrorClass::Permanent),
            (35, ErrorClass::Permanent),
            (92, ErrorClass::Permanent),
            (67, ErrorClass::Permanent),
            (3, ErrorClass::Permanent),
            (84, ErrorClass::Permanent),
            (74, ErrorClass::Permanent),
            (8, ErrorClass::Permanent),
            (45, ErrorClass::Permanent),
            (88, ErrorClass::Permanent),
            (29, ErrorClass::Permanent),
            (55, ErrorClass::Transient),
            (9, ErrorClass::Transient),
            (1, ErrorClass::Transient),
            (90, ErrorClass::Transient),
            (87, ErrorClass::Transient),
            (38, ErrorClass::Transient),
            (39, ErrorClass::Transient),
        ] {
            assert_eq!(class_of_code(c), want, "code {c}");
        }
        assert!(is_out_of_space(
            "cannot allocate 1048576 bytes in file '/p/x': No space left on device"
        ));
        assert!(!is_out_of_space("Storage volume not found"));
        let io = std::io::Error::other("eof");
        assert_eq!(classify(&io), ErrorClass::Transient);
    }
}
