//! SSH material, OpenSSH known_hosts verification and the staged dial
//! (kvm.md §4). Material is read at every dial, never cached, so a key that
//! appears later heals the provider and a rotated key is used by the next
//! dial.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hmac::{Hmac, KeyInit, Mac};
use russh::client;
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use sha1::Sha1;
use ssh_key::known_hosts::{self, HostPatterns};

use super::classify::{ssh_refusal_class, SshRefusal};
use crate::provider::ErrorClass;

/// TCP connect timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// SSH handshake and authentication timeout.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Keepalive interval; two unanswered keepalives close the session.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// Where a dial failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading or parsing the key or known_hosts.
    Material,
    /// TCP connect.
    Tcp,
    /// SSH handshake, host key or authentication.
    Handshake,
    /// The libvirt socket forward or the libvirt handshake.
    LibvirtConnect,
}

impl Stage {
    /// Stage tag as in kvm.md §4.1.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Material => "ssh-material",
            Stage::Tcp => "tcp",
            Stage::Handshake => "ssh-handshake",
            Stage::LibvirtConnect => "libvirt-connect",
        }
    }
}

/// A failed dial, tagged with its stage and class.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct DialError {
    /// Where it failed.
    pub stage: Stage,
    /// What the caller should do.
    pub class: ErrorClass,
    /// What went wrong (never key material).
    pub message: String,
}

impl DialError {
    fn new(stage: Stage, class: ErrorClass, message: impl Into<String>) -> Self {
        DialError {
            stage,
            class,
            message: message.into(),
        }
    }
}

/// One known_hosts entry.
#[derive(Clone, Debug)]
struct Entry {
    revoked: bool,
    hosts: HostPatterns,
    key: Vec<u8>,
}

/// A parsed OpenSSH known_hosts file.
#[derive(Clone, Debug, Default)]
pub struct KnownHosts {
    entries: Vec<Entry>,
}

/// What known_hosts says about a host key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKeyVerdict {
    /// A matching entry.
    Known,
    /// No entry for this host.
    Unknown,
    /// Entries for this host, none with this key.
    Changed,
    /// The key is marked `@revoked`.
    Revoked,
}

/// HMAC-SHA1 of `msg`, as OpenSSH hashes known_hosts names.
fn hmac_sha1(key: &[u8], msg: &[u8]) -> Option<[u8; 20]> {
    // HMAC takes a key of any length, so this never fails in practice.
    let mut mac = <Hmac<Sha1> as KeyInit>::new_from_slice(key).ok()?;
    mac.update(msg);
    Some(mac.finalize().into_bytes().into())
}

fn glob(pat: &str, s: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pat.chars().collect(), s.chars().collect());
    fn go(p: &[char], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some('*') => (0..=t.len()).any(|i| go(&p[1..], &t[i..])),
            Some('?') => !t.is_empty() && go(&p[1..], &t[1..]),
            Some(c) => t.first().is_some_and(|x| x.eq_ignore_ascii_case(c)) && go(&p[1..], &t[1..]),
        }
    }
    go(&p, &t)
}

/// Whether one pattern of a comma list names `host`; a hashed pattern
/// here (negated, `!|1|salt|hash`) is checked as one.
fn pattern_matches(pat: &str, host: &str) -> bool {
    match pat.parse::<HostPatterns>() {
        Ok(HostPatterns::HashedName { salt, hash }) => hashed_matches(&salt, &hash, host),
        _ if pat.starts_with("|1|") => false,
        _ => glob(pat, host),
    }
}

fn hashed_matches(salt: &[u8], hash: &[u8], host: &str) -> bool {
    hmac_sha1(salt, host.as_bytes()).is_some_and(|h| h.as_slice() == hash)
}

/// Whether `host` is named by `hosts`, and not negated.
fn names(hosts: &HostPatterns, host: &str) -> bool {
    match hosts {
        HostPatterns::HashedName { salt, hash } => hashed_matches(salt, hash, host),
        HostPatterns::Patterns(patterns) => {
            let mut hit = false;
            for p in patterns {
                if let Some(neg) = p.strip_prefix('!') {
                    if pattern_matches(neg, host) {
                        return false;
                    }
                } else if pattern_matches(p, host) {
                    hit = true;
                }
            }
            hit
        }
    }
}

