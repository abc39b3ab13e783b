//! Every load-time rule of the providers file, as a user meets it: the
//! message must name the entry, the key and the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use egress_proxies_operator::config::{ProviderSettings, ProvidersConfig};
use egress_proxies_operator::provider::registry::ProviderType;

const KVM_OK: &str = r#"
    kvm:
      sshKeyFile: /etc/proxy-operator/kvm/id_ed25519
      knownHostsFile: /etc/proxy-operator/kvm/known_hosts
      images:
        debian-13: {url: "https://cloud.debian.org/images/cloud/trixie/latest/debian-13-generic-amd64.qcow2"}
      machineTypes:
        small: {vcpus: 1, memoryMiB: 1024}
      hosts:
        - {name: nas1, address: "nas1.home.lan:22", user: virt, bridge: br0}
"#;

fn kvm_entry(body: &str) -> String {
    format!("providers:\n  - name: kvm-home\n    type: kvm\n    kvm:\n{body}")
}

fn err(doc: &str) -> String {
    match ProvidersConfig::from_slice(doc.as_bytes()) {
        Ok(c) => panic!("accepted:\n{doc}\n=> {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_err(doc: &str, parts: &[&str]) {
    let msg = err(doc);
    for p in parts {
        assert!(
            msg.contains(p),
            "error {msg:?} should contain {p:?}\nfor:\n{doc}"
        );
    }
}

#[test]
fn a_full_valid_file_loads_with_defaults() {
    let doc = format!(
        "providers:\n  - name: kubernetes\n    type: kubernetes\n  - name: gcp-eu\n    type: gcp\n    gcp:\n      project: my-project\n      networkTag: egress-proxy\n  - name: kvm-home\n    type: kvm{KVM_OK}"
    );
    let cfg = ProvidersConfig::from_slice(doc.as_bytes()).unwrap();
    assert_eq!(cfg.names(), ["kubernetes", "gcp-eu", "kvm-home"]);
    match &cfg.get("kubernetes").unwrap().settings {
        ProviderSettings::Kubernetes(k) => assert_eq!(k.image, "ubuntu/squid:6.6-24.04_edge"),
        other => panic!("{other:?}"),
    }
    match &cfg.get("gcp-eu").unwrap().settings {
        ProviderSettings::Gcp(g) => {
            assert_eq!(g.project, "my-project");
            assert_eq!(g.network, "default");
            assert_eq!(g.disk_size_gb_or_default(), 10);
            assert!(!g.anonymous);
        }
        other => panic!("{other:?}"),
    }
    let kvm = cfg.get("kvm-home").unwrap();
    assert_eq!(kvm.provider_type, ProviderType::Kvm);
    match &kvm.settings {
        ProviderSettings::Kvm(k) => {
            assert_eq!(k.hosts[0].socket, "/var/run/libvirt/libvirt-sock");
            assert_eq!(k.hosts[0].pool, "default");
            assert!(k.installs_guest_agent());
            assert_eq!(k.disk_size_gb_or_default(), 10);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn structure_errors() {
    assert_err("", &["empty", "providers"]);
    assert_err("providers: []\nextra: 1\n", &["unknown field `extra`"]);
    assert_err("provider: []\n", &["unknown field `provider`", "providers"]);
    assert_err("foo: 1\n", &["unknown field `foo`"]);
    assert_err(
        "providers:\n  - just-a-string\n",
        &["providers[0]", "must be a mapping"],
    );
    assert_err("providers: {}\n", &["providers"]);
    // A typo'd key in an entry names the entry and the key.
    assert_err(
        "providers:\n  - name: kubernetes\n    tpye: kubernetes\n",
        &["providers[0] \"kubernetes\"", "unknown field `tpye`"],
    );
    // Duplicated keys are refused, not silently merged.
    assert_err(
        "providers:\n  - name: a\n    name: b\n    type: kubernetes\n",
        &["providers[0]", "duplicate"],
    );
    assert!(ProvidersConfig::from_slice(b"providers: []\n")
        .unwrap()
        .providers
        .is_empty());
}

#[test]
fn name_rules() {
    assert_err(
        "providers:\n  - type: kubernetes\n",
        &["providers[0]", "name is required"],
    );
    assert_err(
        "providers:\n  - name: GCP_EU\n    type: kubernetes\n",
        &["providers[0] \"GCP_EU\"", "DNS-1123"],
    );
    assert_err(
        &format!(
            "providers:\n  - name: {}\n    type: kubernetes\n",
            "a".repeat(64)
        ),
        &["DNS-1123"],
    );
    assert_err(
        "providers:\n  - name: -a\n    type: kubernetes\n",
        &["DNS-1123"],
    );
    assert_err(
        "providers:\n  - name: 7\n    type: kubernetes\n",
        &["name must be a string"],
    );
    assert_err(
        "providers:\n  - name: k\n    type: kubernetes\n  - name: k\n    type: kubernetes\n",
        &[
            "providers[1] \"k\"",
            "duplicate provider name \"k\"",
            "providers[0]",
        ],
    );
}

#[test]
fn type_rules() {
    assert_err(
        "providers:\n  - name: x\n",
        &["providers[0] \"x\"", "type is required"],
    );
    assert_err(
        "providers:\n  - name: x\n    type: gpc\n",
        &[
            "providers[0] \"x\"",
            "unknown provider type \"gpc\"",
            "kubernetes, gcp, kvm",
        ],
    );
    assert_err(
        "providers:\n  - name: x\n    type: GCP\n",
        &["unknown provider type \"GCP\""],
    );
    assert_err(
        "providers:\n  - name: x\n    type: kvm\n    gcp: {project: p}\n",
        &["type is kvm but a gcp block is set"],
    );
    assert_err(
        "providers:\n  - name: x\n    type: gcp\n    gcp: {project: p}\n    kubernetes: {}\n",
        &["type is gcp but a kubernetes block is set"],
    );
    assert_err(
        "providers:\n  - name: x\n    type: kubernetes\n    kvm: {}\n",
        &["type is kubernetes but a kvm block is set"],
    );
    // Order: the type is checked before a bad block's contents.
    assert_err(
        "providers:\n  - name: x\n    type: bogus\n    gcp: {projct: p}\n",
        &["unknown provider type"],
    );
}

#[test]
fn kubernetes_block() {
    assert_err(
        "providers:\n  - name: k\n    type: kubernetes\n    kubernetes: {imag: x}\n",
        &["providers[0] \"k\"", "kubernetes", "unknown field `imag`"],
    );
    assert_err(
        "providers:\n  - name: k\n    type: kubernetes\n    kubernetes: {image: \"\"}\n",
        &["kubernetes.image"],
    );
    let cfg = ProvidersConfig::from_slice(
        b"providers:\n  - name: k\n    type: kubernetes\n    kubernetes: {image: squid:7}\n",
    )
    .unwrap();
    match &cfg.providers[0].settings {
        ProviderSettings::Kubernetes(k) => assert_eq!(k.image, "squid:7"),
        other => panic!("{other:?}"),
    }
    assert_err(
        "providers:\n  - name: k\n    type: kubernetes\n    kubernetes: {destinations: {deny: [10.0.0.0/33]}}\n",
        &[
            "providers[0] \"k\"",
            "kubernetes.destinations.deny[0]: \"10.0.0.0/33\" is not an IP address or CIDR",
        ],
    );
    assert_err(
        "providers:\n  - name: k\n    type: kubernetes\n    kubernetes: {destinations: {block: []}}\n",
        &["kubernetes.destinations", "unknown field `block`"],
    );
}

#[test]
fn gcp_block() {
    let gcp = |body: &str| format!("providers:\n  - name: gcp-eu\n    type: gcp\n{body}");
    assert_err(
        &gcp(""),
        &["providers[0] \"gcp-eu\"", "gcp block is required"],
    );
    assert_err(
        &gcp("    gcp: {network: default}\n"),
        &["providers[0] \"gcp-eu\"", "gcp.project is required"],
    );
    assert_err(
        &gcp("    gcp: {projct: p}\n"),
        &["gcp", "unknown field `projct`"],
    );
    assert_err(
        &gcp("    gcp: {project: p, diskSizeGb: -1}\n"),
        &["gcp.diskSizeGb must not be negative"],
    );
    assert_err(
        &gcp("    gcp: {project: p, endpoint: \"ftp://x\"}\n"),
        &["gcp.endpoint", "http(s) URL"],
    );
    assert_err(
        &gcp("    gcp: {project: p, allowedImages: [\"projects/*/images/*\"]}\n"),
        &["gcp.allowedImages[0]", "a prefix ending in a single '*'"],
    );
    assert_err(
        &gcp("    gcp: {project: p, allowedZones: e2-small}\n"),
        &["gcp.allowedZones"],
    );
    assert_err(
        &gcp("    gcp: {project: p, allowedPorts: [3128, \"9000-8000\"]}\n"),
        &[
            "providers[0] \"gcp-eu\"",
            "gcp.allowedPorts[1]: \"9000-8000\" is a range whose start is past its end",
        ],
    );
    assert_err(
        &gcp("    gcp: {project: p, allowedPorts: []}\n"),
        &["gcp.allowedPorts must list at least one port or range"],
    );
    assert_err(
        &gcp("    gcp: {project: p, diskSizeGb: ten}\n"),
        &["gcp", "diskSizeGb"],
    );
    let cfg = ProvidersConfig::from_slice(
        gcp("    gcp: {project: p, endpoint: \"http://127.0.0.1:9\", anonymous: true, diskSizeGb: 20}\n").as_bytes(),
    )
    .unwrap();
    match &cfg.providers[0].settings {
        ProviderSettings::Gcp(g) => {
            assert!(g.anonymous);
            assert_eq!(g.endpoint.as_deref(), Some("http://127.0.0.1:9"));
            assert_eq!(g.disk_size_gb_or_default(), 20);
        }
        other => panic!("{other:?}"),
    }
}

/// kvm.md §2.2, rule by rule, in order.
#[test]
fn kvm_block() {
    let base_ok =
        ProvidersConfig::from_slice(kvm_entry(&KVM_OK.replace("    kvm:\n", "")).as_bytes());
    assert!(base_ok.is_ok(), "{base_ok:?}");
    let with = |replace: &str, by: &str| {
        let body = KVM_OK.replace("    kvm:\n", "");
        assert!(body.contains(replace), "fixture lacks {replace}");
        kvm_entry(&body.replace(replace, by))
    };
    assert_err(
        "providers:\n  - name: kvm-home\n    type: kvm\n",
        &["providers[0] \"kvm-home\"", "kvm block is required"],
    );
    assert_err(
        &with("      sshKeyFile: /etc/proxy-operator/kvm/id_ed25519\n", ""),
        &["kvm.sshKeyFile is required"],
    );
    assert_err(
        &with(
            "      knownHostsFile: /etc/proxy-operator/kvm/known_hosts\n",
            "",
        ),
        &["kvm.knownHostsFile is required unless kvm.insecureIgnoreHostKey is true"],
    );
    let ok = ProvidersConfig::from_slice(
        with(
            "      knownHostsFile: /etc/proxy-operator/kvm/known_hosts\n",
            "      insecureIgnoreHostKey: true\n",
        )
        .as_bytes(),
    );
    assert!(ok.is_ok(), "{ok:?}");
    assert_err(
        &with("      images:\n", "      diskSizeGb: -5\n      images:\n"),
        &["kvm.diskSizeGb must not be negative"],
    );
    assert_err(
        &with(
            "      images:\n",
            "      allowedAddresses: [192.168.122.0/24, \"10.0.0.0/33\"]\n      images:\n",
        ),
        &[
            "kvm.allowedAddresses[1]",
            "\"10.0.0.0/33\" is not an IP address or CIDR",
        ],
    );
    assert_err(
        &with(
            "      images:\n",
            "      allowedAddresses: [\"192.168.122.0/24,10.0.0.0/8\"]\n      images:\n",
        ),
        &["kvm.allowedAddresses[0]", "is not one IP address or CIDR"],
    );
    assert_err(
        &with(
            "      images:\n",
            "      allowedImageUrls: [\"ftp://mirror.example/\"]\n      images:\n",
        ),
        &["kvm.allowedImageUrls[0] must be an http(s) URL", "ftp://"],
    );
    assert_err(
        &with("        debian-13: {url:", "        ../etc/x: {url:"),
        &[
            "kvm.images[\"../etc/x\"]",
            "key must be letters, digits, dots, dashes or underscores",
        ],
    );
    assert_err(
        &with(
            "{url: \"https://cloud.debian.org",
            "{url: \"ftp://cloud.debian.org",
        ),
        &[
            "kvm.images[\"debian-13\"].url must be an http(s) URL",
            "ftp://",
        ],
    );
    assert_err(
        &with("{url: \"https://cloud.debian.org", "{url: \"/local/file"),
        &["must be an http(s) URL"],
    );
    assert_err(
        &with("-amd64.qcow2\"}", "-amd64.qcow2\", sha256: abc}"),
        &["kvm.images[\"debian-13\"].sha256 must be 64 hex characters"],
    );
    assert!(ProvidersConfig::from_slice(
        with(
            "-amd64.qcow2\"}",
            &format!("-amd64.qcow2\", sha256: {}}}", "aB".repeat(32))
        )
        .as_bytes()
    )
    .is_ok());
    assert_err(
        &with("-amd64.qcow2\"}", "-amd64.qcow2\", format: vmdk}"),
        &["kvm.images[\"debian-13\"].format must be qcow2 or raw (got \"vmdk\")"],
    );
    assert_err(
        &with("-amd64.qcow2\"}", "-amd64.qcow2\", firmware: coreboot}"),
        &["firmware must be uefi or bios"],
    );
    assert_err(
        &with("-amd64.qcow2\"}", "-amd64.qcow2\", sha: x}"),
        &["kvm", "unknown field `sha`"],
    );
    assert_err(
        &with(
            "      machineTypes:\n        small: {vcpus: 1, memoryMiB: 1024}\n",
            "",
        ),
        &["kvm.machineTypes must define at least one profile"],
    );
    assert_err(
        &with("{vcpus: 1, memoryMiB: 1024}", "{vcpus: 0, memoryMiB: 1024}"),
        &["kvm.machineTypes[\"small\"] needs vcpus > 0 and memoryMiB > 0"],
    );
    assert_err(
        &with("{vcpus: 1, memoryMiB: 1024}", "{vcpus: 1, memoryMiB: -1}"),
        &["needs vcpus > 0 and memoryMiB > 0"],
    );
    assert_err(
        &with("      hosts:\n        - {name: nas1, address: \"nas1.home.lan:22\", user: virt, bridge: br0}\n", "      hosts: []\n"),
        &["kvm.hosts must list at least one host"],
    );
    assert_err(
        &with("{name: nas1, ", "{"),
        &["kvm.hosts[0]: name is required"],
    );
    assert_err(
        &with("{name: nas1, ", "{name: \"a/b\", "),
        &["kvm.hosts[0]", "providerID"],
    );
    assert_err(
        &with(
            "        - {name: nas1, address: \"nas1.home.lan:22\", user: virt, bridge: br0}\n",
            "        - {name: nas1, address: \"nas1.home.lan:22\", user: virt, bridge: br0}\n        - {name: nas1, address: \"b:22\", user: virt, bridge: br0}\n",
        ),
        &["duplicate host name \"nas1\""],
    );
    assert_err(
        &with("address: \"nas1.home.lan:22\", ", ""),
        &["kvm.hosts[0] \"nas1\": address is required"],
    );
    assert_err(
        &with(
            "address: \"nas1.home.lan:22\"",
            "address: \"nas1.home.lan\"",
        ),
        &["kvm.hosts[0] \"nas1\": address", "host:port"],
    );
    assert_err(
        &with("user: virt, ", ""),
        &["kvm.hosts[0] \"nas1\": user is required"],
    );
    assert_err(
        &with(", bridge: br0", ""),
        &["kvm.hosts[0] \"nas1\": bridge is required"],
    );
    assert_err(
        &with(", bridge: br0", ", bridge: br0, domainType: xen"),
        &["kvm", "domainType", "xen"],
    );
    assert_err(
        &with(", bridge: br0", ", bridge: br0, socket: relative.sock"),
        &["socket must be an absolute path"],
    );
    let q = ProvidersConfig::from_slice(
        with(
            ", bridge: br0",
            ", bridge: br0, domainType: qemu, pool: images",
        )
        .as_bytes(),
    )
    .unwrap();
    match &q.providers[0].settings {
        ProviderSettings::Kvm(k) => {
            assert_eq!(
                k.hosts[0].domain_type,
                egress_proxies_operator::config::DomainType::Qemu
            );
            assert_eq!(k.hosts[0].pool, "images");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_broken_entry_is_reported_at_once() {
    let doc = "providers:\n  - name: GCP_EU\n    type: gcp\n  - name: ok\n    type: kubernetes\n  - name: x\n    type: nope\n";
    let e = ProvidersConfig::from_slice(doc.as_bytes()).unwrap_err();
    assert_eq!(e.problems.len(), 2, "{e}");
    assert!(e.problems[0].starts_with("providers[0] \"GCP_EU\""));
    assert!(e.problems[1].starts_with("providers[2] \"x\""));
}

#[test]
fn the_shipped_providers_files_are_valid() {
    let load = |rel: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
        ProvidersConfig::load(&path).unwrap_or_else(|e| panic!("{rel}: {e}"))
    };
    // The samples' file defines every provider the samples name.
    assert_eq!(
        load("config/samples/providers-config.yaml").names(),
        ["kubernetes", "gcp-eu", "kvm-home"]
    );
    // `make run` needs no cloud or hypervisor.
    assert_eq!(
        load("config/samples/providers-dev.yaml").names(),
        ["kubernetes"]
    );
}

/// `createsPerMinute` and `maxCreatesInFlight` sit on every entry, next to
/// `name` and `type`, whatever the type; absent, they take the defaults.
#[test]
fn create_limits_on_every_type() {
    let doc = format!(
        "providers:\n  - name: kubernetes\n    type: kubernetes\n    createsPerMinute: 120\n  - name: gcp-eu\n    type: gcp\n    maxCreatesInFlight: 7\n    gcp:\n      project: my-project\n  - name: kvm-home\n    type: kvm\n    createsPerMinute: 6\n    maxCreatesInFlight: 2{KVM_OK}"
    );
    let cfg = ProvidersConfig::from_slice(doc.as_bytes()).unwrap();
    let limits = |name: &str| {
        let l = cfg.get(name).unwrap().limits;
        (l.creates_per_minute, l.max_creates_in_flight, l.burst())
    };
    assert_eq!(limits("kubernetes"), (120, 100, 20));
    assert_eq!(limits("gcp-eu"), (60, 7, 10));
    assert_eq!(limits("kvm-home"), (6, 2, 1));
}

#[test]
fn create_limit_errors_name_the_entry_the_key_and_the_reason() {
    let entry = |kv: &str| format!("providers:\n  - name: k\n    type: kubernetes\n    {kv}\n");
    assert_err(
        &entry("createsPerMinute: 0"),
        &[
            "providers[0] \"k\"",
            "createsPerMinute must be at least 1 (got 0)",
        ],
    );
    assert_err(
        &entry("maxCreatesInFlight: -1"),
        &[
            "providers[0] \"k\"",
            "maxCreatesInFlight must be at least 1 (got -1)",
        ],
    );
    assert_err(
        &entry("createsPerMinute: fast"),
        &[
            "providers[0] \"k\"",
            "createsPerMinute must be a whole number",
            "a string",
        ],
    );
    assert_err(
        &entry("createsPerMinute: 100000"),
        &[
            "providers[0] \"k\"",
            "createsPerMinute must be at most 6000 (got 100000)",
        ],
    );
    assert_err(
        &entry("maxCreatesInFlight: 2.5"),
        &["providers[0] \"k\"", "maxCreatesInFlight", "(got 2.5)"],
    );
    // A key in the type's block is not where the limits go.
    assert_err(
        "providers:\n  - name: k\n    type: kubernetes\n    kubernetes:\n      createsPerMinute: 5\n",
        &["providers[0] \"k\"", "unknown field `createsPerMinute`"],
    );
}
