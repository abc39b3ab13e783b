//! Error classification (kvm.md §9), one function tested by a table.

use std::error::Error as StdError;

use super::protocol::LibvirtError;
use super::ssh::DialError;
use crate::provider::ErrorClass;

/// libvirt error codes the provider branches on (virterror.h; a stable
/// ABI). The helper's tests check each against libvirt's own bindings.
pub mod code {
    /// VIR_ERR_INTERNAL_ERROR
    pub const INTERNAL_ERROR: i64 = 1;
    /// VIR_ERR_NO_SUPPORT
    pub const NO_SUPPORT: i64 = 3;
    /// VIR_ERR_INVALID_ARG
    pub const INVALID_ARG: i64 = 8;
    /// VIR_ERR_OPERATION_FAILED
    pub const OPERATION_FAILED: i64 = 9;
    /// VIR_ERR_XML_ERROR
    pub const XML_ERROR: i64 = 27;
    /// VIR_ERR_OPERATION_DENIED
    pub const OPERATION_DENIED: i64 = 29;
    /// VIR_ERR_XML_DETAIL
    pub const XML_DETAIL: i64 = 35;
    /// VIR_ERR_SYSTEM_ERROR
    pub const SYSTEM_ERROR: i64 = 38;
    /// VIR_ERR_RPC
    pub const RPC: i64 = 39;
    /// VIR_ERR_NO_DOMAIN
    pub const NO_DOMAIN: i64 = 42;
    /// VIR_ERR_AUTH_FAILED
    pub const AUTH_FAILED: i64 = 45;
    /// VIR_ERR_NO_STORAGE_POOL
    pub const NO_STORAGE_POOL: i64 = 49;
    /// VIR_ERR_NO_STORAGE_VOL
    pub const NO_STORAGE_VOL: i64 = 50;
    /// VIR_ERR_OPERATION_INVALID
    pub const OPERATION_INVALID: i64 = 55;
    /// VIR_ERR_CONFIG_UNSUPPORTED
    pub const CONFIG_UNSUPPORTED: i64 = 67;
    /// VIR_ERR_ARGUMENT_UNSUPPORTED
    pub const ARGUMENT_UNSUPPORTED: i64 = 74;
    /// VIR_ERR_NO_DOMAIN_METADATA
    pub const NO_DOMAIN_METADATA: i64 = 80;
    /// VIR_ERR_OPERATION_UNSUPPORTED
    pub const OPERATION_UNSUPPORTED: i64 = 84;
    /// VIR_ERR_AGENT_UNRESPONSIVE
    pub const AGENT_UNRESPONSIVE: i64 = 86;
    /// VIR_ERR_RESOURCE_BUSY
    pub const RESOURCE_BUSY: i64 = 87;
    /// VIR_ERR_ACCESS_DENIED
    pub const ACCESS_DENIED: i64 = 88;
    /// VIR_ERR_STORAGE_VOL_EXIST
    pub const STORAGE_VOL_EXIST: i64 = 90;
    /// VIR_ERR_XML_INVALID_SCHEMA
    pub const XML_INVALID_SCHEMA: i64 = 92;
    /// VIR_FROM_RPC (error domain)
    pub const FROM_RPC: i64 = 7;
}

/// libvirt states the provider branches on (libvirt.h; a stable ABI).
pub mod state {
    /// VIR_DOMAIN_NOSTATE
    pub const DOMAIN_NOSTATE: u32 = 0;
    /// VIR_DOMAIN_RUNNING
    pub const DOMAIN_RUNNING: u32 = 1;
    /// VIR_DOMAIN_BLOCKED
    pub const DOMAIN_BLOCKED: u32 = 2;
    /// VIR_STORAGE_POOL_INACTIVE
    pub const POOL_INACTIVE: u32 = 0;
    /// VIR_STORAGE_POOL_BUILDING
    pub const POOL_BUILDING: u32 = 1;
    /// VIR_STORAGE_POOL_RUNNING
    pub const POOL_RUNNING: u32 = 2;
    /// VIR_STORAGE_POOL_DEGRADED
    pub const POOL_DEGRADED: u32 = 3;
    /// VIR_STORAGE_POOL_INACCESSIBLE
    pub const POOL_INACCESSIBLE: u32 = 4;
    /// VIR_IP_ADDR_TYPE_IPV4
    pub const IP_ADDR_IPV4: i64 = 0;
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
        | INVALID_ARG => ErrorClass::Permanent,
        // libvirt refuses these credentials or this connection: fixed on
        // the host, not in a Proxy's spec.
        AUTH_FAILED | ACCESS_DENIED | OPERATION_DENIED => ErrorClass::Unavailable,
        _ => ErrorClass::Transient,
    }
}

/// Why an SSH dial was refused by the material or the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SshRefusal {
    /// `kvm.sshKeyFile` or `kvm.knownHostsFile` does not parse.
    UnusableMaterial,
    /// The host key is unknown, changed or revoked in known_hosts.
    HostKey,
    /// The host rejected the operator's public key.
    KeyRejected,
}

/// The class of an SSH refusal: every one is Unavailable, since re-keying
/// the host, fixing known_hosts or re-authorizing the key heals it and no
/// edit of a Proxy does; until then the provider is retried slowly.
pub fn ssh_refusal_class(r: SshRefusal) -> ErrorClass {
    match r {
        SshRefusal::UnusableMaterial | SshRefusal::HostKey | SshRefusal::KeyRejected => {
            ErrorClass::Unavailable
        }
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
        if let Some(v) = e.downcast_ref::<LibvirtError>() {
            if is_out_of_space(&v.message) {
                return ErrorClass::QuotaExceeded;
            }
            return class_of_code(v.code);
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
            (45, ErrorClass::Unavailable),
            (88, ErrorClass::Unavailable),
            (29, ErrorClass::Unavailable),
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
        let lv = |code, message: &str| LibvirtError {
            code,
            domain: 0,
            message: message.into(),
        };
        assert_eq!(classify(&lv(42, "gone")), ErrorClass::NotFound);
        assert_eq!(
            classify(&lv(38, "write: No space left on device")),
            ErrorClass::QuotaExceeded
        );
    }

    #[test]
    fn ssh_refusal_table() {
        struct Case {
            name: &'static str,
            refusal: SshRefusal,
            want: ErrorClass,
        }
        let cases = [
            Case {
                name: "host key unknown, changed or revoked",
                refusal: SshRefusal::HostKey,
                want: ErrorClass::Unavailable,
            },
            Case {
                name: "public key rejected",
                refusal: SshRefusal::KeyRejected,
                want: ErrorClass::Unavailable,
            },
            Case {
                name: "key or known_hosts does not parse",
                refusal: SshRefusal::UnusableMaterial,
                want: ErrorClass::Unavailable,
            },
        ];
        for c in cases {
            assert_eq!(ssh_refusal_class(c.refusal), c.want, "{}", c.name);
            // The dial error carries the class through `classify`.
            let e = DialError {
                stage: super::super::ssh::Stage::Handshake,
                class: ssh_refusal_class(c.refusal),
                message: "refused".into(),
            };
            assert_eq!(classify(&e), c.want, "{}: classify", c.name);
        }
    }
}
