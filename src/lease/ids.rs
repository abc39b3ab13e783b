//! Lease ids.

use chrono::Utc;

/// Lease ids: 128 random bits, base32 (lowercase, unpadded).
pub type IdSource = Box<dyn Fn() -> String + Send + Sync>;

/// Random lease ids from the TLS provider's secure random source.
pub fn random_id() -> String {
    let mut buf = [0u8; 16];
    let rng = rustls::crypto::ring::default_provider().secure_random;
    if rng.fill(&mut buf).is_err() {
        // Never observed on Linux; a time-and-counter id keeps the API up
        // (leases are also bound to the bearer token).
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = Utc::now().timestamp_nanos_opt().unwrap_or_default();
        buf[..8].copy_from_slice(&n.to_le_bytes());
        buf[8..].copy_from_slice(&t.to_le_bytes());
    }
    format!(
        "l-{}",
        data_encoding::BASE32_NOPAD
            .encode(&buf)
            .to_ascii_lowercase()
    )
}
