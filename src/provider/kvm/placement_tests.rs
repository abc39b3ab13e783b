use super::*;

fn cfg(hosts: &[&str]) -> KvmConfig {
    let hosts: Vec<_> = hosts
        .iter()
        .map(|n| serde_json::json!({"name": n, "address": format!("{n}:22"), "user": "u", "bridge": "br0"}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "sshKeyFile": "/k",
        "knownHostsFile": "/kh",
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

/// Hosts, zone, machine type, image, and the host index or error wanted.
type Row<'a> = (
    &'a [&'a str],
    &'a str,
    &'a str,
    &'a str,
    Result<usize, &'a str>,
);

#[test]
fn resolution_table() {
    let url = "https://example.com/x.qcow2";
    let table: &[Row] = &[
        (&["a"], "", "small", "deb", Ok(0)),
        (&["a", "b"], "b", "small", "deb", Ok(1)),
        (&["a", "b"], "a", "small", url, Ok(0)),
        (&[], "", "small", "deb", Err("kvm.hosts is empty")),
        (
            &["a", "b"],
            "",
            "small",
            "deb",
            Err("placement.zone is required when kvm.hosts lists more than one host"),
        ),
        (
            &["a"],
            "c",
            "small",
            "deb",
            Err("host \"c\" is not in kvm.hosts"),
        ),
        (
            &["a"],
            "a",
            "huge",
            "deb",
            Err("placement.machineType \"huge\" is not in kvm.machineTypes"),
        ),
        (
            &["a"],
            "a",
            "small",
            "nope",
            Err("placement.image \"nope\" is neither a key in kvm.images nor an http(s) URL"),
        ),
        (
            &["a"],
            "a",
            "small",
            "ftp://x/y",
            Err("placement.image \"ftp://x/y\" is neither a key in kvm.images nor an http(s) URL"),
        ),
    ];
    for (hosts, zone, mt, image, want) in table {
        let c = cfg(hosts);
        let got = resolve(&c, &placement(zone, mt, image));
        match (got, want) {
            (Ok(r), Ok(i)) => {
                assert_eq!(r.host, *i, "{zone:?}");
                assert_eq!(r.machine_type.vcpus, 1);
            }
            (Err(e), Err(w)) => assert_eq!(e, *w),
            (got, want) => panic!("{hosts:?} {zone:?} {mt:?} {image:?}: {got:?}, want {want:?}"),
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
        ids::base_volume_for_key("deb", ImageFormat::Raw)
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
