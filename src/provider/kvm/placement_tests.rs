use super::*;

fn cfg(hosts: &[&str]) -> KvmConfig {
    let hosts: Vec<_> = hosts
        .iter()
        .map(|n| serde_json::json!({"name": n, "address": format!("{n}:22"), "user": "u", "bridge": "br0"}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "sshKeyFile": "/k",
        "knownHostsFile": "/kh",
        "allowedImageUrls": ["http://example.com/", "https://example.com/"],
        "images": {
            "deb": {"url": "https://example.com/deb.raw", "sha256": "ABCDEF", "format": "raw", "firmware": "bios"},
        },
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 512}},
        "hosts": hosts,
    }))
    .unwrap()
}

fn placement(zone: &str, mt: &str, image: &str) -> Placement {
    Placement {
        zone: zone.into(),
        machine_type: mt.into(),
        image: image.into(),
        ..Placement::default()
    }
}

#[test]
fn resolution_table() {
    struct Case {
        name: &'static str,
        hosts: &'static [&'static str],
        zone: &'static str,
        machine_type: &'static str,
        image: &'static str,
        /// The host index, or the error wanted.
        want: Result<usize, &'static str>,
    }
    let url = "https://example.com/x.qcow2";
    let cases = [
        Case {
            name: "one host needs no zone",
            hosts: &["a"],
            zone: "",
            machine_type: "small",
            image: "deb",
            want: Ok(0),
        },
        Case {
            name: "zone picks the host",
            hosts: &["a", "b"],
            zone: "b",
            machine_type: "small",
            image: "deb",
            want: Ok(1),
        },
        Case {
            name: "direct image url",
            hosts: &["a", "b"],
            zone: "a",
            machine_type: "small",
            image: url,
            want: Ok(0),
        },
        Case {
            name: "no hosts",
            hosts: &[],
            zone: "",
            machine_type: "small",
            image: "deb",
            want: Err("kvm.hosts is empty"),
        },
        Case {
            name: "several hosts need a zone",
            hosts: &["a", "b"],
            zone: "",
            machine_type: "small",
            image: "deb",
            want: Err("placement.zone is required when kvm.hosts lists more than one host"),
        },
        Case {
            name: "unknown zone",
            hosts: &["a"],
            zone: "c",
            machine_type: "small",
            image: "deb",
            want: Err("host \"c\" is not in kvm.hosts"),
        },
        Case {
            name: "unknown machine type",
            hosts: &["a"],
            zone: "a",
            machine_type: "huge",
            image: "deb",
            want: Err("placement.machineType \"huge\" is not in kvm.machineTypes"),
        },
        Case {
            name: "unknown image key",
            hosts: &["a"],
            zone: "a",
            machine_type: "small",
            image: "nope",
            want: Err("placement.image \"nope\" is neither a key in kvm.images nor an http(s) URL"),
        },
        Case {
            name: "image url must be http(s)",
            hosts: &["a"],
            zone: "a",
            machine_type: "small",
            image: "ftp://x/y",
            want: Err(
                "placement.image \"ftp://x/y\" is neither a key in kvm.images nor an http(s) URL",
            ),
        },
    ];
    for c in cases {
        let config = cfg(c.hosts);
        let got = resolve(&config, &placement(c.zone, c.machine_type, c.image));
        match (got, c.want) {
            (Ok(r), Ok(i)) => {
                assert_eq!(r.host, i, "{}", c.name);
                assert_eq!(r.machine_type.vcpus, 1, "{}", c.name);
            }
            (Err(e), Err(w)) => assert_eq!(e, w, "{}", c.name),
            (got, want) => panic!("{}: {got:?}, want {want:?}", c.name),
        }
    }
}

#[test]
fn catalogue_and_direct_images() {
    let c = cfg(&["a"]);
    let r = resolve(&c, &placement("", "small", "deb")).unwrap();
    assert_eq!(r.image.label, "deb");
    assert_eq!(r.image.url, "https://example.com/deb.raw");
    assert_eq!(r.image.sha256.as_deref(), Some("abcdef"));
    assert_eq!(r.image.format, ImageFormat::Raw);
    assert_eq!(r.image.firmware, Firmware::Bios);
    assert_eq!(
        r.image.base_volume,
        ids::base_volume_for_sha256("abcdef", ImageFormat::Raw)
    );
    let url = "http://example.com/x.qcow2";
    let r = resolve(&c, &placement("a", "small", url)).unwrap();
    assert_eq!(r.image.url, url);
    assert_eq!(r.image.sha256, None);
    assert_eq!(r.image.format, ImageFormat::Qcow2);
    assert_eq!(r.image.firmware, Firmware::Uefi);
    assert_eq!(
        r.image.base_volume,
        ids::base_volume_for_url(url, ImageFormat::Qcow2)
    );
}

#[test]
fn direct_urls_outside_the_allowlist_are_refused() {
    let mut c = cfg(&["a"]);
    let url = "http://example.com/x.qcow2";
    c.allowed_image_urls.clear();
    let err = resolve(&c, &placement("a", "small", url)).unwrap_err();
    assert!(
        err.contains("placement.image \"http://example.com/x.qcow2\""),
        "{err}"
    );
    assert!(err.contains("kvm.allowedImageUrls"), "{err}");
    c.allowed_image_urls = vec!["http://other.example/".into()];
    assert!(resolve(&c, &placement("a", "small", url)).is_err());
}
