//! Writes the CRDs generated from the Rust types (`make crds`), and the
//! discovery API's OpenAPI document as served with the default flags.
//!
//! `crdgen DIR` writes one file per CRD into DIR; `crdgen` alone prints them
//! all to stdout as one YAML stream; `crdgen --openapi FILE` writes the
//! OpenAPI document to FILE.

use std::path::PathBuf;
use std::process::ExitCode;

use egress_proxies_operator::api::crd;

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    if let [flag, file] = args.as_slice() {
        if flag == "--openapi" {
            let doc = egress_proxies_operator::discovery::served_openapi_json();
            if let Err(e) = std::fs::write(file, doc + "\n") {
                eprintln!("crdgen: cannot write {}: {e}", file.to_string_lossy());
                return ExitCode::FAILURE;
            }
            return ExitCode::SUCCESS;
        }
    }
    let dir = args.first().map(PathBuf::from);
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
