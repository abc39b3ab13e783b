//! A container's environment and command line, as Kubernetes defines them.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Api;

use super::quantity;

pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Expands `$(VAR)` references from `lookup`; `$$` is a literal `$`; an
/// undefined reference or a lone `$` stays as written.
pub fn expand(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// An ordered environment (later sets replace the value in place).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Env {
    vars: Vec<(String, String)>,
}

impl Env {
    pub fn set(&mut self, name: &str, value: String) {
        match self.vars.iter_mut().find(|(n, _)| n == name) {
            Some(v) => v.1 = value,
            None => self.vars.push((name.to_string(), value)),
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn expand(&self, s: &str) -> String {
        expand(s, &|n| self.get(n).map(str::to_string))
    }

    /// `NAME=value` strings for execve.
    pub fn to_strings(&self) -> Vec<String> {
        self.vars.iter().map(|(n, v)| format!("{n}={v}")).collect()
    }
}

/// What `fieldRef` can read.
pub struct FieldContext<'a> {
    pub pod: &'a Pod,
    pub pod_ip: Option<Ipv4Addr>,
    pub host_ip: Ipv4Addr,
}

/// The value of a downward-API field path (`metadata.name`,
/// `metadata.labels['k']`, `status.podIP`, ...).
pub fn field_value(ctx: &FieldContext<'_>, path: &str) -> Result<String, String> {
    let meta = &ctx.pod.metadata;
    let spec = ctx.pod.spec.as_ref();
    let keyed = |prefix: &str, map: Option<&BTreeMap<String, String>>| -> Option<String> {
        let key = path
            .strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    if let Some(v) = keyed("metadata.labels", meta.labels.as_ref()) {
        return Ok(v);
    }
    if let Some(v) = keyed("metadata.annotations", meta.annotations.as_ref()) {
        return Ok(v);
    }
    let kv = |m: Option<&BTreeMap<String, String>>| {
        m.map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v:?}\n"))
                .collect::<String>()
        })
        .unwrap_or_default()
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => kv(meta.labels.as_ref()),
        "metadata.annotations" => kv(meta.annotations.as_ref()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => ctx.pod_ip.map(|i| i.to_string()).unwrap_or_default(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.to_string(),
        _ => return Err(format!("unsupported fieldRef {path:?}")),
    })
}

/// The node's allocatable resources: what a missing limit reads as. A
/// scheduling figure, not a limit (containers are processes sharing the
/// machine): 8 CPUs hold 160 Squid Pods at 50m, room for every test of a
/// binary running at once (2 CPUs held 40, and the e2e binary's parallel
/// tests left Pods Pending).
pub const NODE_CPU: &str = "8";
pub const NODE_MEMORY: &str = "8Gi";

/// The value of a `resourceFieldRef` (`limits.memory`, `requests.cpu`...).
pub fn resource_value(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
) -> Result<String, String> {
    let res = container.resources.as_ref();
    let get = |which: &str, name: &str| {
        let m = match which {
            "limits" => res.and_then(|r| r.limits.as_ref()),
            _ => res.and_then(|r| r.requests.as_ref()),
        };
        m.and_then(|m| m.get(name)).map(|q| q.0.clone())
    };
    let (which, name) = resource
        .split_once('.')
        .ok_or_else(|| format!("unsupported resource {resource:?}"))?;
    let node_default = match name {
        "cpu" => NODE_CPU,
        "memory" => NODE_MEMORY,
        "ephemeral-storage" => "100Gi",
        _ => return Err(format!("unsupported resource {resource:?}")),
    };
    let value = match which {
        "limits" => get("limits", name).unwrap_or_else(|| node_default.to_string()),
        "requests" => get("requests", name)
            .or_else(|| get("limits", name))
            .unwrap_or_else(|| "0".to_string()),
        _ => return Err(format!("unsupported resource {resource:?}")),
    };
    quantity::divided(&value, divisor).map_err(|e| e.to_string())
}

/// Why an environment could not be built: the container stays Waiting with
/// reason `CreateContainerConfigError` and this message.
pub type ConfigError = String;

/// Reads Secrets and ConfigMaps in the Pod's namespace.
pub struct Sources<'a> {
    pub client: &'a kube::Client,
    pub namespace: &'a str,
}

impl Sources<'_> {
    async fn secret(&self, name: &str) -> Result<Option<Secret>, ConfigError> {
        Api::<Secret>::namespaced(self.client.clone(), self.namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("reading secret {name:?}: {e}"))
    }

    async fn config_map(&self, name: &str) -> Result<Option<ConfigMap>, ConfigError> {
        Api::<ConfigMap>::namespaced(self.client.clone(), self.namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("reading configmap {name:?}: {e}"))
    }
}

fn secret_data(s: &Secret) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = s
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    for (k, v) in s.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone());
    }
    out
}

fn config_map_data(c: &ConfigMap) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = c.data.clone().unwrap_or_default();
    for (k, v) in c.binary_data.iter().flatten() {
        out.insert(k.clone(), String::from_utf8_lossy(&v.0).into_owned());
    }
    out
}

