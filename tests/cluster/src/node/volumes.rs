//! Pod volumes, materialized on the host under
//! `<dir>/pods/<uid>/volumes/<name>`.
//!
//! ConfigMap, Secret, projected and downward-API volumes are written the
//! way kubelet's atomic writer does: the files live in a timestamped
//! directory, `..data` links to it, and each top-level entry links into
//! `..data`, so a refresh swaps all files at once.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccount, Volume,
};
use kube::api::PostParams;
use kube::Api;

use super::env::{field_value, resource_value, FieldContext};

/// File contents and modes of a volume, by relative path.
pub type Payload = BTreeMap<String, (Vec<u8>, u32)>;

const DEFAULT_MODE: u32 = 0o644;

/// Where the volumes of one Pod live and who owns their files.
pub struct PodVolumes {
    pub dir: PathBuf,
    /// The owner of the files (the containers' runAsUser when they all agree).
    pub uid: u32,
    /// The group of the files (fsGroup).
    pub gid: Option<u32>,
    tokens: Mutex<HashMap<String, (String, Instant, Duration)>>,
}

/// Why a volume cannot be set up (the Pod stays in ContainerCreating).
pub type MountError = String;

impl PodVolumes {
    pub fn new(dir: PathBuf, uid: u32, gid: Option<u32>) -> PodVolumes {
        PodVolumes {
            dir,
            uid,
            gid,
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// The host path of a volume (a hostPath volume's own path).
    pub fn host_path(&self, volume: &Volume) -> PathBuf {
        match &volume.host_path {
            Some(h) => PathBuf::from(&h.path),
            None => self.dir.join(&volume.name),
        }
    }

    /// Creates or refreshes every volume of the Pod.
    pub async fn sync(
        &self,
        client: &kube::Client,
        pod: &Pod,
        fields: &FieldContext<'_>,
    ) -> Result<(), MountError> {
        let spec = pod.spec.as_ref();
        for volume in spec.and_then(|s| s.volumes.as_ref()).into_iter().flatten() {
            self.sync_one(client, pod, fields, volume)
                .await
                .map_err(|e| {
                    format!(
                        "MountVolume.SetUp failed for volume \"{}\": {e}",
                        volume.name
                    )
                })?;
        }
        Ok(())
    }

    async fn sync_one(
        &self,
        client: &kube::Client,
        pod: &Pod,
        fields: &FieldContext<'_>,
        v: &Volume,
    ) -> Result<(), String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let dir = self.dir.join(&v.name);
        if v.empty_dir.is_some() {
            if !dir.exists() {
                fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o777))
                    .map_err(|e| e.to_string())?;
                self.chown(&dir)?;
            }
            return Ok(());
        }
        if let Some(h) = &v.host_path {
            let p = Path::new(&h.path);
            match h.type_.as_deref() {
                Some("DirectoryOrCreate") => fs::create_dir_all(p).map_err(|e| e.to_string())?,
                Some("FileOrCreate") if !p.exists() => {
                    fs::write(p, b"").map_err(|e| e.to_string())?
                }
                _ if !p.exists() => return Err(format!("hostPath {} does not exist", h.path)),
                _ => {}
            }
            return Ok(());
        }
        let payload = if let Some(c) = &v.config_map {
            let data = config_map(client, ns, &c.name).await?;
            let mode = c.default_mode.map_or(DEFAULT_MODE, |m| m as u32);
            match data {
                Some(d) => project(&d, c.items.as_deref(), mode, &c.name, "configmap")?,
                None if c.optional == Some(true) => Payload::new(),
                None => return Err(format!("configmap \"{}\" not found", c.name)),
            }
        } else if let Some(s) = &v.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            let data = secret(client, ns, &name).await?;
            let mode = s.default_mode.map_or(DEFAULT_MODE, |m| m as u32);
            match data {
                Some(d) => project(&d, s.items.as_deref(), mode, &name, "secret")?,
                None if s.optional == Some(true) => Payload::new(),
                None => return Err(format!("secret \"{name}\" not found")),
            }
        } else if let Some(d) = &v.downward_api {
            let mode = d.default_mode.map_or(DEFAULT_MODE, |m| m as u32);
            downward(pod, fields, d.items.as_deref().unwrap_or_default(), mode)?
        } else if let Some(p) = &v.projected {
            let mode = p.default_mode.map_or(DEFAULT_MODE, |m| m as u32);
            let mut out = Payload::new();
            for src in p.sources.iter().flatten() {
                if let Some(t) = &src.service_account_token {
                    let token = self
                        .token(client, pod, t.audience.as_deref(), t.expiration_seconds)
                        .await?;
                    out.insert(t.path.clone(), (token.into_bytes(), mode));
                }
                if let Some(c) = &src.config_map {
                    let name = c.name.clone();
                    match config_map(client, ns, &name).await? {
                        Some(d) => {
                            out.extend(project(&d, c.items.as_deref(), mode, &name, "configmap")?)
                        }
                        None if c.optional == Some(true) => {}
                        None => return Err(format!("configmap \"{name}\" not found")),
                    }
                }
                if let Some(s) = &src.secret {
                    let name = s.name.clone();
                    match secret(client, ns, &name).await? {
                        Some(d) => {
                            out.extend(project(&d, s.items.as_deref(), mode, &name, "secret")?)
                        }
                        None if s.optional == Some(true) => {}
                        None => return Err(format!("secret \"{name}\" not found")),
                    }
                }
                if let Some(d) = &src.downward_api {
                    out.extend(downward(
                        pod,
                        fields,
                        d.items.as_deref().unwrap_or_default(),
                        mode,
                    )?);
                }
                if src.cluster_trust_bundle.is_some() {
                    return Err("clusterTrustBundle projections are not supported".into());
                }
            }
            out
        } else {
            return Err("this volume type is not supported by the test node agent".into());
        };
        write_atomic(&dir, &payload, self.uid, self.gid).map_err(|e| e.to_string())
    }

    fn chown(&self, p: &Path) -> Result<(), String> {
        std::os::unix::fs::chown(p, Some(self.uid), self.gid).map_err(|e| e.to_string())
    }

    /// A bound service account token, reused until 80% of its lifetime.
    async fn token(
        &self,
        client: &kube::Client,
        pod: &Pod,
        audience: Option<&str>,
        expiration: Option<i64>,
    ) -> Result<String, String> {
        let key = format!("{audience:?}/{expiration:?}");
        if let Some((token, at, life)) = self.lock_tokens().get(&key) {
            if at.elapsed() < life.mul_f64(0.8) {
                return Ok(token.clone());
            }
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audience.map(|a| vec![a.to_string()]).unwrap_or_default(),
                expiration_seconds: Some(expiration.unwrap_or(3600)),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let resp = Api::<ServiceAccount>::namespaced(client.clone(), ns)
            .create_token_request(&sa, &PostParams::default(), &req)
            .await
            .map_err(|e| format!("requesting a token for service account \"{sa}\": {e}"))?;
        let token = resp.status.map(|s| s.token).unwrap_or_default();
        let life = Duration::from_secs(expiration.unwrap_or(3600).max(60) as u64);
        self.lock_tokens()
            .insert(key, (token.clone(), Instant::now(), life));
        Ok(token)
    }

    fn lock_tokens(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant, Duration)>> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn config_map(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    let cm: Option<ConfigMap> = Api::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| format!("reading configmap \"{name}\": {e}"))?;
    Ok(cm.map(|cm| {
        let mut out: BTreeMap<String, Vec<u8>> = cm
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        out.extend(
            cm.binary_data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0)),
        );
        out
    }))
}

