//! Lease ids.

/// Lease ids: 128 random bits, base32 (lowercase, unpadded).
pub type IdSource = Box<dyn Fn() -> String + Send + Sync>;

/// Random lease ids from the system's secure random source.
pub fn random_id() -> String {
    let buf = super::signed::random_bytes::<16>();
    format!(
        "l-{}",
        data_encoding::BASE32_NOPAD
            .encode(&buf)
            .to_ascii_lowercase()
    )
}
