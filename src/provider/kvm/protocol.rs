//! What the operator and its libvirt helper (`egress-proxies-libvirt`,
//! src/bin/egress-proxies-libvirt) say to each other (docs/architecture.md,
//! "libvirt only where kvm is configured").
//!
//! The helper is started once per operation with the operation's libvirt
//! URI as its one argument; it is the only program that links libvirt, so
//! the operator's own process never maps it. It answers [`Event::Ready`]
//! (or [`Event::Failed`]) once connected, then serves one [`Request`] per
//! line on stdin, in order. For each it writes [`Event`]s, one JSON object
//! per line on stdout: a `Start` and an `End` around every libvirt call
//! (the operator turns them into its `libvirt.rpc` spans and debug lines),
//! `Debug` notes, and last the `Answer` or `Failed`. An upload request is
//! followed on stdin by its bytes in frames (a 4-byte big-endian length,
//! then that many bytes); a zero length means "the source failed: abort".
//! Closing stdin ends the helper; killing it ends its libvirt calls.
//!
//! A request may carry a Proxy's cloud-init (the seed image): no type here
//! derives `Debug`, so none can be logged by accident.

use serde::{Deserialize, Serialize};

use super::xml::Mark;
use crate::config::{DomainType, Firmware, ImageFormat};

/// The helper's file name, next to the operator's binary.
pub const HELPER_NAME: &str = "egress-proxies-libvirt";

/// Overrides where the operator looks for the helper (a path).
pub const HELPER_ENV: &str = "EPO_LIBVIRT_HELPER";

/// One libvirt sequence the helper runs on its connection.
#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// The host check: library version, hostname, the pool's state.
    /// Answers [`HostFacts`].
    Check {
        /// The storage pool.
        pool: String,
    },
    /// Observes one domain (NotFound when missing). Answers
    /// `Result<Observed, String>` (`Err`: its mark does not parse).
    ReadDomain {
        /// Domain name.
        name: String,
    },
    /// The managed domains with what was observed of each. Answers
    /// `Vec<(String, Observed)>`.
    ListManaged,
    /// Destroys and undefines a domain and deletes its volumes. Answers `()`.
    DeleteDomain {
        /// Domain name.
        name: String,
        /// The pool holding its overlay and seed.
        pool: String,
    },
    /// The first create step. Answers [`Existing`].
    Existing {
        /// Domain name.
        name: String,
        /// The Proxy UID the domain must carry.
        uid: String,
        /// The storage pool.
        pool: String,
    },
    /// Overlay, seed, define, start. Answers `()`.
    Build(Build),
    /// The cached base volume's path when it and its digest marker are
    /// there (and the marker matches `sha256`). Answers `Option<String>`.
    BaseReady {
        /// The storage pool.
        pool: String,
        /// The base volume.
        base: String,
        /// The expected digest, lowercase hex.
        sha256: Option<String>,
    },
    /// Deletes a stale base image: marker first, then the volume. Answers `()`.
    RemoveBase {
        /// The storage pool.
        pool: String,
        /// The base volume.
        base: String,
    },
    /// Refreshes the pool and answers its available bytes (`u64`).
    PoolAvailable {
        /// The storage pool.
        pool: String,
    },
    /// Creates the base volume and streams `len` bytes into it from the
    /// frames that follow. Answers `Option<u64>`: the bytes sent, or `None`
    /// when the source aborted (the volume is then deleted).
    Upload {
        /// The storage pool.
        pool: String,
        /// The base volume.
        base: String,
        /// Its size in bytes.
        len: u64,
        /// Its disk format.
        format: ImageFormat,
    },
    /// Deletes one volume; a missing one is fine. Answers `bool` (deleted).
    RemoveVolume {
        /// The storage pool.
        pool: String,
        /// The volume.
        volume: String,
    },
    /// Writes the base image's digest marker and answers the base volume's
    /// path (`String`).
    WriteMarker {
        /// The storage pool.
        pool: String,
        /// The base volume.
        base: String,
        /// Its SHA-256, lowercase hex.
        digest: String,
    },
}

/// Everything the build sequence needs.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Build {
    /// Domain name.
    pub name: String,
    /// The owning Proxy's UID.
    pub uid: String,
    /// The installation identity.
    pub installation: String,
    /// The storage pool.
    pub pool: String,
    /// The host bridge the NIC joins.
    pub bridge: String,
    /// Overlay capacity in bytes.
    pub capacity: u64,
    /// The cached base image's path on the host.
    pub base_path: String,
    /// The base image's format.
    pub base_format: ImageFormat,
    /// Boot firmware.
    pub firmware: Firmware,
    /// libvirt domain type.
    pub domain_type: DomainType,
    /// Memory in MiB.
    pub memory_mib: i64,
    /// Virtual CPUs.
    pub vcpus: i32,
    /// The NoCloud seed image (holds the cloud-init), base64 on the wire.
    #[serde(with = "base64")]
    pub iso: Vec<u8>,
}

