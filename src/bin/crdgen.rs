//! Writes the CRDs generated from the Rust types (`make crds`).
//!
//! `crdgen DIR` writes one file per CRD into DIR; `crdgen` alone prints them
//! all to stdout as one YAML stream.

use std::path::PathBuf;
use std::process::ExitCode;

use egress_proxies_operator::api::crd;

fn main() -> ExitCode {
    let dir = std::env::args_os().nth(1).map(PathBuf::from);
    for (file, def) in crd::all() {
        let yaml = match crd::to_yaml(&def) {
            Ok(y) => y,
            Err(e) => {
                eprintln!("crdgen: cannot render {file}: {e}");
                return ExitCode::FAILURE;
            }
        };
        match &dir {
            Some(dir) => {
                let path = dir.join(file);
                if let Err(e) = std::fs::write(&path, yaml) {
                    eprintln!("crdgen: cannot write {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            None => print!("---\n{yaml}"),
        }
    }
    ExitCode::SUCCESS
}
