//! The user-data an instance is created with: the Proxy's own cloud-init
//! with its placeholders filled in, or the operator's built-in setup
//! (`cloudInit.builtin: squid`). Rendered at each create, so the password
//! is written only where the instance reads it; the spec hash covers the
//! template (or, for the built-in setup, its name and version), never the
//! rendered text.

use crate::api::{Builtin, CloudInit};
use crate::config::DestinationRules;
use crate::credentials::Credentials;
use crate::provider::kubernetes::vm_squid_conf;

/// What the spec hash covers for `builtin: squid`: a new version of the
/// setup replaces the instances built from the old one.
pub const BUILTIN_SQUID: &str = "#egress-proxies-operator builtin squid v1\n";

/// Where the built-in setup writes the credentials file.
pub const HTPASSWD_PATH: &str = "/etc/squid/egress-proxy.htpasswd";

/// The placeholders of a Proxy's own cloud-init, each replaced at create
/// (with and without the spaces inside the braces).
pub const PLACEHOLDERS: [&str; 4] = [
    "proxy.port",
    "proxy.username",
    "proxy.password",
    "proxy.htpasswd",
];

/// What a create fills in.
#[derive(Clone, Copy, Debug)]
pub struct Fill<'a> {
    /// The port the instance serves on.
    pub port: u16,
    /// Its credentials; `None`: it takes none.
    pub credentials: Option<&'a Credentials>,
    /// Its `user:hash` line (with its own salt), when it takes credentials.
    pub htpasswd: Option<&'a str>,
    /// The provider's destination rules.
    pub destinations: &'a DestinationRules,
}

/// Whether the user-data of `spec` (resolved to `resolved`) holds the
/// credentials' `user:hash` line: the built-in setup does, and so does a
/// Proxy's own text that names `proxy.htpasswd`.
pub fn wants_htpasswd(spec: Option<&CloudInit>, resolved: &str) -> bool {
    spec.and_then(|c| c.builtin).is_some() || resolved.contains(PLACEHOLDERS[3])
}

/// The user-data of a create: the built-in setup when `spec` asks for it,
/// else `resolved` (the Proxy's own text) with its placeholders filled in.
pub fn render(spec: Option<&CloudInit>, resolved: &str, fill: &Fill<'_>) -> String {
    match spec.and_then(|c| c.builtin) {
        Some(Builtin::Squid) => builtin_squid(fill),
        None => placeholders(resolved, fill),
    }
}

/// `{{ proxy.port }}`, `{{ proxy.username }}`, `{{ proxy.password }}` and
/// `{{ proxy.htpasswd }}` (the `user:hash` line, no newline) filled in;
/// empty for a Proxy that takes no credentials.
fn placeholders(text: &str, fill: &Fill<'_>) -> String {
    if !text.contains("{{") {
        return text.to_string();
    }
    let values = [
        fill.port.to_string(),
        fill.credentials
            .map(|c| c.username.clone())
            .unwrap_or_default(),
        fill.credentials
            .map(|c| c.expose().to_string())
            .unwrap_or_default(),
        fill.htpasswd.unwrap_or_default().trim_end().to_string(),
    ];
    let mut out = text.to_string();
    for (name, value) in PLACEHOLDERS.iter().zip(values) {
        for form in [format!("{{{{ {name} }}}}"), format!("{{{{{name}}}}}")] {
            out = out.replace(&form, &value);
        }
    }
    out
}

