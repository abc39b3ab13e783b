//! Image references: which host program an image maps to.

use super::ImageMapping;

/// The repository of an image reference, normalized the way Docker does:
/// no `:tag`, no `@digest`, `docker.io/library/` for bare names.
pub fn repository(image: &str) -> String {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last_slash = no_digest.rfind('/').map_or(0, |i| i + 1);
    let repo = match no_digest[last_slash..].find(':') {
        Some(colon) => &no_digest[..last_slash + colon],
        None => no_digest,
    };
    let first = repo.split('/').next().unwrap_or(repo);
    let has_registry =
        repo.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_registry {
        repo.to_string()
    } else if repo.contains('/') {
        format!("docker.io/{repo}")
    } else {
        format!("docker.io/library/{repo}")
    }
}

/// The mapping for `image`, if any.
pub fn find<'a>(images: &'a [ImageMapping], image: &str) -> Option<&'a ImageMapping> {
    let want = repository(image);
    images.iter().find(|m| repository(&m.image) == want)
}

/// The status message of an image with no mapping.
pub fn not_mapped_message(image: &str) -> String {
    format!("image {image:?} is not mapped to a host program by the test node agent")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories() {
        let cases = [
            ("squid", "docker.io/library/squid"),
            ("squid:6", "docker.io/library/squid"),
            ("ubuntu/squid:5.2", "docker.io/ubuntu/squid"),
            ("docker.io/ubuntu/squid", "docker.io/ubuntu/squid"),
            ("ghcr.io/o/proxy-operator:v1", "ghcr.io/o/proxy-operator"),
            ("ghcr.io/o/p@sha256:abcd", "ghcr.io/o/p"),
            ("ghcr.io/o/p:v1@sha256:abcd", "ghcr.io/o/p"),
            ("localhost:5000/p:1", "localhost:5000/p"),
            ("localhost/p", "localhost/p"),
        ];
        for (image, want) in cases {
            assert_eq!(repository(image), want, "{image}");
        }
    }

    #[test]
    fn finds_mappings() {
        let images = vec![
            ImageMapping {
                image: "ghcr.io/o/proxy-operator".into(),
                entrypoint: vec!["/bin/op".into()],
                rootfs: None,
                env: Vec::new(),
            },
            ImageMapping {
                image: "squid:latest".into(),
                entrypoint: vec!["/usr/sbin/squid".into()],
                rootfs: None,
                env: Vec::new(),
            },
        ];
        let ep = |i| find(&images, i).map(|m| m.entrypoint[0].as_str());
        assert_eq!(ep("ghcr.io/o/proxy-operator:dev"), Some("/bin/op"));
        assert_eq!(ep("docker.io/library/squid:6.1"), Some("/usr/sbin/squid"));
        assert_eq!(ep("ghcr.io/o/proxy-operatorx"), None);
        assert_eq!(ep("ghcr.io/other/proxy-operator"), None);
    }
}
