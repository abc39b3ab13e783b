//! Kubernetes resource quantities (`128Mi`, `1G`, `500m`, `1e3`).

use anyhow::{bail, Context};

/// The value of a quantity as a float (`"1Ki"` → 1024.0, `"500m"` → 0.5).
pub fn parse(q: &str) -> anyhow::Result<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    if num.is_empty() {
        bail!("invalid quantity {q:?}");
    }
    let num: f64 = num
        .parse()
        .with_context(|| format!("invalid quantity {q:?}"))?;
    let mult = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..]
                .parse()
                .with_context(|| format!("invalid quantity {q:?}"))?;
            10f64.powi(exp)
        }
        _ => bail!("invalid quantity {q:?}"),
    };
    Ok(num * mult)
}

/// A memory quantity in bytes, rounded up.
pub fn bytes(q: &str) -> anyhow::Result<u64> {
    let v = parse(q)?;
    if v < 0.0 {
        bail!("negative quantity {q:?}");
    }
    // Saturating float-to-int conversion; quantities are far below u64::MAX.
    Ok(v.ceil() as u64)
}

/// `value / divisor` rounded up, as the downward API reports resources.
pub fn divided(value: &str, divisor: Option<&str>) -> anyhow::Result<String> {
    let v = parse(value)?;
    let d = match divisor {
        Some(d) => parse(d)?,
        None => 1.0,
    };
    if d <= 0.0 {
        bail!("invalid divisor {divisor:?}");
    }
    // Rounded up to an integer, as kubelet does.
    Ok(format!("{}", (v / d).ceil() as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quantities() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("128", 128),
            ("1Ki", 1024),
            ("64Mi", 64 << 20),
            ("1Gi", 1 << 30),
            ("1.5Gi", 3 << 29),
            ("1k", 1000),
            ("500M", 500_000_000),
            ("2G", 2_000_000_000),
            ("1e3", 1000),
            ("1500m", 2),
        ];
        for (q, want) in cases {
            assert_eq!(bytes(q).unwrap(), *want, "{q}");
        }
        for bad in ["", "Mi", "12Q", "1.2.3", "-1"] {
            assert!(bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn divides_like_the_downward_api() {
        assert_eq!(divided("500m", None).unwrap(), "1");
        assert_eq!(divided("2", Some("1m")).unwrap(), "2000");
        assert_eq!(divided("64Mi", Some("1Mi")).unwrap(), "64");
        assert_eq!(divided("64Mi", None).unwrap(), "67108864");
    }
}
