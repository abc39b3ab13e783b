//! Deterministic identities: the instance name derived from a Proxy UID,
//! the spec hash that decides replacement, and the installation identity.

use sha2::{Digest, Sha256};

use crate::api::Placement;

/// Prefix of every instance name.
pub const NAME_PREFIX: &str = "proxy-";

/// Version tag of the spec-hash algorithm, so a future change can be
/// migrated without mass replacement.
pub const SPEC_HASH_VERSION: &str = "v1";

fn base32_lower(bytes: &[u8]) -> String {
    data_encoding::BASE32_NOPAD
        .encode(bytes)
        .to_ascii_lowercase()
}

/// The instance name for a Proxy UID: `proxy-` and 16 lowercase base32
/// characters (the first 10 bytes of SHA-256 over the UID). Valid as a GCE
/// instance name, a DNS label and a libvirt domain name, and the same for
/// the same UID every time, which is what makes Create idempotent.
pub fn name_from_uid(uid: &str) -> String {
    let digest = Sha256::digest(uid.as_bytes());
    format!("{NAME_PREFIX}{}", base32_lower(&digest[..10]))
}

/// The name of a Proxy's instance of `serial`: [`name_from_uid`] for 0
/// (every instance before surge replacements existed keeps its name), and
/// `-<serial>` after it from 1 on, so a surge replacement and the instance
/// it replaces can exist at once. At most 6 + 16 + 11 characters: still a
/// valid GCE instance name, DNS label and libvirt domain name.
pub fn instance_name(uid: &str, serial: u32) -> String {
    match serial {
        0 => name_from_uid(uid),
        n => format!("{}-{n}", name_from_uid(uid)),
    }
}

/// The inputs of the spec hash: what the instance is built from.
#[derive(Clone, Copy, Debug)]
pub struct HashInput<'a> {
    /// `spec.placement` (absent counts as all-empty).
    pub placement: Option<&'a Placement>,
    /// The resolved cloud-init text (empty when none).
    pub cloud_init: &'a str,
    /// `spec.port` (0 when unset).
    pub port: i32,
    /// `spec.auth.mode: None`: the proxy takes no credentials. Only this
    /// mode enters the hash, so instances made before credentials existed
    /// keep their hash (they are not rolled by an upgrade).
    pub open: bool,
}