impl KnownHosts {
    /// Parses the text of a known_hosts file (each line with ssh-key's
    /// parser). Lines with an unknown marker are refused; `@cert-authority`
    /// lines are ignored (no certificates).
    pub fn parse(text: &str) -> Result<KnownHosts, String> {
        let mut entries = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // ssh-key splits fields on single spaces; OpenSSH on any run.
            let fields: Vec<&str> = line.split_whitespace().collect();
            let rest = match fields[0].strip_prefix('@') {
                Some("revoked") => &fields[1..],
                Some("cert-authority") => continue,
                Some(other) => return Err(format!("line {}: unknown marker @{other}", i + 1)),
                None => &fields[..],
            };
            if rest.len() < 3 {
                return Err(format!("line {}: want hosts, key type and key", i + 1));
            }
            let entry: known_hosts::Entry = fields
                .join(" ")
                .parse()
                .map_err(|e| format!("line {}: key does not parse: {e}", i + 1))?;
            let key = entry
                .public_key()
                .to_bytes()
                .map_err(|e| format!("line {}: key does not encode: {e}", i + 1))?;
            entries.push(Entry {
                revoked: entry.marker() == Some(&known_hosts::Marker::Revoked),
                hosts: entry.host_patterns().clone(),
                key,
            });
        }
        Ok(KnownHosts { entries })
    }

    /// Verdict for `key_blob` (SSH wire encoding) presented by `host`
    /// (`name` or `[name]:port`).
    pub fn verify(&self, host: &str, key_blob: &[u8]) -> HostKeyVerdict {
        let mut seen = false;
        let mut known = false;
        for e in &self.entries {
            if !names(&e.hosts, host) {
                continue;
            }
            if e.revoked {
                if e.key == key_blob {
                    return HostKeyVerdict::Revoked;
                }
                continue;
            }
            seen = true;
            if e.key == key_blob {
                known = true;
            }
        }
        match (known, seen) {
            (true, _) => HostKeyVerdict::Known,
            (false, true) => HostKeyVerdict::Changed,
            (false, false) => HostKeyVerdict::Unknown,
        }
    }
}

/// The name known_hosts records for `address` (`host:port`): the bare host
/// for port 22, `[host]:port` otherwise, as OpenSSH does.
pub fn known_hosts_name(address: &str) -> String {
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "22"));
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if port == "22" {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// The SSH settings of a provider (the three fields of kvm.md §2.3).
#[derive(Clone, Debug)]
pub struct SshSettings {
    /// Private key path.
    pub key_file: String,
    /// known_hosts path.
    pub known_hosts_file: String,
    /// Accept any host key.
    pub insecure: bool,
}

/// Loaded material plus the file stamps it came from.
pub struct Material {
    key: Arc<PrivateKey>,
    known: Option<Arc<KnownHosts>>,
    /// Modification stamps; a change means the material was rotated.
    pub stamp: Stamp,
}

/// Modification time and size of the material files.
pub type Stamp = Vec<Option<(SystemTime, u64)>>;

fn stamp_of(path: &str) -> Option<(SystemTime, u64)> {
    let md = std::fs::metadata(path).ok()?;
    Some((md.modified().ok()?, md.len()))
}

impl SshSettings {
    /// Current stamps of the files this policy reads.
    pub fn stamp(&self) -> Stamp {
        let mut s = vec![stamp_of(&self.key_file)];
        if !self.insecure {
            s.push(stamp_of(&self.known_hosts_file));
        }
        s
    }

    /// Reads and parses the material now: missing files are Transient (the
    /// Secret may not be mounted yet), unparseable ones Unavailable (fixed
    /// in the Secret, not in a Proxy).
    pub fn load(&self) -> Result<Material, DialError> {
        let stamp = self.stamp();
        let text = std::fs::read_to_string(&self.key_file).map_err(|e| {
            DialError::new(
                Stage::Material,
                ErrorClass::Transient,
                format!("reading kvm.sshKeyFile {}: {e}", self.key_file),
            )
        })?;
        let key = russh::keys::decode_secret_key(&text, None).map_err(|e| {
            DialError::new(
                Stage::Material,
                ssh_refusal_class(SshRefusal::UnusableMaterial),
                format!(
                    "kvm.sshKeyFile {} is not a usable unencrypted ed25519/ecdsa private key: {e}",
                    self.key_file
                ),
            )
        })?;
        let known = if self.insecure {
            None
        } else {
            let text = std::fs::read_to_string(&self.known_hosts_file).map_err(|e| {
                DialError::new(
                    Stage::Material,
                    ErrorClass::Transient,
                    format!("reading kvm.knownHostsFile {}: {e}", self.known_hosts_file),
                )
            })?;
            Some(Arc::new(KnownHosts::parse(&text).map_err(|e| {
                DialError::new(
                    Stage::Material,
                    ssh_refusal_class(SshRefusal::UnusableMaterial),
                    format!(
                        "kvm.knownHostsFile {} does not parse: {e}",
                        self.known_hosts_file
                    ),
                )
            })?))
        };
        Ok(Material {
            key: Arc::new(key),
            known,
            stamp,
        })
    }
}

/// The russh client handler: checks the host key against known_hosts.
pub struct Client {
    known: Option<Arc<KnownHosts>>,
    lookup: String,
    verdict: Arc<Mutex<Option<HostKeyVerdict>>>,
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_public_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let Some(known) = &self.known else {
            return Ok(true);
        };
        let verdict = match server_public_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => match key.to_bytes() {
                Ok(blob) => known.verify(&self.lookup, &blob),
                Err(_) => HostKeyVerdict::Unknown,
            },
            PublicKeyOrCertificate::Certificate(_) => HostKeyVerdict::Unknown,
        };
        if let Ok(mut v) = self.verdict.lock() {
            *v = Some(verdict);
        }
        Ok(verdict == HostKeyVerdict::Known)
    }
}

/// An authenticated SSH session to one host.
pub type Session = client::Handle<Client>;

