//! CloudInit never reaches logs or spans (C10): every tracing event at
//! TRACE, from every crate, is captured across create, get, list and delete
//! against the stand-in, and the sentinel must not appear. Its own test
//! binary, so the global subscriber sees every thread and callsite.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

mod gcp_standin;

use std::io::Write;
use std::sync::{Arc, Mutex};

use egress_proxies_operator::provider::gcp::GcpProvider;
use egress_proxies_operator::provider::{CreateRequest, Provider};
use gcp_standin::StandIn;

fn req() -> CreateRequest {
    gcp_standin::request(
        "proxy-a",
        "uid-a",
        "#cloud-config\nwrite_files:\n- content: SENTINEL-7f3a9c\n",
    )
}

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn sentinel_run(buf: &Buf, full: bool) -> String {
    buf.0.lock().unwrap().clear();
    let s = StandIn::start().await;
    s.with(|st| st.running_after_gets = 1);
    let p = GcpProvider::new(
        "gcp-eu",
        &gcp_standin::config(&s.url),
        gcp_standin::options(full),
    )
    .unwrap();
    let r = req();
    let id = p.create(&r).await.unwrap();
    p.create(&r).await.unwrap();
    p.get(&id).await.unwrap();
    p.list_by_tag().await.unwrap();
    p.delete(&id).await.unwrap();
    p.get(&id).await.unwrap();
    let _ = p.get(&id).await;
    let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    out
}

#[tokio::test]
async fn cloud_init_never_reaches_logs() {
    let buf = Buf::default();
    let w = buf.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || w.clone())
        .init();
    for full in [false, true] {
        let out = sentinel_run(&buf, full).await;
        assert!(!out.contains("SENTINEL-7f3a9c"), "full={full}: {out}");
        // The wire log ran and showed the size instead.
        assert!(out.contains("api request"), "{out}");
        assert!(out.contains("<redacted 54 bytes>"), "{out}");
        assert!(out.contains("cloud_init_bytes=54"), "{out}");
    }
}
