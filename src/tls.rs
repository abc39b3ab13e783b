//! The process's one crypto library: ring. kube, the probes, the metrics
//! server and the gateway name it; reqwest (the kvm image downloads, the
//! OTLP/HTTP exporter) and the Google client take rustls's process-wide
//! default provider, which [`install_ring`] sets. Nothing links aws-lc-rs.

/// Makes ring rustls's process-wide provider. Idempotent: the first call
/// wins and later ones change nothing. Whatever builds a reqwest or Google
/// client calls it first, so a test or tool that skips `main` works too.
pub fn install_ring() {
    // Err only when a provider is installed already: nothing to do then.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    #[test]
    fn ring_is_the_default_after_install() {
        super::install_ring();
        super::install_ring();
        let p = rustls::crypto::CryptoProvider::get_default().expect("installed");
        let suites = |p: &rustls::crypto::CryptoProvider| {
            p.cipher_suites
                .iter()
                .map(|s| s.suite())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            suites(p),
            suites(&rustls::crypto::ring::default_provider()),
            "the installed provider is ring's"
        );
        // reqwest has no provider of its own: it builds on this one.
        reqwest::Client::builder()
            .build()
            .expect("a TLS client builds on ring");
    }
}
