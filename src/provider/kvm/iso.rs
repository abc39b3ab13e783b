//! A minimal in-memory ISO 9660 writer for NoCloud seeds: one root
//! directory of small files, a primary volume descriptor with plain
//! ISO 9660 names (`user-data;1`, presented as `user-data` by Linux) and a
//! Joliet supplementary descriptor carrying the exact names. Written
//! in-process because the image has no ISO tool (distroless) and the seed
//! goes from memory straight into libvirt's volume upload; a seed is three
//! small files in one directory, so ~200 lines whose bytes our tests pin
//! cost less than a general ISO crate (Rock Ridge, El Torito, partition
//! tables) pulled in for it (docs/kvm-provider.md says so).

use chrono::{DateTime, Datelike, Timelike, Utc};

const SECTOR: usize = 2048;

/// One file in the image root.
pub struct IsoFile<'a> {
    /// Exact name (ASCII).
    pub name: &'a str,
    /// Content.
    pub data: &'a [u8],
}

fn both16(v: u16) -> [u8; 4] {
    let l = v.to_le_bytes();
    let b = v.to_be_bytes();
    [l[0], l[1], b[0], b[1]]
}

fn both32(v: u32) -> [u8; 8] {
    let l = v.to_le_bytes();
    let b = v.to_be_bytes();
    [l[0], l[1], l[2], l[3], b[0], b[1], b[2], b[3]]
}

fn ucs2(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(|u| u.to_be_bytes()).collect()
}

fn dir_date(t: DateTime<Utc>) -> [u8; 7] {
    [
        (t.year() - 1900).clamp(0, 255) as u8,
        t.month() as u8,
        t.day() as u8,
        t.hour() as u8,
        t.minute() as u8,
        t.second() as u8,
        0,
    ]
}

fn vol_date(t: DateTime<Utc>) -> [u8; 17] {
    let s = t.format("%Y%m%d%H%M%S00").to_string();
    let mut out = [b'0'; 17];
    out[..16].copy_from_slice(&s.as_bytes()[..16]);
    out[16] = 0;
    out
}

fn dir_record(name: &[u8], lba: u32, size: u32, dir: bool, t: DateTime<Utc>) -> Vec<u8> {
    let mut len = 33 + name.len();
    if len % 2 == 1 {
        len += 1;
    }
    let mut r = vec![0u8; len];
    r[0] = len as u8;
    r[2..10].copy_from_slice(&both32(lba));
    r[10..18].copy_from_slice(&both32(size));
    r[18..25].copy_from_slice(&dir_date(t));
    r[25] = if dir { 2 } else { 0 };
    r[28..32].copy_from_slice(&both16(1));
    r[32] = name.len() as u8;
    r[33..33 + name.len()].copy_from_slice(name);
    r
}

fn fill(buf: &mut [u8], text: &[u8], pad: &[u8]) {
    let mut i = 0;
    while i < buf.len() {
        buf[i] = if i < text.len() {
            text[i]
        } else {
            pad[(i - text.len()) % pad.len()]
        };
        i += 1;
    }
}