/// Dials `address`, verifies the host key and authenticates as `user`.
pub async fn dial(
    settings: &SshSettings,
    address: &str,
    user: &str,
) -> Result<(Session, Stamp), DialError> {
    let material = settings.load()?;
    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address))
        .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Err(DialError::new(
                Stage::Tcp,
                ErrorClass::Transient,
                format!("ssh dial: {address}: {e}"),
            ))
        }
        Err(_) => {
            return Err(DialError::new(
                Stage::Tcp,
                ErrorClass::Transient,
                format!("ssh dial: {address}: no answer within {CONNECT_TIMEOUT:?}"),
            ))
        }
    };
    let _ = tcp.set_nodelay(true);
    let config = Arc::new(client::Config {
        keepalive_interval: Some(KEEPALIVE),
        keepalive_max: 2,
        inactivity_timeout: None,
        ..Default::default()
    });
    let verdict = Arc::new(Mutex::new(None));
    let lookup = known_hosts_name(address);
    let handler = Client {
        known: material.known.clone(),
        lookup: lookup.clone(),
        verdict: verdict.clone(),
    };
    let handshake = async {
        let mut session = client::connect_stream(config, tcp, handler).await?;
        let auth = session
            .authenticate_publickey(user, PrivateKeyWithHashAlg::new(material.key.clone(), None))
            .await?;
        Ok::<_, russh::Error>((session, auth))
    };
    let host_key_error = || {
        let v = verdict.lock().ok().and_then(|v| *v);
        let why = match v {
            Some(HostKeyVerdict::Unknown) => "is not in kvm.knownHostsFile",
            Some(HostKeyVerdict::Changed) => "does not match kvm.knownHostsFile (changed host key)",
            Some(HostKeyVerdict::Revoked) => "is revoked in kvm.knownHostsFile",
            _ => return None,
        };
        Some(DialError::new(
            Stage::Handshake,
            ssh_refusal_class(SshRefusal::HostKey),
            format!("ssh handshake: host key of {lookup} {why}"),
        ))
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Err(_) => Err(DialError::new(
            Stage::Handshake,
            ErrorClass::Transient,
            format!("ssh handshake: {address}: no answer within {HANDSHAKE_TIMEOUT:?}"),
        )),
        Ok(Err(e)) => Err(host_key_error().unwrap_or_else(|| {
            DialError::new(
                Stage::Handshake,
                ErrorClass::Transient,
                format!("ssh handshake: {address}: {e}"),
            )
        })),
        Ok(Ok((session, auth))) => {
            if auth.success() {
                Ok((session, material.stamp))
            } else {
                Err(DialError::new(
                    Stage::Handshake,
                    ssh_refusal_class(SshRefusal::KeyRejected),
                    format!("ssh handshake: {address}: public key of user {user:?} was rejected"),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha1_rfc2202() {
        let got = hmac_sha1(b"key", b"The quick brown fox jumps over the lazy dog").unwrap();
        let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "de7c9b85b8b78aa6bc8a7a36f70a90701c9db4d9");
    }

    #[test]
    fn known_hosts_matching() {
        let mut key = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20".to_vec();
        key.extend_from_slice(&[7u8; 32]);
        let other = b"other".to_vec();
        let b64 = data_encoding::BASE64.encode(&key);
        let salt = b"0123456789abcdefghij";
        let hashed = format!(
            "|1|{}|{}",
            data_encoding::BASE64.encode(salt),
            data_encoding::BASE64.encode(&hmac_sha1(salt, b"[127.0.0.1]:2222").unwrap())
        );
        let text = format!(
            "# comment\nnas1,10.0.0.1 ssh-ed25519 {b64}\n{hashed} ssh-ed25519 {b64} c\n@cert-authority * ssh-ed25519 {b64}\n"
        );
        let kh = KnownHosts::parse(&text).unwrap();
        assert_eq!(kh.verify("nas1", &key), HostKeyVerdict::Known);
        assert_eq!(kh.verify("10.0.0.1", &key), HostKeyVerdict::Known);
        assert_eq!(kh.verify("[127.0.0.1]:2222", &key), HostKeyVerdict::Known);
        assert_eq!(kh.verify("[127.0.0.1]:2223", &key), HostKeyVerdict::Unknown);
        assert_eq!(kh.verify("nas1", &other), HostKeyVerdict::Changed);
        assert_eq!(kh.verify("nas2", &key), HostKeyVerdict::Unknown);
        let rev = KnownHosts::parse(&format!("@revoked * ssh-ed25519 {b64}\n")).unwrap();
        assert_eq!(rev.verify("x", &key), HostKeyVerdict::Revoked);
        assert!(KnownHosts::parse("justonefield\n").is_err());
        assert!(KnownHosts::parse("h ssh-ed25519 !!!notbase64\n").is_err());
        assert!(KnownHosts::parse("@bogus h ssh-ed25519 AAAA\n").is_err());
        assert_eq!(known_hosts_name("nas1:22"), "nas1");
        assert_eq!(known_hosts_name("127.0.0.1:2222"), "[127.0.0.1]:2222");
        assert_eq!(known_hosts_name("[::1]:22"), "::1");
    }
}
