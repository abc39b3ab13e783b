//! The base-image cache (kvm.md §5.3): downloaded on first use per host and
//! pool, streamed from HTTP through a bounded channel into libvirt's volume
//! upload (never whole in memory), SHA-256 computed on the way, the digest
//! marker written last.

use std::time::Instant;

use tokio::sync::mpsc;
use tracing::{info, info_span, warn, Instrument};
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use super::classify::code;
use super::conn::{rpc, OpConn, NO_FLAGS, WHOLE_VOLUME};
use super::download;
use super::ids::marker_volume;
use super::xml::volume_xml;
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

/// Sends all of `data` on a blocking stream.
fn send_all(stream: &Stream, mut data: &[u8]) -> Result<(), virt::error::Error> {
    while !data.is_empty() {
        let n = stream.send(data)?;
        if n <= 0 {
            // Blocking streams never answer EAGAIN; treat 0 as an error.
            return Err(virt::error::Error::last_error());
        }
        data = &data[n as usize..];
    }
    Ok(())
}

/// Creates a raw volume of exactly `data.len()` bytes in `pool` and uploads
/// `data` into it (seeds and markers: small).
pub fn upload_small(
    c: &virt::connect::Connect,
    pool: &str,
    vol_name: &str,
    data: &[u8],
) -> Result<(), virt::error::Error> {
    let pool = rpc("virStoragePoolLookupByName", || {
        c.lookup_storage_pool_by_name(pool)
    })?;
    let xml = volume_xml(vol_name, data.len() as u64, ImageFormat::Raw, None);
    let vol = rpc("virStorageVolCreateXML", || {
        StorageVol::create_xml(&pool, &xml, NO_FLAGS)
    })?;
    let res = (|| {
        let stream = Stream::new(c, NO_FLAGS)?;
        rpc("virStorageVolUpload", || {
            vol.upload(&stream, WHOLE_VOLUME.0, WHOLE_VOLUME.1, NO_FLAGS)
        })?;
        if let Err(e) = send_all(&stream, data) {
            let _ = stream.abort();
            return Err(e);
        }
        stream.finish()
    })();
    if res.is_err() {
        let _ = rpc("virStorageVolDelete", || vol.delete(NO_FLAGS));
    }
    res
}

/// Reads a small volume whole.
fn download_small(
    c: &virt::connect::Connect,
    vol: &StorageVol,
) -> Result<Vec<u8>, virt::error::Error> {
    let stream = Stream::new(c, NO_FLAGS)?;
    rpc("virStorageVolDownload", || {
        vol.download(&stream, WHOLE_VOLUME.0, WHOLE_VOLUME.1, NO_FLAGS)
    })?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.recv(&mut buf)?;
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
        if out.len() > 4096 {
            break;
        }
    }
    let _ = stream.finish();
    Ok(out)
}