/// Where the Pod reaches the API server, for the `KUBERNETES_*` variables.
pub struct ServiceEnv {
    pub api_host: Ipv4Addr,
    pub api_port: u16,
}

/// The service variables every container gets.
pub fn service_env(s: &ServiceEnv) -> Env {
    let mut env = Env::default();
    let (h, p) = (s.api_host, s.api_port);
    env.set("KUBERNETES_SERVICE_HOST", h.to_string());
    env.set("KUBERNETES_SERVICE_PORT", p.to_string());
    env.set("KUBERNETES_SERVICE_PORT_HTTPS", p.to_string());
    env.set("KUBERNETES_PORT", format!("tcp://{h}:{p}"));
    env.set(
        &format!("KUBERNETES_PORT_{p}_TCP"),
        format!("tcp://{h}:{p}"),
    );
    env.set(&format!("KUBERNETES_PORT_{p}_TCP_PROTO"), "tcp".into());
    env.set(&format!("KUBERNETES_PORT_{p}_TCP_PORT"), p.to_string());
    env.set(&format!("KUBERNETES_PORT_{p}_TCP_ADDR"), h.to_string());
    env
}

/// The container's environment: `envFrom`, then `env` (with `$(VAR)`
/// expansion of what is defined so far), then the service variables,
/// HOSTNAME, PATH and HOME where not set.
pub async fn build(
    sources: &Sources<'_>,
    fields: &FieldContext<'_>,
    container: &Container,
    service: &ServiceEnv,
    home: &str,
) -> Result<Env, ConfigError> {
    let mut env = Env::default();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(s) = &from.secret_ref {
            match sources.secret(&s.name).await? {
                Some(secret) => secret_data(&secret),
                None if s.optional == Some(true) => BTreeMap::new(),
                None => return Err(format!("secret \"{}\" not found", s.name)),
            }
        } else if let Some(c) = &from.config_map_ref {
            match sources.config_map(&c.name).await? {
                Some(cm) => config_map_data(&cm),
                None if c.optional == Some(true) => BTreeMap::new(),
                None => return Err(format!("configmap \"{}\" not found", c.name)),
            }
        } else {
            BTreeMap::new()
        };
        for (k, v) in data {
            env.set(&format!("{prefix}{k}"), v);
        }
    }
    let services = service_env(service);
    for var in container.env.iter().flatten() {
        let value = if let Some(v) = &var.value {
            let lookup = |n: &str| env.get(n).or_else(|| services.get(n)).map(str::to_string);
            expand(v, &lookup)
        } else if let Some(from) = &var.value_from {
            if let Some(f) = &from.field_ref {
                field_value(fields, &f.field_path)?
            } else if let Some(r) = &from.resource_field_ref {
                resource_value(
                    container,
                    &r.resource,
                    r.divisor.as_ref().map(|d| d.0.as_str()),
                )?
            } else if let Some(s) = &from.secret_key_ref {
                let optional = s.optional == Some(true);
                match sources.secret(&s.name).await? {
                    Some(secret) => match secret_data(&secret).remove(&s.key) {
                        Some(v) => v,
                        None if optional => continue,
                        None => {
                            return Err(format!(
                                "couldn't find key {} in Secret {}/{}",
                                s.key, sources.namespace, s.name
                            ))
                        }
                    },
                    None if optional => continue,
                    None => return Err(format!("secret \"{}\" not found", s.name)),
                }
            } else if let Some(c) = &from.config_map_key_ref {
                let optional = c.optional == Some(true);
                match sources.config_map(&c.name).await? {
                    Some(cm) => match config_map_data(&cm).remove(&c.key) {
                        Some(v) => v,
                        None if optional => continue,
                        None => {
                            return Err(format!(
                                "couldn't find key {} in ConfigMap {}/{}",
                                c.key, sources.namespace, c.name
                            ))
                        }
                    },
                    None if optional => continue,
                    None => return Err(format!("configmap \"{}\" not found", c.name)),
                }
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        env.set(&var.name, value);
    }
    finish(&mut env, &services, fields, home);
    Ok(env)
}

/// Adds the service variables, HOSTNAME, PATH and HOME where not set.
fn finish(env: &mut Env, services: &Env, fields: &FieldContext<'_>, home: &str) {
    for (n, v) in &services.vars {
        if env.get(n).is_none() {
            env.set(n, v.clone());
        }
    }
    if env.get("HOSTNAME").is_none() {
        let name = fields.pod.metadata.name.clone().unwrap_or_default();
        env.set("HOSTNAME", name);
    }
    if env.get("PATH").is_none() {
        env.set("PATH", DEFAULT_PATH.to_string());
    }
    if env.get("HOME").is_none() {
        env.set("HOME", home.to_string());
    }
}

/// The argv of a container: `command` and `args` expanded, or the image's
/// entrypoint followed by `args` when there is no `command`.
pub fn command_line(
    container: &Container,
    entrypoint: Option<&[String]>,
    env: &Env,
) -> Result<Vec<String>, String> {
    let args = container.args.iter().flatten().map(|a| env.expand(a));
    let argv: Vec<String> = match &container.command {
        Some(cmd) if !cmd.is_empty() => cmd.iter().map(|c| env.expand(c)).chain(args).collect(),
        _ => match entrypoint {
            Some(ep) => ep.iter().cloned().chain(args).collect(),
            None => args.collect(),
        },
    };
    if argv.is_empty() {
        return Err("no command specified".to_string());
    }
    Ok(argv)
}

/// The home directory of `uid` in an /etc/passwd text, else `/`.
pub fn home_of(passwd: &str, uid: u32) -> String {
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 6 && f[2].parse() == Ok(uid)).then(|| f[5].to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "/".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::api::ObjectMeta;

    #[test]
    fn expands_like_kubernetes() {
        let vars: BTreeMap<&str, &str> = [("A", "a"), ("B", "b"), ("EMPTY", "")].into();
        let lookup = |n: &str| vars.get(n).map(|v| v.to_string());
        let cases = [
            ("plain", "plain"),
            ("$(A)", "a"),
            ("x$(A)y$(B)z", "xaybz"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$a"),
            ("$(MISSING)", "$(MISSING)"),
            ("$(EMPTY)-", "-"),
            ("$A", "$A"),
            ("a$", "a$"),
            ("$(A", "$(A"),
            ("$$", "$"),
            ("$()", "$()"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &lookup), want, "{input}");
        }
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u-1".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                service_account_name: Some("sa".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn field_values() {
        let p = pod();
        let ctx = FieldContext {
            pod: &p,
            pod_ip: Some(Ipv4Addr::new(10, 216, 0, 5)),
            host_ip: Ipv4Addr::new(10, 216, 0, 1),
        };
        let cases = [
            ("metadata.name", "p"),
            ("metadata.namespace", "ns"),
            ("metadata.uid", "u-1"),
            ("metadata.labels['app']", "web"),
            ("metadata.labels['none']", ""),
            ("metadata.annotations['x']", ""),
            ("spec.nodeName", "n1"),
            ("spec.serviceAccountName", "sa"),
            ("status.podIP", "10.216.0.5"),
            ("status.hostIP", "10.216.0.1"),
            ("metadata.labels", "app=\"web\"\n"),
        ];
        for (path, want) in cases {
            assert_eq!(field_value(&ctx, path).unwrap(), want, "{path}");
        }
        assert!(field_value(&ctx, "spec.bogus").is_err());
    }

    #[test]
    fn resource_values() {
        let c = Container {
            resources: Some(ResourceRequirements {
                limits: Some([("memory".to_string(), Quantity("64Mi".into()))].into()),
                requests: Some([("cpu".to_string(), Quantity("250m".into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let cases = [
            ("limits.memory", None, "67108864"),
            ("limits.memory", Some("1Mi"), "64"),
            ("limits.cpu", None, "8"),
            ("requests.cpu", None, "1"),
            ("requests.cpu", Some("1m"), "250"),
            ("requests.memory", None, "67108864"),
        ];
        for (res, div, want) in cases {
            assert_eq!(resource_value(&c, res, div).unwrap(), want, "{res}");
        }
    }

    #[test]
    fn command_lines() {
        let mut env = Env::default();
        env.set("X", "1".into());
        let c = |cmd: Option<&[&str]>, args: Option<&[&str]>| Container {
            command: cmd.map(|v| v.iter().map(|s| s.to_string()).collect()),
            args: args.map(|v| v.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        };
        let ep = vec!["/ep".to_string(), "-f".to_string()];
        let cases: Vec<(Container, Vec<&str>)> = vec![
            (c(Some(&["sh", "-c", "$(X)"]), None), vec!["sh", "-c", "1"]),
            (
                c(Some(&["a"]), Some(&["$(X)", "$$(X)"])),
                vec!["a", "1", "$(X)"],
            ),
            (c(None, None), vec!["/ep", "-f"]),
            (c(None, Some(&["--x=$(X)"])), vec!["/ep", "-f", "--x=1"]),
        ];
        for (container, want) in cases {
            assert_eq!(command_line(&container, Some(&ep), &env).unwrap(), want);
        }
        assert!(command_line(&c(None, None), None, &env).is_err());
    }

    #[test]
    fn homes() {
        let passwd =
            "root:x:0:0:root:/root:/bin/bash\nproxy:x:13:13:proxy:/bin:/usr/sbin/nologin\n";
        assert_eq!(home_of(passwd, 0), "/root");
        assert_eq!(home_of(passwd, 13), "/bin");
        assert_eq!(home_of(passwd, 65532), "/");
    }

    #[test]
    fn env_set_replaces_in_place() {
        let mut e = Env::default();
        e.set("A", "1".into());
        e.set("B", "2".into());
        e.set("A", "3".into());
        assert_eq!(e.to_strings(), vec!["A=3", "B=2"]);
    }
}