async fn secret(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    let s: Option<Secret> = Api::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| format!("reading secret \"{name}\": {e}"))?;
    Ok(s.map(|s| {
        let mut out: BTreeMap<String, Vec<u8>> = s
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        out.extend(
            s.string_data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes())),
        );
        out
    }))
}

/// The files of a ConfigMap or Secret: every key, or the listed `items`.
pub fn project(
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    mode: u32,
    name: &str,
    kind: &str,
) -> Result<Payload, String> {
    let mut out = Payload::new();
    match items {
        None => {
            for (k, v) in data {
                out.insert(k.clone(), (v.clone(), mode));
            }
        }
        Some(items) => {
            for item in items {
                let v = data.get(&item.key).ok_or_else(|| {
                    format!(
                        "configuration key \"{}\" not found in {kind} \"{name}\"",
                        item.key
                    )
                })?;
                let m = item.mode.map_or(mode, |m| m as u32);
                out.insert(item.path.clone(), (v.clone(), m));
            }
        }
    }
    Ok(out)
}

fn downward(
    pod: &Pod,
    fields: &FieldContext<'_>,
    items: &[DownwardAPIVolumeFile],
    mode: u32,
) -> Result<Payload, String> {
    let mut out = Payload::new();
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            field_value(fields, &f.field_path)?
        } else if let Some(r) = &item.resource_field_ref {
            let wanted = r.container_name.as_deref().unwrap_or_default();
            let container = pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .find(|c| c.name == wanted)
                .ok_or_else(|| format!("no container \"{wanted}\" for resourceFieldRef"))?;
            resource_value(
                container,
                &r.resource,
                r.divisor.as_ref().map(|d| d.0.as_str()),
            )?
        } else {
            String::new()
        };
        let m = item.mode.map_or(mode, |m| m as u32);
        out.insert(item.path.clone(), (value.into_bytes(), m));
    }
    Ok(out)
}

/// A path inside a volume must stay inside it.
fn safe_relative(p: &str) -> bool {
    !p.is_empty() && !p.starts_with('/') && !p.split('/').any(|c| c == ".." || c.starts_with(".."))
}

