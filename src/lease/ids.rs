//! Random names.

/// 128 random bits from the system's secure source, base32 (lowercase,
/// unpadded) after `l-`: request keys and names that must not repeat.
pub fn random_id() -> String {
    let buf = super::signed::random_bytes::<16>();
    format!(
        "l-{}",
        data_encoding::BASE32_NOPAD
            .encode(&buf)
            .to_ascii_lowercase()
    )
}
