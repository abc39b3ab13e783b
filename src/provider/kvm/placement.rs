//! Placement resolution (kvm.md §2.4): a pure function from the config
//! and a Proxy's placement to host, machine type and image. Every error is
//! a Permanent message naming the field, raised before any host is
//! contacted.

use super::ids;
use super::image::ImageSource;
use crate::api::Placement;
use crate::config::{Firmware, ImageFormat, KvmConfig, MachineType};

/// What a placement resolves to.
#[derive(Clone, Debug)]
pub struct Resolved<'a> {
    /// Index of the host in `kvm.hosts`.
    pub host: usize,
    /// The machine type.
    pub machine_type: &'a MachineType,
    /// The image.
    pub image: ImageSource,
}

/// Resolves host, machine type and image, in that order.
pub fn resolve<'a>(cfg: &'a KvmConfig, p: &Placement) -> Result<Resolved<'a>, String> {
    let host = if p.zone.is_empty() {
        match cfg.hosts.len() {
            0 => return Err("kvm.hosts is empty".into()),
            1 => 0,
            _ => {
                return Err(
                    "placement.zone is required when kvm.hosts lists more than one host".into(),
                )
            }
        }
    } else {
        cfg.hosts
            .iter()
            .position(|h| h.name == p.zone)
            .ok_or_else(|| format!("host {:?} is not in kvm.hosts", p.zone))?
    };
    let machine_type = cfg.machine_types.get(&p.machine_type).ok_or_else(|| {
        format!(
            "placement.machineType {:?} is not in kvm.machineTypes",
            p.machine_type
        )
    })?;
    let image = if let Some(i) = cfg.images.get(&p.image) {
        ImageSource {
            label: p.image.clone(),
            url: i.url.clone(),
            sha256: i.sha256.as_ref().map(|s| s.to_ascii_lowercase()),
            format: i.image_format(),
            firmware: i.image_firmware(),
            base_volume: ids::base_volume(&i.url, i.sha256.as_deref(), i.image_format()),
        }
    } else if crate::config::http_url(&p.image).is_ok() {
        if !super::urls::allowed(&cfg.allowed_image_urls, &p.image) {
            return Err(format!(
                "placement.image {:?} is a direct URL outside kvm.allowedImageUrls (direct image URLs are refused unless a prefix there covers them)",
                p.image
            ));
        }
        ImageSource {
            label: p.image.clone(),
            url: p.image.clone(),
            sha256: None,
            format: ImageFormat::Qcow2,
            firmware: Firmware::Uefi,
            base_volume: ids::base_volume_for_url(&p.image, ImageFormat::Qcow2),
        }
    } else {
        return Err(format!(
            "placement.image {:?} is neither a key in kvm.images nor an http(s) URL",
            p.image
        ));
    };
    Ok(Resolved {
        host,
        machine_type,
        image,
    })
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
