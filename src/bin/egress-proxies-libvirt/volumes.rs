//! The libvirt sequences about storage: the host check, the base-image
//! cache's volumes (kvm.md §5.3), small uploads and downloads (seeds and
//! digest markers) and the streamed base-image upload.

use std::io::Read;

use egress_proxies_operator::config::ImageFormat;
use egress_proxies_operator::provider::kvm::classify::code;
use egress_proxies_operator::provider::kvm::ids::marker_volume;
use egress_proxies_operator::provider::kvm::protocol::{HostFacts, PoolInfo};
use egress_proxies_operator::provider::kvm::xml::volume_xml;
use virt::connect::Connect;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use crate::wire::{absent, rpc};
use crate::{NO_FLAGS, WHOLE_VOLUME};

/// The largest digest marker read back (a hex SHA-256 and a newline fit).
const MARKER_MAX: usize = 4096;

fn pool(c: &Connect, name: &str) -> Result<StoragePool, virt::error::Error> {
    rpc("virStoragePoolLookupByName", || {
        c.lookup_storage_pool_by_name(name)
    })
}

fn pool_info(p: &StoragePool) -> Result<PoolInfo, virt::error::Error> {
    let info = rpc("virStoragePoolGetInfo", || p.info())?;
    Ok(PoolInfo {
        state: info.state,
        capacity: info.capacity,
        available: info.available,
    })
}

/// The host check's facts.
pub fn check(c: &Connect, pool_name: &str) -> Result<HostFacts, virt::error::Error> {
    let version = rpc("virConnectGetLibVersion", || c.lib_version())?;
    let hostname = rpc("virConnectGetHostname", || c.hostname())?;
    let p = pool(c, pool_name)?;
    Ok(HostFacts {
        version: version.into(),
        hostname,
        pool: pool_info(&p)?,
    })
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

/// Creates the volume `vol_name` of `len` bytes in the pool and streams
/// into it what `feed` sends; `feed`'s `Ok(false)` aborts the upload. The
/// volume is deleted unless the upload finished.
fn upload_into(
    c: &Connect,
    pool_name: &str,
    vol_name: &str,
    (len, format): (u64, ImageFormat),
    feed: impl FnOnce(&Stream) -> Result<bool, virt::error::Error>,
) -> Result<bool, virt::error::Error> {
    let p = pool(c, pool_name)?;
    let xml = volume_xml(vol_name, len, format, None);
    let vol = rpc("virStorageVolCreateXML", || {
        StorageVol::create_xml(&p, &xml, NO_FLAGS)
    })?;
    let streamed = (|| {
        let stream = Stream::new(c, NO_FLAGS)?;
        rpc("virStorageVolUpload", || {
            vol.upload(&stream, WHOLE_VOLUME.0, WHOLE_VOLUME.1, NO_FLAGS)
        })?;
        match feed(&stream) {
            Ok(true) => stream.finish().map(|()| true),
            other => {
                let _ = stream.abort();
                other
            }
        }
    })();
    if !matches!(streamed, Ok(true)) {
        let _ = rpc("virStorageVolDelete", || vol.delete(NO_FLAGS));
    }
    streamed
}

/// Creates a raw volume of exactly `data.len()` bytes in `pool` and uploads
/// `data` into it (seeds and markers: small).
pub fn upload_small(
    c: &Connect,
    pool_name: &str,
    vol_name: &str,
    data: &[u8],
) -> Result<(), virt::error::Error> {
    let size = (data.len() as u64, ImageFormat::Raw);
    upload_into(c, pool_name, vol_name, size, |stream| {
        send_all(stream, data).map(|()| true)
    })
    .map(drop)
}

/// Reads a small volume whole (at most a little over [`MARKER_MAX`]).
fn download_small(c: &Connect, vol: &StorageVol) -> Result<Vec<u8>, virt::error::Error> {
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
        if out.len() > MARKER_MAX {
            break;
        }
    }
    let _ = stream.finish();
    Ok(out)
}

/// Deletes a volume by name; a missing one is fine.
pub fn delete_if_exists(p: &StoragePool, name: &str) -> Result<bool, virt::error::Error> {
    let Some(v) = lookup_volume(p, name)? else {
        return Ok(false);
    };
    let deleted = rpc("virStorageVolDelete", || v.delete(NO_FLAGS));
    Ok(absent(deleted, code::NO_STORAGE_VOL)?.is_some())
}

/// A volume by name, `None` when missing.
fn lookup_volume(p: &StoragePool, name: &str) -> Result<Option<StorageVol>, virt::error::Error> {
    let found = rpc("virStorageVolLookupByName", || {
        p.lookup_storage_vol_by_name(name)
    });
    absent(found, code::NO_STORAGE_VOL)
}

/// The cached base volume's path when it and its marker are there and the
/// marker holds `want` (when given).
pub fn base_ready(
    c: &Connect,
    pool_name: &str,
    base: &str,
    want: Option<&str>,
) -> Result<Option<String>, virt::error::Error> {
    let p = pool(c, pool_name)?;
    let Some(vol) = lookup_volume(&p, base)? else {
        return Ok(None);
    };
    let Some(marker) = lookup_volume(&p, &marker_volume(base))? else {
        return Ok(None);
    };
    if let Some(want) = want {
        let got = download_small(c, &marker)?;
        let got = String::from_utf8_lossy(&got).trim().to_ascii_lowercase();
        if got != want.to_ascii_lowercase() {
            return Ok(None);
        }
    }
    Ok(Some(rpc("virStorageVolGetPath", || vol.path())?))
}