/// Outcome of the first create step.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Existing {
    /// The domain exists, carries the UID and runs.
    Done,
    /// The domain exists with another (or no) UID.
    Foreign(String),
    /// No domain; the pool is active.
    Build,
    /// The pool exists but is not running.
    PoolInactive(u32),
}

/// A storage pool's state and sizes (virStoragePoolGetInfo).
#[derive(Serialize, Deserialize, Clone, Copy)]
pub struct PoolInfo {
    /// virStoragePoolState.
    pub state: u32,
    /// Bytes in all.
    pub capacity: u64,
    /// Bytes free.
    pub available: u64,
}

/// What the host check learns.
#[derive(Serialize, Deserialize)]
pub struct HostFacts {
    /// libvirt's packed version number.
    pub version: u64,
    /// The host's name as libvirt reports it.
    pub hostname: String,
    /// The pool's state and sizes.
    pub pool: PoolInfo,
}

/// What Get and ListByTag learn about a domain.
#[derive(Serialize, Deserialize)]
pub struct Observed {
    /// Its GC mark, if it has a readable one.
    pub mark: Option<Mark>,
    /// virDomainState.
    pub state: u32,
    /// Its IPv4 address; empty while it has none.
    pub ip: String,
    /// The NICs' MACs of an active domain without an address yet.
    pub macs: Vec<String>,
}

/// A libvirt error as the helper saw it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LibvirtError {
    /// virErrorNumber.
    pub code: i64,
    /// virErrorDomain.
    pub domain: i64,
    /// libvirt's message.
    pub message: String,
}

/// One line from the helper.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Event {
    /// Connected: requests may follow.
    Ready,
    /// A libvirt call begins.
    Start {
        /// The libvirt API's name.
        rpc: String,
    },
    /// The call that began last ended; `error` when it failed.
    End {
        /// Its error, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<LibvirtError>,
    },
    /// A note for the operator's debug log.
    Debug {
        /// What happened.
        message: String,
        /// Its subject (a volume, a domain), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subject: Option<String>,
    },
    /// The request's answer (its type is the request's).
    Answer(serde_json::Value),
    /// The request (or the connect) failed.
    Failed(LibvirtError),
}

/// A frame header of an upload's bytes.
pub fn frame_header(len: u32) -> [u8; 4] {
    len.to_be_bytes()
}

/// Bytes as standard base64 in JSON.
mod base64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&data_encoding::BASE64.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let t = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        data_encoding::BASE64
            .decode(t.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// Where the operator finds the helper: [`HELPER_ENV`] when set, else next
/// to its own binary (or, for a test binary under `deps/`, one level up,
/// where cargo puts the package's binaries).
pub fn helper_path() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os(HELPER_ENV).filter(|p| !p.is_empty()) {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().unwrap_or(std::path::Path::new("."));
    let beside = dir.join(HELPER_NAME);
    if !beside.exists() && dir.file_name().is_some_and(|n| n == "deps") {
        if let Some(up) = dir.parent() {
            return up.join(HELPER_NAME);
        }
    }
    beside
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_request_round_trips_with_its_seed_bytes() {
        let b = Request::Build(Build {
            name: "epo-1".into(),
            uid: "u".into(),
            installation: "i".into(),
            pool: "default".into(),
            bridge: "br0".into(),
            capacity: 1 << 30,
            base_path: "/p/base".into(),
            base_format: ImageFormat::Qcow2,
            firmware: Firmware::Bios,
            domain_type: DomainType::Qemu,
            memory_mib: 512,
            vcpus: 1,
            iso: vec![0, 1, 2, 250, 255],
        });
        let line = serde_json::to_string(&b).unwrap();
        assert!(line.starts_with(r#"{"op":"build","#), "{line}");
        assert!(!line.contains('\n'), "one request is one line");
        let Request::Build(back) = serde_json::from_str(&line).unwrap() else {
            panic!("not a build: {line}")
        };
        assert_eq!(back.iso, vec![0, 1, 2, 250, 255]);
        assert_eq!(back.domain_type, DomainType::Qemu);
    }

    #[test]
    fn events_read_back_as_written() {
        let lines = [
            r#"{"start":{"rpc":"virDomainGetInfo"}}"#,
            r#"{"end":{}}"#,
            r#"{"end":{"error":{"code":42,"domain":10,"message":"Domain not found"}}}"#,
            r#""ready""#,
            r#"{"answer":[1,2]}"#,
            r#"{"failed":{"code":49,"domain":18,"message":"no pool"}}"#,
        ];
        for l in lines {
            let e: Event = serde_json::from_str(l).unwrap();
            assert_eq!(serde_json::to_string(&e).unwrap(), l);
        }
        let e = LibvirtError {
            code: 42,
            domain: 10,
            message: "Domain not found: no domain with matching name 'x'".into(),
        };
        assert_eq!(
            e.to_string(),
            "Domain not found: no domain with matching name 'x'",
            "a user reads libvirt's own words"
        );
    }
}
