//! What ships, put on a test cluster: the RBAC objects `kubectl kustomize
//! config/default` renders, and a kubeconfig for the ServiceAccount they
//! bind (e2e_samples, the fault suite's credentials test).

use serde_json::Value;

/// The rendered objects of `kinds`, applied server-side as the admin.
pub fn apply_kinds(c: &test_cluster::TestCluster, docs: &[Value], kinds: &[&str]) {
    let items: Vec<&Value> = docs
        .iter()
        .filter(|d| kinds.contains(&d["kind"].as_str().unwrap_or_default()))
        .collect();
    assert!(!items.is_empty(), "nothing of {kinds:?} is rendered");
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), list.to_string()).unwrap();
    c.kubectl_ok(&[
        "apply",
        "--server-side",
        "-f",
        file.path().to_str().unwrap(),
    ]);
}

/// The rendered namespace, then the ServiceAccount and its RBAC, and the
/// shipped admission policy on the manager's Secret writes.
pub fn apply_rbac(c: &test_cluster::TestCluster, docs: &[Value]) {
    apply_kinds(c, docs, &["Namespace"]);
    apply_kinds(
        c,
        docs,
        &[
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ],
    );
    apply_kinds(
        c,
        docs,
        &[
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ],
    );
}

/// A kubeconfig file in `dir` for ServiceAccount `namespace/name` (a token
/// from `kubectl create token`); its path.
pub fn service_account_kubeconfig(
    c: &test_cluster::TestCluster,
    (namespace, name): (&str, &str),
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let token = c.kubectl_ok(&["create", "token", name, "-n", namespace]);
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, token_kubeconfig(c, token.trim())).unwrap();
    path
}

/// A kubeconfig for the admin kubeconfig's server and CA, authenticating
/// with `token`.
pub fn token_kubeconfig(c: &test_cluster::TestCluster, token: &str) -> String {
    let admin: Value =
        serde_norway::from_str(&std::fs::read_to_string(c.kubeconfig()).unwrap()).unwrap();
    let cluster = admin["clusters"][0]["cluster"].clone();
    let kc = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "test-cluster", "cluster": cluster}],
        "users": [{"name": "manager", "user": {"token": token}}],
        "contexts": [{"name": "manager", "context": {"cluster": "test-cluster", "user": "manager"}}],
        "current-context": "manager",
    });
    serde_norway::to_string(&kc).unwrap()
}
