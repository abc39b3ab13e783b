//! RBAC for one bearer token: requests carrying it are authorised against
//! the rules of the Roles and ClusterRoles bound to it, the way the real
//! API server's RBAC authoriser does (no aggregation, no non-resource
//! URLs: discovery stays open, as `system:discovery` leaves it). Every
//! request made with the token is recorded, so a test can compare what the
//! operator did with what its manifests grant.

use serde::Deserialize;
use std::collections::BTreeSet;
use std::sync::Mutex;

/// One rule of a Role or ClusterRole (`rbac.authorization.k8s.io/v1`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    #[serde(default)]
    pub api_groups: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default)]
    pub resource_names: Vec<String>,
}

/// What a request asks for, in RBAC terms.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    /// `plural` or `plural/subresource`.
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

/// The policy of one subject.
#[derive(Debug, Default)]
pub struct Authz {
    /// The bearer token the policy applies to; other tokens are admins.
    pub token: String,
    /// The subject's name, for error messages.
    pub user: String,
    /// Rules from ClusterRoles bound cluster-wide.
    pub cluster_rules: Vec<PolicyRule>,
    /// Rules that apply in one namespace (Roles and RoleBindings).
    pub namespaced_rules: Vec<(String, Vec<PolicyRule>)>,
    seen: Mutex<BTreeSet<Attributes>>,
    denied: Mutex<BTreeSet<Attributes>>,
}