/// The top-level names of a payload (`a/b` → `a`).
fn top_level(payload: &Payload) -> std::collections::BTreeSet<String> {
    payload
        .keys()
        .filter_map(|k| k.split('/').next().map(str::to_string))
        .collect()
}

/// The current payload of an atomic-writer directory.
fn read_current(dir: &Path) -> Option<Payload> {
    let data = dir.join("..data");
    fs::symlink_metadata(&data).ok()?;
    let mut out = Payload::new();
    fn walk(base: &Path, rel: &str, out: &mut Payload) -> std::io::Result<()> {
        for e in fs::read_dir(base.join(rel))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let md = e.metadata()?;
            if md.is_dir() {
                walk(base, &r, out)?;
            } else {
                let mode = md.permissions().mode() & 0o7777;
                out.insert(r.clone(), (fs::read(base.join(&r))?, mode));
            }
        }
        Ok(())
    }
    walk(&data, "", &mut out).ok()?;
    Some(out)
}

/// Writes `payload` into `dir` atomically; does nothing when unchanged.
pub fn write_atomic(
    dir: &Path,
    payload: &Payload,
    uid: u32,
    gid: Option<u32>,
) -> std::io::Result<()> {
    let current = read_current(dir);
    if current.as_ref() == Some(payload) {
        return Ok(());
    }
    fs::create_dir_all(dir)?;
    std::os::unix::fs::chown(dir, Some(uid), gid)?;
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    );
    let ts_dir = dir.join(&stamp);
    fs::create_dir(&ts_dir)?;
    for (rel, (content, mode)) in payload {
        if !safe_relative(rel) {
            return Err(std::io::Error::other(format!("invalid path {rel:?}")));
        }
        let p = ts_dir.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&p, content)?;
        let mode = if gid.is_some() { mode | 0o040 } else { *mode };
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
        std::os::unix::fs::chown(&p, Some(uid), gid)?;
    }
    let old_target = fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    let _ = fs::remove_file(&tmp);
    symlink(&stamp, &tmp)?;
    fs::rename(&tmp, dir.join("..data"))?;
    let new_top = top_level(payload);
    for name in &new_top {
        let link = dir.join(name);
        if fs::symlink_metadata(&link).is_err() {
            symlink(format!("..data/{name}"), &link)?;
        }
    }
    if let Some(old) = current {
        for name in top_level(&old).difference(&new_top) {
            let link = dir.join(name);
            if fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
                fs::remove_file(&link)?;
            }
        }
    }
    if let Some(old) = old_target {
        let _ = fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(entries: &[(&str, &str, u32)]) -> Payload {
        entries
            .iter()
            .map(|(k, v, m)| (k.to_string(), (v.as_bytes().to_vec(), *m)))
            .collect()
    }

    #[test]
    fn projects_keys_and_items() {
        let data: BTreeMap<String, Vec<u8>> = [
            ("a".to_string(), b"1".to_vec()),
            ("b".to_string(), b"2".to_vec()),
        ]
        .into();
        assert_eq!(
            project(&data, None, 0o644, "cm", "configmap").unwrap(),
            payload(&[("a", "1", 0o644), ("b", "2", 0o644)])
        );
        let items = vec![KeyToPath {
            key: "b".into(),
            path: "dir/b.txt".into(),
            mode: Some(0o600),
        }];
        assert_eq!(
            project(&data, Some(&items), 0o644, "cm", "configmap").unwrap(),
            payload(&[("dir/b.txt", "2", 0o600)])
        );
        let missing = vec![KeyToPath {
            key: "zz".into(),
            path: "z".into(),
            mode: None,
        }];
        assert!(project(&data, Some(&missing), 0o644, "cm", "configmap").is_err());
    }

    #[test]
    fn atomic_writes_and_updates() {
        let dir = std::env::temp_dir().join(format!("tc-vol-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let uid = nix::unistd::getuid().as_raw();
        write_atomic(
            &dir,
            &payload(&[("a", "1", 0o644), ("d/x", "x", 0o600)]),
            uid,
            None,
        )
        .unwrap();
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(fs::read_to_string(dir.join("d/x")).unwrap(), "x");
        // A mount point made by a container next to the files survives.
        fs::create_dir(dir.join("nested")).unwrap();
        write_atomic(&dir, &payload(&[("a", "2", 0o644)]), uid, None).unwrap();
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "2");
        assert!(fs::symlink_metadata(dir.join("d")).is_err());
        assert!(dir.join("nested").is_dir());
        let stamps = fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name();
                let n = n.to_string_lossy();
                n.starts_with("..") && n != "..data"
            })
            .count();
        assert_eq!(stamps, 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_escaping_paths() {
        for p in ["../x", "/etc/x", "a/../../x", "", "..data"] {
            assert!(!safe_relative(p), "{p}");
        }
        assert!(safe_relative("a/b.txt"));
    }
}