/// Deletes a stale base image: its marker first, then the volume.
pub fn remove_base(c: &Connect, pool_name: &str, base: &str) -> Result<(), virt::error::Error> {
    let p = pool(c, pool_name)?;
    delete_if_exists(&p, &marker_volume(base))?;
    delete_if_exists(&p, base)?;
    Ok(())
}

/// Deletes one volume of the pool; a missing one is fine.
pub fn remove_volume(c: &Connect, pool_name: &str, vol: &str) -> Result<bool, virt::error::Error> {
    delete_if_exists(&pool(c, pool_name)?, vol)
}

/// Refreshes the pool and reads its free bytes.
pub fn pool_available(c: &Connect, pool_name: &str) -> Result<u64, virt::error::Error> {
    let p = pool(c, pool_name)?;
    rpc("virStoragePoolRefresh", || p.refresh(NO_FLAGS))?;
    Ok(pool_info(&p)?.available)
}

/// Writes the base image's digest marker; answers the base's path.
pub fn write_marker(
    c: &Connect,
    pool_name: &str,
    base: &str,
    digest: &str,
) -> Result<String, virt::error::Error> {
    let p = pool(c, pool_name)?;
    rpc("virStoragePoolRefresh", || p.refresh(NO_FLAGS))?;
    upload_small(c, pool_name, &marker_volume(base), digest.as_bytes())?;
    let vol = rpc("virStorageVolLookupByName", || {
        p.lookup_storage_vol_by_name(base)
    })?;
    rpc("virStorageVolGetPath", || vol.path())
}

/// One frame of an upload's bytes: `Some(bytes)`, or `None` for the
/// operator's abort (a zero length) or a closed stdin.
pub fn read_frame(input: &mut impl Read) -> Option<Vec<u8>> {
    let mut head = [0u8; 4];
    input.read_exact(&mut head).ok()?;
    let len = u32::from_be_bytes(head) as usize;
    if len == 0 {
        return None;
    }
    let mut buf = vec![0u8; len];
    input.read_exact(&mut buf).ok()?;
    Some(buf)
}

/// Reads and drops frames until `left` bytes have come or the operator's
/// abort, so the next request starts on a line of its own.
pub fn drain(input: &mut impl Read, mut left: u64) {
    while left > 0 {
        match read_frame(input) {
            Some(f) => left = left.saturating_sub(f.len() as u64),
            None => return,
        }
    }
}

/// What an upload did, and how many of its bytes may still come on stdin
/// (the caller answers first, so the operator stops sending, then drains).
pub struct Uploaded {
    /// The bytes sent, `None` when the operator aborted.
    pub result: Result<Option<u64>, virt::error::Error>,
    /// Bytes of frames not read yet.
    pub unread: u64,
}

/// Creates the base volume and streams `len` bytes from `input`'s frames
/// into it. `Ok(None)`: the operator aborted (its download failed); the
/// volume is deleted then and on any error.
pub fn upload(
    c: &Connect,
    input: &mut impl Read,
    pool_name: &str,
    base: &str,
    len: u64,
    format: ImageFormat,
) -> Uploaded {
    let mut sent = 0u64;
    let res = upload_into(c, pool_name, base, (len, format), |stream| {
        while sent < len {
            let Some(chunk) = read_frame(input) else {
                // The download failed: abort the stream, keep the link.
                sent = len;
                return Ok(false);
            };
            sent += chunk.len() as u64;
            send_all(stream, &chunk)?;
        }
        Ok(true)
    })
    .map(|finished| finished.then_some(sent));
    Uploaded {
        unread: if res.is_err() {
            len.saturating_sub(sent)
        } else {
            0
        },
        result: res,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_until_the_abort_and_a_drain_stops_at_the_total() {
        let mut wire = Vec::new();
        for chunk in [&b"abc"[..], b"de"] {
            wire.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
            wire.extend_from_slice(chunk);
        }
        wire.extend_from_slice(&0u32.to_be_bytes());
        wire.extend_from_slice(b"{\"op\":\"listManaged\"}\n");
        let mut r = &wire[..];
        assert_eq!(read_frame(&mut r).as_deref(), Some(&b"abc"[..]));
        assert_eq!(read_frame(&mut r).as_deref(), Some(&b"de"[..]));
        assert_eq!(read_frame(&mut r), None, "a zero length is the abort");
        assert_eq!(r, b"{\"op\":\"listManaged\"}\n");

        // Draining after a failure stops at the abort, or at the total.
        let mut r = &wire[..];
        drain(&mut r, 100);
        assert_eq!(r, b"{\"op\":\"listManaged\"}\n");
        let mut r = &wire[..];
        drain(&mut r, 3);
        assert_eq!(read_frame(&mut r).as_deref(), Some(&b"de"[..]));
    }
}
