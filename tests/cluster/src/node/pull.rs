//! Images pulled from a registry on loopback, as a kubelet pulls them: the
//! README's walk-through pushes the operator's image to a registry on
//! 127.0.0.1 and installs it by that name. The image is copied with skopeo
//! into the node's directory and unpacked with umoci, once per reference;
//! its container then runs on an overlay of the image's root filesystem
//! (host-program images get an overlay of `/`) with the image's entrypoint
//! and environment.

use std::path::{Path, PathBuf};

use super::ImageMapping;

/// Whether `image` names a registry on this machine's loopback (a plain
/// HTTP registry a test started), the only registries the agent pulls from.
pub fn from_loopback_registry(image: &str) -> bool {
    let Some((host, _)) = image.split_once('/') else {
        return false;
    };
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    name == "localhost"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// One pull at a time per agent: two replicas of one Deployment would
/// otherwise unpack into the same directory at once.
static PULLS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The unpacked image's entrypoint and environment, pulled on first use
/// into `<dir>/images/<reference as a file name>`. The message of an error
/// is the tool's own.
pub async fn pull(dir: &Path, image: &str) -> Result<ImageMapping, String> {
    let _one = PULLS.lock().await;
    let name: String = image
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let base = dir.join("images").join(name);
    let bundle = base.join("bundle");
    if !bundle.join("config.json").exists() {
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
        let layout = format!("oci:{}:image", base.join("oci").display());
        let source = format!("docker://{image}");
        run(
            "skopeo",
            &[
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                &source,
                &layout,
            ],
        )
        .await?;
        let bundle_arg = bundle.to_string_lossy().into_owned();
        let unpacked = [
            "unpack",
            "--image",
            &format!("{}:image", base.join("oci").display()),
            &bundle_arg,
        ];
        run("umoci", &unpacked).await?;
    }
    mapping(image, &bundle)
}

fn mapping(image: &str, bundle: &Path) -> Result<ImageMapping, String> {
    let text = std::fs::read_to_string(bundle.join("config.json"))
        .map_err(|e| format!("{}: {e}", bundle.display()))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("the image's runtime config: {e}"))?;
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    Ok(ImageMapping {
        image: image.to_string(),
        entrypoint: strings(&config["process"]["args"]),
        rootfs: Some(PathBuf::from(bundle).join("rootfs")),
        env: strings(&config["process"]["env"]),
    })
}

async fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|e| format!("{program}: {e} (apt-get install {program})"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{program} {}: {}",
        args.first().copied().unwrap_or_default(),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_registries_are_pulled_from() {
        for (image, want) in [
            ("127.0.0.1:5000/egress-proxies-operator:0.1.0", true),
            ("localhost:5000/x", true),
            ("127.3.2.1:80/x@sha256:00", true),
            ("registry.example.com/x:1", false),
            ("10.0.0.1:5000/x", false),
            ("squid:latest", false),
            ("ubuntu/squid", false),
        ] {
            assert_eq!(from_loopback_registry(image), want, "{image}");
        }
    }
}
