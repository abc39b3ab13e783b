use super::*;

fn cfg() -> GcpConfig {
    GcpConfig {
        project: "p".into(),
        network: "default".into(),
        network_tag: "egress-proxy".into(),
        ..serde_json::from_value(serde_json::json!({})).unwrap()
    }
}

#[test]
fn rule_names_are_valid_gce_names_and_name_their_installation_and_port() {
    let long = "i".repeat(63);
    for installation in ["a", "inst-1", long.as_str()] {
        for port in [1, 3128, 65535] {
            let name = rule_name(installation, port);
            assert!(name.len() <= 63, "{name}");
            assert!(name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
            assert_eq!(port_of(&name, installation), Some(port));
            assert_eq!(port_of(&name, "another"), None, "another installation's");
        }
    }
    assert_eq!(port_of("default-allow-ssh", "a"), None);
    assert_ne!(rule_name("a", 3128), rule_name("b", 3128));
}

#[test]
fn the_rule_admits_the_ranges_to_the_tag_on_the_port_only() {
    let fw = FirewallConfig {
        allowed_source_ranges: vec!["203.0.113.0/24".into(), " 198.51.100.7/32".into()],
    };
    let r = build_rule(&cfg(), &fw, "inst", 3128);
    assert_eq!(r.name.as_deref(), Some(rule_name("inst", 3128).as_str()));
    assert_eq!(r.network.as_deref(), Some("global/networks/default"));
    assert_eq!(r.direction, Some(model::firewall::Direction::Ingress));
    assert_eq!(r.source_ranges, ["203.0.113.0/24", "198.51.100.7/32"]);
    assert_eq!(r.target_tags, ["egress-proxy"]);
    assert_eq!(r.allowed.len(), 1);
    assert_eq!(r.allowed[0].ip_protocol.as_deref(), Some("tcp"));
    assert_eq!(r.allowed[0].ports, ["3128"]);
    assert!(r.description.unwrap().contains("inst"));
}

fn instance(installation: &str, port: Option<&str>) -> model::Instance {
    let mut labels = vec![(LABEL_INSTALLATION, installation)];
    if let Some(p) = port {
        labels.push((LABEL_PORT, p));
    }
    model::Instance::new().set_labels(labels)
}

#[test]
fn only_rules_of_ports_nobody_serves_on_go() {
    let mut ports = PortsInUse::new();
    for i in [
        instance("mine", Some("3128")),
        instance("mine", Some("3128")),
        instance("theirs", Some("8080")),
        instance("old", None),
        instance("old", Some("3128")),
    ] {
        note_instance(&mut ports, &i);
    }
    let rules: Vec<String> = [
        rule_name("mine", 3128),
        rule_name("mine", 8080),
        rule_name("mine", 9000),
        rule_name("theirs", 9000),
        "default-allow-ssh".to_string(),
    ]
    .into();
    let none = BTreeSet::new();
    let mine = ports.get("mine");
    assert_eq!(
        unneeded(&rules, "mine", mine, &none),
        [rule_name("mine", 8080), rule_name("mine", 9000)],
        "another installation's rules and foreign rules are never touched"
    );
    let recent = BTreeSet::from([9000]);
    assert_eq!(
        unneeded(&rules, "mine", mine, &recent),
        [rule_name("mine", 8080)],
        "a port a create just ensured keeps its rule"
    );
    assert_eq!(
        unneeded(&rules, "gone", ports.get("gone"), &none),
        Vec::<String>::new(),
        "no rule of that installation"
    );
    let old_rules = [rule_name("old", 3128), rule_name("old", 8080)];
    assert!(
        unneeded(&old_rules, "old", ports.get("old"), &none).is_empty(),
        "an instance without a port label may serve on any port"
    );
    let last_gone = [rule_name("mine", 3128)];
    assert_eq!(
        unneeded(&last_gone, "mine", None, &none),
        [rule_name("mine", 3128)],
        "no instance left: its rule goes"
    );
}