/// Deletes a volume by name; a missing one is fine.
pub fn delete_if_exists(
    pool: &virt::storage_pool::StoragePool,
    name: &str,
) -> Result<bool, virt::error::Error> {
    match rpc("virStorageVolLookupByName", || {
        pool.lookup_storage_vol_by_name(name)
    }) {
        Ok(v) => match rpc("virStorageVolDelete", || v.delete(NO_FLAGS)) {
            Ok(()) => Ok(true),
            Err(e) if super::classify::code_of(&e) == code::NO_STORAGE_VOL => Ok(false),
            Err(e) => Err(e),
        },
        Err(e) if super::classify::code_of(&e) == code::NO_STORAGE_VOL => Ok(false),
        Err(e) => Err(e),
    }
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
    let (p, base, want) = (
        pool.to_string(),
        img.base_volume.clone(),
        img.sha256.clone(),
    );
    let ready = op
        .call("checking the cached base image", move |c| {
            let pool = rpc("virStoragePoolLookupByName", || {
                c.lookup_storage_pool_by_name(&p)
            })?;
            let vol = match rpc("virStorageVolLookupByName", || {
                pool.lookup_storage_vol_by_name(&base)
            }) {
                Ok(v) => v,
                Err(e) if super::classify::code_of(&e) == code::NO_STORAGE_VOL => return Ok(None),
                Err(e) => return Err(e),
            };
            let marker = match rpc("virStorageVolLookupByName", || {
                pool.lookup_storage_vol_by_name(&marker_volume(&base))
            }) {
                Ok(m) => m,
                Err(e) if super::classify::code_of(&e) == code::NO_STORAGE_VOL => return Ok(None),
                Err(e) => return Err(e),
            };
            if let Some(want) = want {
                let got = download_small(c, &marker)?;
                let got = String::from_utf8_lossy(&got).trim().to_ascii_lowercase();
                if got != want.to_ascii_lowercase() {
                    return Ok(None);
                }
            }
            Ok(Some(rpc("virStorageVolGetPath", || vol.path())?))
        })
        .await?;
    if let Some(path) = ready {
        tracing::debug!(volume = %img.base_volume, "base image already cached");
        return Ok(path);
    }

    // 2. Clear leftovers: marker first, then the base.
    let (p, base) = (pool.to_string(), img.base_volume.clone());
    op.call("removing a stale base image", move |c| {
        let pool = rpc("virStoragePoolLookupByName", || {
            c.lookup_storage_pool_by_name(&p)
        })?;
        delete_if_exists(&pool, &marker_volume(&base))?;
        delete_if_exists(&pool, &base)?;
        Ok(())
    })
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
        let p = pool.to_string();
        let available = op
            .call("reading pool capacity", move |c| {
                let pool = rpc("virStoragePoolLookupByName", || c.lookup_storage_pool_by_name(&p))?;
                rpc("virStoragePoolRefresh", || pool.refresh(NO_FLAGS))?;
                Ok(rpc("virStoragePoolGetInfo", || pool.info())?.available)
            })
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
        let (tx, mut rx) = mpsc::channel::<Option<Vec<u8>>>(CHANNEL_CHUNKS);
        let (p, base, fmt) = (pool.to_string(), img.base_volume.clone(), img.format);
        let upload = op.call_transfer("uploading image to base volume", move |c| {
            let pool = rpc("virStoragePoolLookupByName", || c.lookup_storage_pool_by_name(&p))?;
            let xml = volume_xml(&base, len, fmt, None);
            let vol = rpc("virStorageVolCreateXML", || StorageVol::create_xml(&pool, &xml, NO_FLAGS))?;
            let res = (|| {
                let stream = Stream::new(c, NO_FLAGS)?;
                rpc("virStorageVolUpload", || vol.upload(&stream, WHOLE_VOLUME.0, WHOLE_VOLUME.1, NO_FLAGS))?;
                let mut sent = 0u64;
                loop {
                    match rx.blocking_recv() {
                        Some(Some(chunk)) => {
                            if let Err(e) = send_all(&stream, &chunk) {
                                let _ = stream.abort();
                                return Err(e);
                            }
                            sent += chunk.len() as u64;
                        }
                        // The HTTP side failed: abort the stream, keep the link.
                        Some(None) | None => {
                            let _ = stream.abort();
                            return Ok(None);
                        }
                    }
                    if sent >= len {
                        break;
                    }
                }
                stream.finish()?;
                Ok(Some(sent))
            })();
            match res {
                Ok(Some(n)) => Ok(Some(n)),
                other => {
                    let _ = rpc("virStorageVolDelete", || vol.delete(NO_FLAGS));
                    other
                }
            }
        });
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
                let (p, base) = (pool.to_string(), img.base_volume.clone());
                let _ = op
                    .call("removing a corrupt base image", move |c| {
                        let pool = rpc("virStoragePoolLookupByName", || c.lookup_storage_pool_by_name(&p))?;
                        delete_if_exists(&pool, &base)
                    })
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
        let (p, base, d) = (pool.to_string(), img.base_volume.clone(), digest.clone());
        let path = op
            .call("writing the base image marker", move |c| {
                let pool = rpc("virStoragePoolLookupByName", || c.lookup_storage_pool_by_name(&p))?;
                rpc("virStoragePoolRefresh", || pool.refresh(NO_FLAGS))?;
                upload_small(c, &p, &marker_volume(&base), d.as_bytes())?;
                let vol = rpc("virStorageVolLookupByName", || pool.lookup_storage_vol_by_name(&base))?;
                rpc("virStorageVolGetPath", || vol.path())
            })
            .await?;
        info!(volume = %img.base_volume, sha256 = %digest, bytes = len, duration_s = started.elapsed().as_secs(), "base image cached");
        Ok::<_, BoxError>(path)
    }
    .instrument(span)
    .await
}
