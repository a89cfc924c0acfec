//! Kubernetes quantities (`1Gi`, `500m`, `1.5`, `2e3`) by value.
//!
//! The API server keeps the quantities of built-in objects in canonical form: a PVC asked
//! for `1.5Gi` holds `1536Mi`, `2048Mi` becomes `2Gi`, `1000M` becomes `1G`. A child
//! compared with its live copy by text would be drift on every pass; [`same_value`]
//! compares by value instead, and [`canonical`] gives the form the API server stores.
//!
//! Values are exact: integers in thousandths (milli-units), rounded up (away from zero) as
//! Kubernetes does (`0.1m` is `1m`). Text that is not a quantity, or too large for an
//! `i128` of thousandths, parses as `None`.

/// The notation a quantity was written in; the canonical form keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A binary suffix: `Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei` (powers of 1024).
    BinarySI,
    /// A decimal suffix or none: `n`, `u`, `m`, ``, `k`, `M`, `G`, `T`, `P`, `E`.
    DecimalSI,
    /// An exponent: `e3`, `E-2`.
    DecimalExponent,
}

/// A parsed quantity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantity {
    /// The value in thousandths (`1` is 1000, `1Ki` is 1 024 000, `1m` is 1).
    pub millis: i128,
    pub format: Format,
}

const BINARY: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
const DECIMAL: [(&str, i32); 9] = [
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];