/// A cloud-config that installs Squid from the image's packages and gives
/// it [`vm_squid_conf`] (and the credentials file, readable by Squid's
/// group only), written after the package is installed (`defer`), then
/// restarts it.
fn builtin_squid(fill: &Fill<'_>) -> String {
    let htpasswd = fill.htpasswd.map(|_| HTPASSWD_PATH);
    let conf = vm_squid_conf(fill.port, fill.destinations, htpasswd);
    let mut out = String::from(
        "#cloud-config\n# Written by egress-proxies-operator (cloudInit.builtin: squid).\npackages: [squid]\nwrite_files:\n  - path: /etc/squid/squid.conf\n    permissions: '0644'\n    defer: true\n    content: |\n",
    );
    out.push_str(&indent(&conf));
    if let Some(line) = fill.htpasswd {
        out.push_str(&format!(
            "  - path: {HTPASSWD_PATH}\n    owner: root:proxy\n    permissions: '0640'\n    defer: true\n    content: |\n"
        ));
        out.push_str(&indent(line));
    }
    out.push_str("runcmd:\n  - [systemctl, restart, squid]\n");
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("      {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> DestinationRules {
        crate::config::Destinations::default().rules().unwrap()
    }

    fn builtin() -> CloudInit {
        CloudInit {
            builtin: Some(Builtin::Squid),
            ..Default::default()
        }
    }

    #[test]
    fn the_builtin_setup_installs_squid_with_credentials_and_destination_rules() {
        let creds = Credentials::new("proxy-a", "pw");
        let line = "proxy-a:$6$salt$hash\n";
        let rules = rules();
        let fill = Fill {
            port: 8080,
            credentials: Some(&creds),
            htpasswd: Some(line),
            destinations: &rules,
        };
        let text = render(Some(&builtin()), BUILTIN_SQUID, &fill);
        let doc: serde_json::Value = serde_norway::from_str(&text).unwrap();
        assert_eq!(doc["packages"][0], "squid");
        let files = doc["write_files"].as_array().unwrap();
        let conf = files[0]["content"].as_str().unwrap();
        assert_eq!(files[0]["path"], "/etc/squid/squid.conf");
        assert!(conf.lines().any(|l| l == "http_port 8080"), "{conf}");
        assert!(conf.contains(&format!("basic_ncsa_auth {HTPASSWD_PATH}")));
        assert!(conf.contains("acl clients src all\n"));
        assert!(
            conf.contains("acl denied_dst dst 169.254.0.0/16"),
            "the metadata server is refused"
        );
        assert!(conf.contains("forwarded_for delete") && conf.contains("via off"));
        assert!(conf.contains("access_log none"));
        assert!(!conf.contains("http_access allow all"));
        assert_eq!(files[1]["path"], HTPASSWD_PATH);
        assert_eq!(files[1]["content"], "proxy-a:$6$salt$hash\n");
        assert!(!text.contains("pw\n"), "the password itself is not written");
        assert_eq!(doc["runcmd"][0][2], "squid");
    }

    #[test]
    fn without_credentials_the_builtin_setup_admits_private_ranges_only() {
        let rules = rules();
        let fill = Fill {
            port: 3128,
            credentials: None,
            htpasswd: None,
            destinations: &rules,
        };
        let text = render(Some(&builtin()), BUILTIN_SQUID, &fill);
        assert!(!text.contains("auth_param"), "{text}");
        assert!(!text.contains("src all"), "{text}");
        assert!(!text.contains(HTPASSWD_PATH), "{text}");
    }

    #[test]
    fn placeholders_are_filled_in_the_proxys_own_cloud_init() {
        let creds = Credentials::new("proxy-a", "s3cret");
        let rules = rules();
        let fill = Fill {
            port: 3129,
            credentials: Some(&creds),
            htpasswd: Some("proxy-a:$6$x$y\n"),
            destinations: &rules,
        };
        let text = "port {{ proxy.port }} user {{proxy.username}} pass {{ proxy.password }} line {{ proxy.htpasswd }}.";
        let inline = CloudInit {
            inline: Some(text.into()),
            ..Default::default()
        };
        assert_eq!(
            render(Some(&inline), text, &fill),
            "port 3129 user proxy-a pass s3cret line proxy-a:$6$x$y."
        );
        let open = Fill {
            credentials: None,
            htpasswd: None,
            ..fill
        };
        assert_eq!(
            render(Some(&inline), text, &open),
            "port 3129 user  pass  line ."
        );
        assert_eq!(render(None, "", &fill), "");
    }
}