fn covers(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

impl PolicyRule {
    /// Whether this rule grants `a`.
    pub fn allows(&self, a: &Attributes) -> bool {
        covers(&self.verbs, &a.verb)
            && covers(&self.api_groups, &a.group)
            && covers(&self.resources, &a.resource)
            && (self.resource_names.is_empty()
                || a.name
                    .as_deref()
                    .is_some_and(|n| self.resource_names.iter().any(|r| r == n)))
    }
}

impl Authz {
    pub fn new(
        token: &str,
        user: &str,
        cluster_rules: Vec<PolicyRule>,
        namespaced_rules: Vec<(String, Vec<PolicyRule>)>,
    ) -> Authz {
        Authz {
            token: token.into(),
            user: user.into(),
            cluster_rules,
            namespaced_rules,
            seen: Mutex::new(BTreeSet::new()),
            denied: Mutex::new(BTreeSet::new()),
        }
    }

    /// Whether the policy grants `a`.
    pub fn allows(&self, a: &Attributes) -> bool {
        self.cluster_rules.iter().any(|r| r.allows(a))
            || a.namespace.as_deref().is_some_and(|ns| {
                self.namespaced_rules
                    .iter()
                    .filter(|(n, _)| n == ns)
                    .any(|(_, rules)| rules.iter().any(|r| r.allows(a)))
            })
    }

    /// Record `a` and decide it; the message is the real server's wording.
    pub fn check(&self, a: Attributes) -> Result<(), String> {
        let ok = self.allows(&a);
        let msg = (!ok).then(|| self.forbidden_message(&a));
        if !ok {
            if let Ok(mut denied) = self.denied.lock() {
                denied.insert(a.clone());
            }
        }
        if let Ok(mut seen) = self.seen.lock() {
            seen.insert(a);
        }
        msg.map_or(Ok(()), Err)
    }

    /// Every distinct request made with the token so far.
    pub fn seen(&self) -> Vec<Attributes> {
        self.seen
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Every distinct request refused so far.
    pub fn denied(&self) -> Vec<Attributes> {
        self.denied
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn forbidden_message(&self, a: &Attributes) -> String {
        let (plural, sub) = match a.resource.split_once('/') {
            Some((p, s)) => (p, Some(s)),
            None => (a.resource.as_str(), None),
        };
        let qualified = if a.group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{}", a.group)
        };
        let named = a
            .name
            .as_ref()
            .map(|n| format!(" \"{n}\""))
            .unwrap_or_default();
        let what = match sub {
            Some(s) => format!("resource \"{plural}/{s}\""),
            None => format!("resource \"{plural}\""),
        };
        let scope = match &a.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        format!(
            "{qualified}{named} is forbidden: User \"{}\" cannot {} {what} in API group \"{}\" {scope}",
            self.user, a.verb, a.group
        )
    }
}

/// The RBAC attributes of a resource request: `rest` is the path after
/// `/api/v1` or `/apis/<group>/<version>`.
pub fn attributes(method: &str, group: &str, rest: &[&str], watch: bool) -> Attributes {
    let ns_path = rest.len() >= 3
        && rest[0] == "namespaces"
        && !(group.is_empty() && rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
    let (namespace, rest) = if ns_path {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let name = rest.get(1).map(|s| s.to_string());
    let resource = match (rest.first(), rest.get(2)) {
        (Some(p), Some(s)) => format!("{p}/{s}"),
        (Some(p), None) => p.to_string(),
        (None, _) => String::new(),
    };
    let verb = match (method, name.is_some()) {
        ("GET" | "HEAD", false) if watch => "watch",
        ("GET" | "HEAD", false) => "list",
        ("GET" | "HEAD", true) if watch => "watch",
        ("GET" | "HEAD", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "deletecollection",
        ("DELETE", true) => "delete",
        _ => "unknown",
    };
    Attributes {
        verb: verb.into(),
        group: group.into(),
        resource,
        namespace,
        name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(groups: &[&str], res: &[&str], verbs: &[&str]) -> PolicyRule {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
        PolicyRule {
            api_groups: s(groups),
            resources: s(res),
            verbs: s(verbs),
            resource_names: vec![],
        }
    }

    /// "METHOD group /rest/of/path [watch]" => "verb resource ns name".
    #[test]
    fn request_paths_map_to_rbac_attributes() {
        let cases = [
            ("GET - /pods", "list pods - -"),
            ("GET - /pods watch", "watch pods - -"),
            ("GET - /namespaces/a/pods/p", "get pods a p"),
            ("PATCH x.io /proxies/p/status", "patch proxies/status - p"),
            (
                "PUT x.io /namespaces/a/proxies/p/status",
                "update proxies/status a p",
            ),
            ("POST - /namespaces/a/pods", "create pods a -"),
            ("DELETE - /namespaces/a/pods/p", "delete pods a p"),
            ("DELETE - /namespaces/a/pods", "deletecollection pods a -"),
            ("GET - /namespaces/a", "get namespaces - a"),
            (
                "PUT - /namespaces/a/finalize",
                "update namespaces/finalize - a",
            ),
        ];
        for (req, want) in cases {
            let parts: Vec<&str> = req.split(' ').collect();
            let group = if parts[1] == "-" { "" } else { parts[1] };
            let rest: Vec<&str> = parts[2].split('/').filter(|x| !x.is_empty()).collect();
            let a = attributes(parts[0], group, &rest, parts.get(3) == Some(&"watch"));
            let got = format!(
                "{} {} {} {}",
                a.verb,
                a.resource,
                a.namespace.as_deref().unwrap_or("-"),
                a.name.as_deref().unwrap_or("-")
            );
            assert_eq!(got, want, "{req}");
        }
    }

    #[test]
    fn rules_grant_only_what_they_name() {
        let z = Authz::new(
            "t",
            "u",
            vec![rule(&["x.io"], &["proxies"], &["get", "list"])],
            vec![(
                "sys".into(),
                vec![rule(&["coordination.k8s.io"], &["leases"], &["*"])],
            )],
        );
        let a = |verb: &str, group: &str, res: &str, ns: Option<&str>| Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: res.into(),
            namespace: ns.map(Into::into),
            name: None,
        };
        assert!(z.allows(&a("list", "x.io", "proxies", None)));
        assert!(z.allows(&a("get", "x.io", "proxies", Some("any"))));
        assert!(!z.allows(&a("patch", "x.io", "proxies", None)));
        assert!(!z.allows(&a("get", "x.io", "proxies/status", None)));
        assert!(z.allows(&a("update", "coordination.k8s.io", "leases", Some("sys"))));
        assert!(!z.allows(&a(
            "update",
            "coordination.k8s.io",
            "leases",
            Some("default")
        )));
        let err = z
            .check(a("delete", "", "pods", Some("default")))
            .unwrap_err();
        assert!(
            err.contains(
                "cannot delete resource \"pods\" in API group \"\" in the namespace \"default\""
            ),
            "{err}"
        );
        assert_eq!(z.seen().len(), 1);
        assert_eq!(z.denied().len(), 1);
    }
}
