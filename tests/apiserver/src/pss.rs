//! Pod Security admission, `restricted` level: a Pod created in a
//! namespace labelled `pod-security.kubernetes.io/enforce: restricted` is
//! refused, as the real admission plugin refuses it, when its spec breaks a
//! rule of the Pod Security Standards (baseline and restricted, "latest").
//! The rules are the ones a controller's Pods can break; AppArmor, SELinux
//! options, `procMount` and sysctls are not checked.

use serde_json::Value;

/// The label that turns enforcement on for a namespace.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

const ALLOWED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |k| spec[k].as_array().into_iter().flatten())
}

fn name(c: &Value) -> &str {
    c["name"].as_str().unwrap_or("?")
}

/// Every way the Pod `spec` breaks the restricted standard, in the real
/// plugin's words where it has some; empty when it complies.
pub fn restricted_violations(spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let psc = &spec["securityContext"];
    for k in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[k] == true {
            out.push(format!("host namespaces ({k}=true)"));
        }
    }
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let kind = v
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "name").cloned())
            .unwrap_or_default();
        if !ALLOWED_VOLUMES.contains(&kind.as_str()) {
            out.push(format!(
                "restricted volume types (volume {:?} uses {kind})",
                v["name"].as_str().unwrap_or("?")
            ));
        }
    }
    let pod_non_root = psc["runAsNonRoot"] == true;
    let pod_seccomp = psc["seccompProfile"]["type"].as_str();
    if psc["runAsUser"] == 0 {
        out.push("runAsUser=0 (pod must not set runAsUser=0)".into());
    }
    if matches!(pod_seccomp, Some(t) if t != "RuntimeDefault" && t != "Localhost") {
        out.push(format!(
            "seccompProfile (pod must not set type {pod_seccomp:?})"
        ));
    }
    for c in containers(spec) {
        let sc = &c["securityContext"];
        let n = name(c);
        if sc["privileged"] == true {
            out.push(format!(
                "privileged (container {n:?} must not set privileged=true)"
            ));
        }
        if sc["allowPrivilegeEscalation"] != false {
            out.push(format!(
                "allowPrivilegeEscalation != false (container {n:?} must set securityContext.allowPrivilegeEscalation=false)"
            ));
        }
        let drops: Vec<&str> = sc["capabilities"]["drop"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if !drops.contains(&"ALL") {
            out.push(format!(
                "unrestricted capabilities (container {n:?} must set securityContext.capabilities.drop=[\"ALL\"])"
            ));
        }
        for add in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            if add != "NET_BIND_SERVICE" {
                out.push(format!(
                    "unrestricted capabilities (container {n:?} must not add {add})"
                ));
            }
        }
        if !(pod_non_root && sc["runAsNonRoot"] != false) && sc["runAsNonRoot"] != true {
            out.push(format!(
                "runAsNonRoot != true (pod or container {n:?} must set securityContext.runAsNonRoot=true)"
            ));
        }
        if sc["runAsUser"] == 0 {
            out.push(format!(
                "runAsUser=0 (container {n:?} must not set runAsUser=0)"
            ));
        }
        let seccomp = sc["seccompProfile"]["type"].as_str().or(pod_seccomp);
        if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
            out.push(format!(
                "seccompProfile (pod or container {n:?} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
            ));
        }
        for p in c["ports"].as_array().into_iter().flatten() {
            if p["hostPort"].as_i64().is_some_and(|h| h != 0) {
                out.push(format!(
                    "hostPort (container {n:?} uses hostPort {})",
                    p["hostPort"]
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compliant() -> Value {
        json!({
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "containers": [{"name": "c", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]
        })
    }

    #[test]
    fn a_compliant_pod_passes_and_each_rule_is_enforced() {
        assert_eq!(restricted_violations(&compliant()), Vec::<String>::new());
        type Break = (&'static str, fn(&mut Value));
        let breaks: [Break; 9] = [
            ("host namespaces", |s| s["hostNetwork"] = json!(true)),
            ("restricted volume types", |s| {
                s["volumes"] = json!([{"name": "h", "hostPath": {"path": "/"}}])
            }),
            ("privileged", |s| {
                s["containers"][0]["securityContext"]["privileged"] = json!(true)
            }),
            ("allowPrivilegeEscalation", |s| {
                s["containers"][0]["securityContext"]
                    .as_object_mut()
                    .unwrap()
                    .remove("allowPrivilegeEscalation");
            }),
            ("unrestricted capabilities", |s| {
                s["containers"][0]["securityContext"]["capabilities"] = json!({"drop": ["NET_RAW"]})
            }),
            ("unrestricted capabilities", |s| {
                s["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["SYS_ADMIN"])
            }),
            ("runAsNonRoot", |s| {
                s["securityContext"]["runAsNonRoot"] = json!(false)
            }),
            ("seccompProfile", |s| {
                s["securityContext"]
                    .as_object_mut()
                    .unwrap()
                    .remove("seccompProfile");
            }),
            ("hostPort", |s| {
                s["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 80}])
            }),
        ];
        for (want, f) in breaks {
            let mut s = compliant();
            f(&mut s);
            let v = restricted_violations(&s);
            assert!(v.iter().any(|x| x.starts_with(want)), "{want}: {v:?}");
        }
        // Container-level settings satisfy the pod-level rules too.
        let mut s = compliant();
        s["securityContext"] = json!({});
        s["containers"][0]["securityContext"]["runAsNonRoot"] = json!(true);
        s["containers"][0]["securityContext"]["seccompProfile"] = json!({"type": "RuntimeDefault"});
        assert_eq!(restricted_violations(&s), Vec::<String>::new());
    }
}