/// Parses a quantity in Kubernetes' grammar: an optional sign, digits with an optional
/// fraction (`1`, `1.5`, `1.`, `.5`), then a binary suffix, a decimal suffix or an
/// exponent.
pub fn parse(s: &str) -> Option<Quantity> {
    let (negative, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    // A second '.' stays in `frac` and fails here.
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (format, binary, decimal) = suffix_of(suffix)?;
    // digits × 1024^binary × 10^(decimal − fraction digits), in thousandths.
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 38 {
        return None;
    }
    let mut value: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    for _ in 0..binary {
        value = value.checked_mul(1024)?;
    }
    let frac_digits = i32::try_from(frac.len()).ok()?;
    let exponent = decimal.checked_add(3)?.checked_sub(frac_digits)?;
    if value != 0 {
        if exponent >= 0 {
            value = value.checked_mul(pow10(exponent)?)?;
        } else {
            // Rounded up: precision below a thousandth is lost, never a whole thousandth.
            let divisor = pow10(-exponent).unwrap_or(i128::MAX);
            value = value / divisor + i128::from(value % divisor != 0);
        }
    }
    Some(Quantity {
        millis: if negative { -value } else { value },
        format,
    })
}

/// (format, power of 1024, power of 10) of a suffix.
fn suffix_of(suffix: &str) -> Option<(Format, u32, i32)> {
    if suffix.is_empty() {
        return Some((Format::DecimalSI, 0, 0));
    }
    if let Some(k) = BINARY.iter().skip(1).position(|b| *b == suffix) {
        return Some((Format::BinarySI, u32::try_from(k + 1).ok()?, 0));
    }
    if let Some((_, e)) = DECIMAL.iter().find(|(d, _)| *d == suffix) {
        return Some((Format::DecimalSI, 0, *e));
    }
    let exponent = suffix.strip_prefix(['e', 'E'])?;
    let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((Format::DecimalExponent, 0, exponent.parse().ok()?))
}

fn pow10(exponent: i32) -> Option<i128> {
    10i128.checked_pow(u32::try_from(exponent).ok()?)
}

/// The value in thousandths, if `s` is a quantity.
pub fn millis(s: &str) -> Option<i128> {
    parse(s).map(|q| q.millis)
}

/// Whether two texts are the same quantity (`1.5Gi` and `1536Mi`); texts that are not
/// both quantities compare as text.
pub fn same_value(a: &str, b: &str) -> bool {
    match (millis(a), millis(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

/// The canonical form of a quantity, as the API server writes it: the same notation
/// (binary, decimal, exponent), no fraction, the largest suffix that loses nothing, no
/// `+`. A binary quantity that is not a whole number of at least 1024 in magnitude is
/// written in decimal, as Kubernetes does. `None` when `s` is not a quantity.
///
/// One value in one notation has one canonical form. (The API server itself keeps a few
/// texts that look canonical as written — `+1G`, `1E3`, `007Mi` — where this gives `1G`,
/// `1e3`, `7Mi`; compare with [`same_value`], never by text.)
pub fn canonical(s: &str) -> Option<String> {
    let q = parse(s)?;
    let sign = if q.millis < 0 { "-" } else { "" };
    let magnitude = q.millis.checked_abs()?;
    if q.format == Format::BinarySI && magnitude % 1000 == 0 && magnitude / 1000 >= 1024 {
        let mut units = magnitude / 1000;
        let mut k = 0;
        while k + 1 < BINARY.len() && units % 1024 == 0 {
            units /= 1024;
            k += 1;
        }
        return Some(format!("{sign}{units}{}", BINARY[k]));
    }
    if magnitude == 0 {
        return Some("0".to_string());
    }
    // The largest exponent, a multiple of 3 from -3 (thousandths) to 18, that divides.
    let mut mantissa = magnitude;
    let mut exponent = -3;
    while exponent < 18 && mantissa % 1000 == 0 {
        mantissa /= 1000;
        exponent += 3;
    }
    let suffix = match q.format {
        Format::DecimalExponent if exponent == 0 => String::new(),
        Format::DecimalExponent => format!("e{exponent}"),
        _ => DECIMAL
            .iter()
            .find(|(_, e)| *e == exponent)
            .map(|(d, _)| (*d).to_string())
            .unwrap_or_default(),
    };
    Some(format!("{sign}{mantissa}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KI: i128 = 1024;

    #[test]
    fn values_in_thousandths() {
        for (text, millis) in [
            ("0", 0),
            ("1", 1000),
            ("1.5", 1500),
            ("+1.5", 1500),
            ("-1.5", -1500),
            (".5", 500),
            ("1.", 1000),
            ("500m", 500),
            ("1k", 1_000_000),
            ("1M", 1_000_000_000),
            ("1G", 1_000_000_000_000),
            ("1000M", 1_000_000_000_000),
            ("1T", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000_000),
            ("1Ki", KI * 1000),
            ("1Mi", KI * KI * 1000),
            ("1.5Gi", 3 * KI * KI * KI * 500),
            ("1536Mi", 1536 * KI * KI * 1000),
            ("2048Mi", 2 * KI * KI * KI * 1000),
            ("1Ei", KI.pow(6) * 1000),
            ("1e3", 1_000_000),
            ("1E3", 1_000_000),
            ("1.5e3", 1_500_000),
            ("15e-1", 1500),
            ("1e+3", 1_000_000),
            ("0.0000000001", 1),
            ("0.1m", 1),
            ("1n", 1),
            ("1500u", 2),
            ("-0.1m", -1),
            ("007Mi", 7 * KI * KI * 1000),
        ] {
            assert_eq!(super::millis(text), Some(millis), "{text}");
        }
    }

    #[test]
    fn what_is_not_a_quantity() {
        for text in [
            "", "-", "+", ".", "Gi", "1 Gi", "1gi", "1GB", "1.2.3", "1e", "1e1.5", "e3", "1Ki5",
            "1 ", " 1", "0x10", "1,5", "--1", "1Kii", "1e-", "one",
        ] {
            assert_eq!(parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn absurd_magnitudes_are_not_quantities_rather_than_wrong_ones() {
        assert_eq!(parse("1e40"), None);
        assert_eq!(parse(&"9".repeat(39)), None);
        assert_eq!(parse("99999999999999999999999999999999999Ei"), None);
        // Tiny ones round up to a thousandth.
        assert_eq!(millis("1e-60"), Some(1));
        assert_eq!(millis("0e99"), Some(0));
    }

    #[test]
    fn the_notation_is_remembered() {
        assert_eq!(parse("1Gi").map(|q| q.format), Some(Format::BinarySI));
        assert_eq!(parse("1G").map(|q| q.format), Some(Format::DecimalSI));
        assert_eq!(parse("1").map(|q| q.format), Some(Format::DecimalSI));
        assert_eq!(parse("1E").map(|q| q.format), Some(Format::DecimalSI));
        assert_eq!(
            parse("1E1").map(|q| q.format),
            Some(Format::DecimalExponent)
        );
    }

    #[test]
    fn the_api_servers_canonical_forms() {
        for (text, canonical_form) in [
            ("1.5Gi", "1536Mi"),
            ("2048Mi", "2Gi"),
            ("1000M", "1G"),
            ("1Gi", "1Gi"),
            ("10Gi", "10Gi"),
            ("1024Ki", "1Mi"),
            ("1.5Ki", "1536"),
            ("0.5Ki", "512"),
            ("1023Mi", "1023Mi"),
            ("1.5", "1500m"),
            ("0.5", "500m"),
            ("500m", "500m"),
            ("1000m", "1"),
            ("2", "2"),
            ("1500M", "1500M"),
            ("1.5G", "1500M"),
            ("4000", "4k"),
            ("+1G", "1G"),
            ("-1.5Gi", "-1536Mi"),
            ("0", "0"),
            ("0Gi", "0"),
            ("0.1m", "1m"),
            ("1e3", "1e3"),
            ("1000e0", "1e3"),
            ("1.5e3", "1500"),
            ("15e-1", "1500e-3"),
            ("1000E", "1000E"),
            ("1Ei", "1Ei"),
            ("1024Ei", "1024Ei"),
        ] {
            assert_eq!(canonical(text).as_deref(), Some(canonical_form), "{text}");
            // Canonical forms are fixed points.
            assert_eq!(
                canonical(canonical_form).as_deref(),
                Some(canonical_form),
                "{canonical_form}"
            );
            assert!(
                same_value(text, canonical_form),
                "{text} = {canonical_form}"
            );
        }
        assert_eq!(canonical("1 Gi"), None);
    }

    #[test]
    fn comparison_by_value() {
        assert!(same_value("1.5Gi", "1536Mi"));
        assert!(same_value("2048Mi", "2Gi"));
        assert!(same_value("1000M", "1G"));
        assert!(same_value("1Gi", "1073741824"));
        assert!(same_value("0.5", "500m"));
        assert!(same_value("1e3", "1k"));
        assert!(!same_value("1G", "1Gi"));
        assert!(!same_value("1Gi", "2Gi"));
        assert!(!same_value("1536Mi", "1537Mi"));
        assert!(!same_value("500m", "0.5001"));
        // Not quantities: text.
        assert!(same_value("fast", "fast"));
        assert!(!same_value("1 Gi", "1Gi"));
        assert!(!same_value("fast", "1Gi"));
    }
}
