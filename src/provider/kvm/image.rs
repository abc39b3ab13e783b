//! The base-image cache (kvm.md §5.3): downloaded on first use per host and
//! pool, streamed from HTTP through a bounded channel into libvirt's volume
//! upload (never whole in memory), SHA-256 computed on the way, the digest
//! marker written last.

use std::time::Instant;

use tokio::sync::mpsc;
use tracing::{info, info_span, warn, Instrument};

use super::conn::OpConn;
use super::download;
use super::protocol::Request;
use crate::config::{Firmware, ImageFormat};
use crate::provider::{BoxError, ErrorClass, Tagged};

pub use super::download::STALL_TIMEOUT;
/// Chunks in flight between the HTTP reader and the libvirt stream.
const CHANNEL_CHUNKS: usize = 4;

/// A resolved image source.
#[derive(Clone, Debug)]
pub struct ImageSource {
    /// The catalogue key, or the URL for a direct one (for messages).
    pub label: String,
    /// Where to fetch it.
    pub url: String,
    /// Expected lowercase hex digest.
    pub sha256: Option<String>,
    /// Disk format.
    pub format: ImageFormat,
    /// Boot firmware.
    pub firmware: Firmware,
    /// Cached volume name.
    pub base_volume: String,
}

/// Ensures the base image is cached in `pool`; returns its host path.
/// The caller holds the (host, base volume) lock.
pub async fn ensure_base(
    op: &OpConn,
    http: &reqwest::Client,
    pool: &str,
    img: &ImageSource,
) -> Result<String, BoxError> {
    // 1. Ready check.
    let ready: Option<String> = op
        .call(
            "checking the cached base image",
            Request::BaseReady {
                pool: pool.to_string(),
                base: img.base_volume.clone(),
                sha256: img.sha256.clone(),
            },
        )
        .await?;
    if let Some(path) = ready {
        tracing::debug!(volume = %img.base_volume, "base image already cached");
        return Ok(path);
    }

    // 2. Clear leftovers: marker first, then the base.
    op.call::<()>(
        "removing a stale base image",
        Request::RemoveBase {
            pool: pool.to_string(),
            base: img.base_volume.clone(),
        },
    )
    .await?;

    // 3. Fetch and stream.
    let span = info_span!("kvm.image_download", image = %img.label, volume = %img.base_volume);
    async {
        if img.url.to_ascii_lowercase().starts_with("http://") {
            warn!(image = %img.label, url = %img.url, "image is fetched over plain http; set sha256 to pin its content");
        }
        let resp = http
            .get(&img.url)
            .send()
            .await
            .map_err(|e| -> BoxError {
                if e.is_builder() {
                    Box::new(Tagged::permanent(format!("image {} ({}): {e}", img.label, img.url)))
                } else {
                    format!("fetching image {}: {e}", img.url).into()
                }
            })?;
        let status = resp.status();
        if status.is_client_error() {
            return Err(Tagged::permanent(format!(
                "image {} ({}) returned HTTP {}",
                img.label,
                img.url,
                status.as_u16()
            ))
            .into());
        }
        if !status.is_success() {
            return Err(format!("image {} returned HTTP {}", img.url, status.as_u16()).into());
        }
        let Some(len) = resp.content_length() else {
            return Err(Tagged::permanent(format!(
                "image {} ({}) has no Content-Length; the base volume needs a known size",
                img.label, img.url
            ))
            .into());
        };
        // Room for it? (libvirt has no quota signal; a clear shortfall is
        // reported as QuotaExceeded rather than failing mid-upload.)
        let available: u64 = op
            .call(
                "reading pool capacity",
                Request::PoolAvailable {
                    pool: pool.to_string(),
                },
            )
            .await?;
        if available < len {
            return Err(Tagged::new(
                ErrorClass::QuotaExceeded,
                format!(
                    "storage pool {pool:?} has {available} bytes available; image {} needs {len}",
                    img.label
                ),
            )
            .into());
        }
        info!(pool, volume = %img.base_volume, url = %img.url, bytes = len, "fetching base image into host pool");
        let started = Instant::now();
        let (tx, rx) = mpsc::channel::<Option<Vec<u8>>>(CHANNEL_CHUNKS);
        let upload = op.upload::<Option<u64>>(
            "uploading image to base volume",
            Request::Upload {
                pool: pool.to_string(),
                base: img.base_volume.clone(),
                len,
                format: img.format,
            },
            len,
            rx,
        );
        let feed = download::feed(resp, tx, len, download::Limits::default(), &img.url);
        let (uploaded, fed) = tokio::join!(upload, feed);
        let digest = match (uploaded, fed) {
            (Err(e), _) => return Err(e.into()),
            (Ok(_), Err(e)) => return Err(e.into()),
            (Ok(None), Ok(_)) | (Ok(_), Ok(None)) => {
                return Err(format!("fetching image {}: transfer ended early", img.url).into())
            }
            (Ok(Some(_)), Ok(Some(d))) => d,
        };
        if let Some(want) = &img.sha256 {
            if !want.eq_ignore_ascii_case(&digest) {
                let _ = op
                    .call::<bool>(
                        "removing a corrupt base image",
                        Request::RemoveVolume {
                            pool: pool.to_string(),
                            volume: img.base_volume.clone(),
                        },
                    )
                    .await;
                return Err(Tagged::permanent(format!(
                    "image {} ({}) sha256 is {digest}, config expects {}",
                    img.label,
                    img.url,
                    want.to_ascii_lowercase()
                ))
                .into());
            }
        }
        let path: String = op
            .call(
                "writing the base image marker",
                Request::WriteMarker {
                    pool: pool.to_string(),
                    base: img.base_volume.clone(),
                    digest: digest.clone(),
                },
            )
            .await?;
        info!(volume = %img.base_volume, sha256 = %digest, bytes = len, duration_s = started.elapsed().as_secs(), "base image cached");
        Ok::<_, BoxError>(path)
    }
    .instrument(span)
    .await
}