/// `v1:` and the lowercase hex SHA-256 of the canonical JSON
/// `{"cloudInit","placement":{"image","machineType","region","zone"},"port"}`
/// with sorted keys and empty strings kept. Attributes, health settings and
/// the provider config are deliberately not covered: changing them never
/// replaces an instance. The input holds cloud-init: never log it.
pub fn spec_hash(input: HashInput<'_>) -> String {
    let empty = Placement::default();
    let p = input.placement.unwrap_or(&empty);
    // serde_json's default map is a BTreeMap, so the keys come out sorted.
    let canonical = serde_json::json!({
        "cloudInit": input.cloud_init,
        "placement": {
            "image": p.image,
            "machineType": p.machine_type,
            "region": p.region,
            "zone": p.zone,
        },
        "port": input.port,
    });
    let canonical = match input.open {
        true => {
            let mut c = canonical;
            c["auth"] = serde_json::json!("None");
            c
        }
        false => canonical,
    };
    let digest = Sha256::digest(canonical.to_string().as_bytes());
    let mut hex = String::with_capacity(64 + 3);
    hex.push_str(SPEC_HASH_VERSION);
    hex.push(':');
    for b in digest {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// The default installation identity: 16 lowercase base32 characters from
/// SHA-256 over the `kube-system` namespace UID (stable for the life of a
/// cluster) and the operator's namespace (two installs in one cluster differ).
pub fn derive_installation_id(kube_system_uid: &str, operator_namespace: &str) -> String {
    let mut h = Sha256::new();
    h.update(kube_system_uid.as_bytes());
    h.update(b"/");
    h.update(operator_namespace.as_bytes());
    base32_lower(&h.finalize()[..10])
}

/// Checks a user-supplied installation identity. It is written as a GCE
/// label value, a Pod label value and libvirt metadata text, so it must be
/// valid in all three: 1–63 lowercase letters, digits, `-` or `_`, starting
/// and ending with a letter or digit.
pub fn validate_installation_id(id: &str) -> Result<(), String> {
    let ok_len = (1..=63).contains(&id.len());
    let ok_chars = id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    let ends_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok_len && ok_chars && ends_ok(id.bytes().next()) && ends_ok(id.bytes().last()) {
        Ok(())
    } else {
        Err(format!(
            "installation id {id:?} must be 1-63 lowercase letters, digits, '-' or '_', starting and ending with a letter or digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_from_uid_golden_and_shape() {
        // Pinned: changing the derivation orphans every existing instance.
        assert_eq!(
            name_from_uid("6f1c1b2e-3c1a-4d0e-9a55-1b8c1d2e3f40"),
            name_from_uid("6f1c1b2e-3c1a-4d0e-9a55-1b8c1d2e3f40")
        );
        assert_eq!(name_from_uid(""), "proxy-4oymiquy7qobjgx3");
        assert_eq!(name_from_uid("abc"), "proxy-xj4bnp4pahh6uqkb");
        for uid in ["", "abc", "6f1c1b2e-3c1a-4d0e-9a55-1b8c1d2e3f40", "ünïcode"] {
            let n = name_from_uid(uid);
            assert_eq!(n.len(), 22, "{n}");
            assert!(n.starts_with("proxy-"));
            assert!(
                n[6..]
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)),
                "{n}"
            );
        }
        assert_ne!(name_from_uid("a"), name_from_uid("b"));
        assert_eq!(instance_name("abc", 0), "proxy-xj4bnp4pahh6uqkb");
        assert_eq!(instance_name("abc", 3), "proxy-xj4bnp4pahh6uqkb-3");
        assert!(instance_name("abc", u32::MAX).len() <= 63);
    }

    fn placement(region: &str, zone: &str, mt: &str, image: &str) -> Placement {
        Placement {
            region: region.into(),
            zone: zone.into(),
            machine_type: mt.into(),
            image: image.into(),
        }
    }

    #[test]
    fn spec_hash_is_stable_and_versioned() {
        let p = placement("r", "z", "m", "i");
        let a = spec_hash(HashInput {
            placement: Some(&p),
            cloud_init: "#cloud-config\n",
            port: 3128,
            open: false,
        });
        let b = spec_hash(HashInput {
            placement: Some(&p.clone()),
            cloud_init: "#cloud-config\n",
            port: 3128,
            open: false,
        });
        assert_eq!(a, b);
        assert!(a.starts_with("v1:"));
        assert_eq!(a.len(), 3 + 64);
        // Pinned: a change here replaces every instance in every cluster.
        assert_eq!(
            spec_hash(HashInput {
                placement: None,
                cloud_init: "",
                port: 3128,
                open: false,
            }),
            "v1:f533ec53621ca997416a855fdb6bd3033772f7e2c66cabda34bc6196bdd95343"
        );
    }

    #[test]
    fn spec_hash_changes_with_each_covered_field() {
        let base = placement("r", "z", "m", "i");
        let h = |p: &Placement, ci: &str, port: i32| {
            spec_hash(HashInput {
                placement: Some(p),
                cloud_init: ci,
                port,
                open: false,
            })
        };
        let reference = h(&base, "ci", 3128);
        let variants = [
            ("region", h(&placement("r2", "z", "m", "i"), "ci", 3128)),
            ("zone", h(&placement("r", "z2", "m", "i"), "ci", 3128)),
            (
                "machineType",
                h(&placement("r", "z", "m2", "i"), "ci", 3128),
            ),
            ("image", h(&placement("r", "z", "m", "i2"), "ci", 3128)),
            ("cloudInit", h(&base, "ci2", 3128)),
            ("port", h(&base, "ci", 3129)),
            (
                "auth.mode None",
                spec_hash(HashInput {
                    placement: Some(&base),
                    cloud_init: "ci",
                    port: 3128,
                    open: true,
                }),
            ),
        ];
        for (field, v) in &variants {
            assert_ne!(&reference, v, "changing {field} must change the hash");
        }
        // Moving a value between fields is a different spec too.
        assert_ne!(
            h(&placement("a", "", "", ""), "", 1),
            h(&placement("", "a", "", ""), "", 1)
        );
        // Absent placement is the same as an all-empty one.
        assert_eq!(
            spec_hash(HashInput {
                placement: None,
                cloud_init: "x",
                port: 1,
                open: false,
            }),
            h(&Placement::default(), "x", 1)
        );
    }

    #[test]
    fn spec_hash_ignores_attributes_and_health_settings() {
        use crate::api::{HealthCheckSpec, ProxySpec};
        let mut a = ProxySpec {
            port: Some(3128),
            placement: Some(placement("r", "z", "m", "i")),
            ..Default::default()
        };
        let hash_of = |s: &ProxySpec| {
            spec_hash(HashInput {
                placement: s.placement.as_ref(),
                cloud_init: "",
                port: s.port.unwrap_or(0),
                open: false,
            })
        };
        let before = hash_of(&a);
        a.attributes.insert("geo".into(), "home".into());
        a.health_check = Some(HealthCheckSpec {
            interval_seconds: Some(9),
            ..Default::default()
        });
        assert_eq!(before, hash_of(&a));
    }

    #[test]
    fn installation_ids() {
        let a = derive_installation_id("uid-1", "egress-proxies-operator-system");
        assert_eq!(
            a,
            derive_installation_id("uid-1", "egress-proxies-operator-system")
        );
        assert_ne!(
            a,
            derive_installation_id("uid-2", "egress-proxies-operator-system")
        );
        assert_ne!(a, derive_installation_id("uid-1", "other"));
        assert_eq!(a.len(), 16);
        validate_installation_id(&a).unwrap();
        for good in ["a", "prod-eu_1", "0abc"] {
            validate_installation_id(good).unwrap();
        }
        for bad in ["", "Prod", "-a", "a-", "a.b", "a b", &"a".repeat(64)] {
            assert!(validate_installation_id(bad).is_err(), "{bad:?}");
        }
    }
}
