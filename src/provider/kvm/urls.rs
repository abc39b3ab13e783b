//! Which image URLs may be fetched (issue 17): a direct URL in
//! `placement.image` must fall under a prefix of `kvm.allowedImageUrls`
//! (empty: none may), and a redirect never changes scheme nor leaves the
//! allowlist when it started inside it.

use url::Url;

/// Whether `url` falls under one of the `allow` prefixes: same scheme,
/// host and port, and a path starting with the prefix's path.
pub fn allowed(allow: &[String], url: &str) -> bool {
    let Ok(u) = Url::parse(url) else {
        return false;
    };
    allow.iter().any(|p| match Url::parse(p) {
        Ok(p) => {
            p.scheme() == u.scheme()
                && p.host_str() == u.host_str()
                && p.port_or_known_default() == u.port_or_known_default()
                && u.path().starts_with(p.path())
        }
        Err(_) => false,
    })
}

/// Whether a redirect from `original` (the URL first asked for) to
/// `target` may be followed; the error says why not.
pub fn redirect(allow: &[String], original: &Url, target: &Url) -> Result<(), String> {
    if target.scheme() != original.scheme() {
        return Err(format!(
            "redirected from {} to another scheme ({})",
            original.scheme(),
            target.scheme()
        ));
    }
    if allowed(allow, original.as_str()) && !allowed(allow, target.as_str()) {
        return Err(format!(
            "redirected to {target}, outside kvm.allowedImageUrls"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Case {
        name: &'static str,
        url: &'static str,
        want: bool,
    }

    #[test]
    fn allowlist_table() {
        let allow = vec!["https://images.example.com/cloud/".to_string()];
        for c in [
            Case {
                name: "under the prefix",
                url: "https://images.example.com/cloud/deb.qcow2",
                want: true,
            },
            Case {
                name: "explicit default port",
                url: "https://images.example.com:443/cloud/deb.qcow2",
                want: true,
            },
            Case {
                name: "other path",
                url: "https://images.example.com/other/deb.qcow2",
                want: false,
            },
            Case {
                name: "other scheme",
                url: "http://images.example.com/cloud/deb.qcow2",
                want: false,
            },
            Case {
                name: "host that only starts like the prefix's",
                url: "https://images.example.com.evil.org/cloud/deb.qcow2",
                want: false,
            },
            Case {
                name: "other port",
                url: "https://images.example.com:8443/cloud/deb.qcow2",
                want: false,
            },
        ] {
            assert_eq!(allowed(&allow, c.url), c.want, "{}", c.name);
        }
        assert!(
            !allowed(&[], "https://images.example.com/cloud/deb.qcow2"),
            "empty allowlist refuses every URL"
        );
    }

    struct Hop {
        name: &'static str,
        from: &'static str,
        to: &'static str,
        want: Result<(), &'static str>,
    }

    #[test]
    fn redirect_table() {
        let allow = vec!["https://a.example/img/".to_string()];
        for c in [
            Hop {
                name: "catalogue URL, same scheme, elsewhere",
                from: "https://cat.example/x",
                to: "https://cdn.example/x",
                want: Ok(()),
            },
            Hop {
                name: "downgrade to http",
                from: "https://cat.example/x",
                to: "http://cat.example/x",
                want: Err("redirected from https to another scheme (http)"),
            },
            Hop {
                name: "upgrade to https is another scheme too",
                from: "http://cat.example/x",
                to: "https://cat.example/x",
                want: Err("redirected from http to another scheme (https)"),
            },
            Hop {
                name: "allowed URL stays inside",
                from: "https://a.example/img/x",
                to: "https://a.example/img/y",
                want: Ok(()),
            },
            Hop {
                name: "allowed URL leaves the allowlist",
                from: "https://a.example/img/x",
                to: "https://b.example/x",
                want: Err("redirected to https://b.example/x, outside kvm.allowedImageUrls"),
            },
        ] {
            let (from, to) = (Url::parse(c.from).unwrap(), Url::parse(c.to).unwrap());
            assert_eq!(
                redirect(&allow, &from, &to),
                c.want.map_err(String::from),
                "{}",
                c.name
            );
        }
    }
}