/// Builds the image. `label` is the volume identifier (`cidata`).
/// Fails only when a name is not ASCII or too long, or the directory
/// does not fit one sector (a seed has three short names).
pub fn build_iso(label: &str, files: &[IsoFile<'_>], t: DateTime<Utc>) -> Result<Vec<u8>, String> {
    for f in files {
        if !f.name.is_ascii() || f.name.is_empty() || f.name.len() > 64 {
            return Err(format!(
                "ISO file name {:?} is not a short ASCII name",
                f.name
            ));
        }
    }
    // Fixed layout: 16 system sectors, PVD, Joliet SVD, terminator, four
    // path tables, two root directories, then file data.
    const PVD: usize = 16;
    const SVD: usize = 17;
    const TERM: usize = 18;
    const PT_L: u32 = 19;
    const PT_M: u32 = 20;
    const JPT_L: u32 = 21;
    const JPT_M: u32 = 22;
    const ROOT: u32 = 23;
    const JROOT: u32 = 24;
    let mut next = 25u32;
    let mut extents = Vec::with_capacity(files.len());
    for f in files {
        let size = u32::try_from(f.data.len()).map_err(|_| "ISO file too large".to_string())?;
        extents.push((next, size));
        next += size.div_ceil(SECTOR as u32);
    }
    let total = next;
    let mut img = vec![0u8; total as usize * SECTOR];

    // Root directories.
    let build_dir = |self_lba: u32, joliet: bool| -> Result<Vec<u8>, String> {
        let mut d = Vec::new();
        d.extend(dir_record(&[0], self_lba, SECTOR as u32, true, t));
        d.extend(dir_record(&[1], self_lba, SECTOR as u32, true, t));
        for (f, (lba, size)) in files.iter().zip(&extents) {
            let name = if joliet {
                ucs2(f.name)
            } else {
                format!("{};1", f.name).into_bytes()
            };
            d.extend(dir_record(&name, *lba, *size, false, t));
        }
        if d.len() > SECTOR {
            return Err("ISO root directory does not fit one sector".into());
        }
        Ok(d)
    };
    let root = build_dir(ROOT, false)?;
    let jroot = build_dir(JROOT, true)?;
    img[ROOT as usize * SECTOR..][..root.len()].copy_from_slice(&root);
    img[JROOT as usize * SECTOR..][..jroot.len()].copy_from_slice(&jroot);

    // Path tables: one entry, the root.
    for (lba, root_lba, be) in [
        (PT_L, ROOT, false),
        (PT_M, ROOT, true),
        (JPT_L, JROOT, false),
        (JPT_M, JROOT, true),
    ] {
        let at = lba as usize * SECTOR;
        img[at] = 1;
        let loc = if be {
            root_lba.to_be_bytes()
        } else {
            root_lba.to_le_bytes()
        };
        img[at + 2..at + 6].copy_from_slice(&loc);
        let parent = if be {
            1u16.to_be_bytes()
        } else {
            1u16.to_le_bytes()
        };
        img[at + 6..at + 8].copy_from_slice(&parent);
    }

    // Volume descriptors.
    for (sector, joliet) in [(PVD, false), (SVD, true)] {
        let d = &mut img[sector * SECTOR..(sector + 1) * SECTOR];
        d[0] = if joliet { 2 } else { 1 };
        d[1..6].copy_from_slice(b"CD001");
        d[6] = 1;
        let (text_label, pad): (Vec<u8>, &[u8]) = if joliet {
            (ucs2(label), &[0, b' '])
        } else {
            (label.as_bytes().to_vec(), b" ")
        };
        fill(&mut d[8..40], &[], pad);
        fill(&mut d[40..72], &text_label, pad);
        d[80..88].copy_from_slice(&both32(total));
        if joliet {
            d[88..91].copy_from_slice(b"%/E");
        }
        d[120..124].copy_from_slice(&both16(1));
        d[124..128].copy_from_slice(&both16(1));
        d[128..132].copy_from_slice(&both16(SECTOR as u16));
        d[132..140].copy_from_slice(&both32(10));
        let (l, m, r) = if joliet {
            (JPT_L, JPT_M, JROOT)
        } else {
            (PT_L, PT_M, ROOT)
        };
        d[140..144].copy_from_slice(&l.to_le_bytes());
        d[148..152].copy_from_slice(&m.to_be_bytes());
        let rec = dir_record(&[0], r, SECTOR as u32, true, t);
        d[156..190].copy_from_slice(&rec);
        fill(&mut d[190..813], &[], pad);
        d[813..830].copy_from_slice(&vol_date(t));
        d[830..847].copy_from_slice(&vol_date(t));
        fill(&mut d[847..863], b"0", b"0");
        fill(&mut d[864..880], b"0", b"0");
        d[881] = 1;
    }
    let term = &mut img[TERM * SECTOR..(TERM + 1) * SECTOR];
    term[0] = 255;
    term[1..6].copy_from_slice(b"CD001");
    term[6] = 1;

    for (f, (lba, _)) in files.iter().zip(&extents) {
        img[*lba as usize * SECTOR..][..f.data.len()].copy_from_slice(f.data);
    }
    Ok(img)
}

/// Root files as (name, content).
pub type RootFiles = Vec<(String, Vec<u8>)>;

/// Reads an image made by [`build_iso`] back: the label of the chosen
/// descriptor and the root files (name, content). For tests and checks.
pub fn read_root(img: &[u8], joliet: bool) -> Option<(String, RootFiles)> {
    let sector = if joliet { 17 } else { 16 };
    let d = img.get(sector * SECTOR..(sector + 1) * SECTOR)?;
    if &d[1..6] != b"CD001" {
        return None;
    }
    let decode = |b: &[u8]| -> String {
        if joliet {
            let u: Vec<u16> = b
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16_lossy(&u)
        } else {
            String::from_utf8_lossy(b).into_owned()
        }
    };
    let label = decode(&d[40..72]).trim_end().to_string();
    let root_lba = u32::from_le_bytes(d[158..162].try_into().ok()?) as usize;
    let dir = img.get(root_lba * SECTOR..(root_lba + 1) * SECTOR)?;
    let mut files = Vec::new();
    let mut at = 0;
    while at < dir.len() && dir[at] != 0 {
        let len = dir[at] as usize;
        let rec = &dir[at..at + len];
        let nlen = rec[32] as usize;
        let name = &rec[33..33 + nlen];
        if rec[25] & 2 == 0 {
            let lba = u32::from_le_bytes(rec[2..6].try_into().ok()?) as usize;
            let size = u32::from_le_bytes(rec[10..14].try_into().ok()?) as usize;
            let data = img.get(lba * SECTOR..lba * SECTOR + size)?.to_vec();
            files.push((decode(name), data));
        }
        at += len;
    }
    Some((label, files))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn round_trip_both_name_sets() {
        let t = Utc.with_ymd_and_hms(2026, 3, 4, 5, 6, 7).unwrap();
        let big = vec![b'x'; 5000];
        let files = [
            IsoFile {
                name: "meta-data",
                data: b"instance-id: a\n",
            },
            IsoFile {
                name: "user-data",
                data: &big,
            },
            IsoFile {
                name: "vendor-data",
                data: b"",
            },
        ];
        let img = build_iso("cidata", &files, t).unwrap();
        assert_eq!(img.len() % SECTOR, 0);
        let (label, got) = read_root(&img, true).unwrap();
        assert_eq!(label, "cidata");
        let names: Vec<_> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["meta-data", "user-data", "vendor-data"]);
        assert_eq!(got[1].1, big);
        assert!(got[2].1.is_empty());
        let (label, got) = read_root(&img, false).unwrap();
        assert_eq!(label, "cidata");
        assert_eq!(got[0].0, "meta-data;1");
        // Same inputs, same bytes (the seed volume is sized from it).
        assert_eq!(img, build_iso("cidata", &files, t).unwrap());
    }
}
