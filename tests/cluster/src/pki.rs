//! The cluster's certificates and keys: one CA, the API server's serving
//! certificate, a client certificate per component and node, and the
//! service-account signing key. All X.509 v3 with key usages (rustls, the
//! operator's TLS stack, refuses v1 certificates).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// A certificate and its key, written as PEM files.
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The CA, kept in memory to sign the rest.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub cert_pem: String,
    pub cert: PathBuf,
}

fn write(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

fn name(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    dn.push(DnType::CommonName, cn);
    dn
}

impl Ca {
    /// A new self-signed CA, written to `dir/ca.crt` (and its key to `dir/ca.key`).
    pub fn create(dir: &Path) -> anyhow::Result<Ca> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name("test-cluster-ca", None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        let path = dir.join("ca.crt");
        write(&path, &cert_pem, 0o644)?;
        write(&dir.join("ca.key"), &key.serialize_pem(), 0o600)?;
        Ok(Ca {
            issuer: Issuer::new(params, key),
            cert_pem,
            cert: path,
        })
    }

    fn issue(
        &self,
        dir: &Path,
        file: &str,
        params: CertificateParams,
    ) -> anyhow::Result<(Pair, String, String)> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let pair = Pair {
            cert: dir.join(format!("{file}.crt")),
            key: dir.join(format!("{file}.key")),
        };
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        write(&pair.cert, &cert_pem, 0o644)?;
        write(&pair.key, &key_pem, 0o600)?;
        Ok((pair, cert_pem, key_pem))
    }

    /// A serving certificate for `names` (DNS names or IP addresses).
    pub fn serving(&self, dir: &Path, file: &str, names: &[String]) -> anyhow::Result<Pair> {
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name = name(file, None);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        Ok(self.issue(dir, file, params)?.0)
    }

    /// A client certificate for user `cn` in group `org`; returns the pair
    /// and its PEM texts (certificate, key) for embedding in a kubeconfig.
    pub fn client(
        &self,
        dir: &Path,
        file: &str,
        cn: &str,
        org: Option<&str>,
    ) -> anyhow::Result<(Pair, String, String)> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(cn, org);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(dir, file, params)
    }

    /// A kubeconfig for `server` that authenticates as `cn` (group `org`),
    /// with every credential embedded, written to `path`.
    pub fn kubeconfig(
        &self,
        pki: &Path,
        path: &Path,
        server: &str,
        cn: &str,
        org: Option<&str>,
    ) -> anyhow::Result<()> {
        let file = cn.replace(':', "-");
        let (_, cert, key) = self.client(pki, &file, cn, org)?;
        write(path, &kubeconfig_yaml(server, &self.cert_pem, &cert, &key), 0o600)
    }
}

/// A kubeconfig with one cluster, user and context, all named `test-cluster`.
pub fn kubeconfig_yaml(server: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test-cluster\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: test-cluster\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: test-cluster\n  context:\n    cluster: test-cluster\n    user: test-cluster\n    namespace: default\ncurrent-context: test-cluster\npreferences: {{}}\n",
        b64(ca_pem),
        b64(cert_pem),
        b64(key_pem)
    )
}

/// The service-account signing key pair: `dir/sa.key` (PKCS#8 EC P-256)
/// and `dir/sa.pub`.
pub fn service_account_key(dir: &Path) -> anyhow::Result<Pair> {
    let key = KeyPair::generate()?;
    let pair = Pair {
        cert: dir.join("sa.pub"),
        key: dir.join("sa.key"),
    };
    write(&pair.cert, &key.public_key_pem(), 0o644)?;
    write(&pair.key, &key.serialize_pem(), 0o600)?;
    Ok(pair)
}

/// The API server's names: loopback, the in-cluster DNS names, the first
/// service IP and every extra address Pods reach it on.
pub fn apiserver_names(service_ip: IpAddr, extra: &[IpAddr]) -> Vec<String> {
    let mut names: Vec<String> = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "127.0.0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.push(service_ip.to_string());
    names.extend(extra.iter().map(|ip| ip.to_string()));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serving_certificate_names_every_address_pods_use() {
        let names = apiserver_names(
            "10.96.0.1".parse().unwrap(),
            &["10.216.3.1".parse().unwrap()],
        );
        for want in ["127.0.0.1", "10.96.0.1", "10.216.3.1", "kubernetes.default.svc"] {
            assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
        }
    }

    #[test]
    fn a_kubeconfig_embeds_its_credentials() {
        let y = kubeconfig_yaml("https://127.0.0.1:1", "CA", "CERT", "KEY");
        let v: serde_norway::Value = serde_norway::from_str(&y).unwrap();
        assert_eq!(
            v["users"][0]["user"]["client-key-data"].as_str(),
            Some(base64::engine::general_purpose::STANDARD.encode("KEY").as_str())
        );
        assert_eq!(v["current-context"].as_str(), Some("test-cluster"));
    }
}
