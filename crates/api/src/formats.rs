//! String formats of the API: each one as a regular expression for the CRD schema
//! (`pattern`, evaluated by the API server with Go's RE2) and as a Rust function that
//! accepts exactly the same strings, for [`crate::validate`].
//!
//! The two sides of each pair must agree; `tests/crd_validation.rs` feeds a table of
//! samples to both the API server and these functions to prove it.

/// A Kubernetes quantity of bytes greater than zero, without exponent or milli suffix:
/// `10Gi`, `500M`, `1.5Ti`, `0.5Gi`.
pub const QUANTITY_PATTERN: &str =
    r"^([1-9][0-9]*(\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$";

/// An RFC 1123 subdomain (names of Secrets, PVCs, StorageClasses, PostgresBackups),
/// at most 253 characters (the length is a separate schema rule).
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// An RFC 1035 label (a cluster's name becomes part of Service names).
pub const DNS_LABEL_PATTERN: &str = r"^[a-z]([-a-z0-9]*[a-z0-9])?$";

/// A key in a Secret's data.
pub const SECRET_KEY_PATTERN: &str = r"^[-._a-zA-Z0-9]+$";

/// One non-empty pg_hba.conf line.
pub const HBA_LINE_PATTERN: &str = r"^[^\r\n]+$";

/// An S3 bucket name.
pub const BUCKET_PATTERN: &str = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$";

/// An http or https URL with a host.
pub const URL_PATTERN: &str = r"^https?://[^/\s]+(/\S*)?$";

/// An unquoted PostgreSQL identifier in lower case, at most 63 bytes.
pub const IDENTIFIER_PATTERN: &str = r"^[a-z_][a-z0-9_]{0,62}$";

/// The shape of an IANA time zone name (`UTC`, `Europe/Berlin`, `Etc/GMT+5`). Whether the
/// zone exists is checked where the schedule is evaluated.
pub const TIMEZONE_PATTERN: &str = r"^[A-Za-z][-A-Za-z0-9_+]*(/[-A-Za-z0-9_+]+)*$";

/// An RFC 3339 timestamp with a time zone: `2025-01-31T12:00:00Z`, `...T12:00:00.5+01:00`.
pub const TIMESTAMP_PATTERN: &str = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$";

/// A PostgreSQL LSN: `0/3000060`.
pub const LSN_PATTERN: &str = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$";

/// Quantity suffixes accepted for sizes (binary and decimal SI, no milli, no exponent).
const QUANTITY_SUFFIXES: &[&str] = &[
    "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E",
];

/// One cron field: the regular expression of its values, and its Rust twin.
struct CronField {
    name: &'static str,
    value_pattern: &'static str,
    min: u32,
    max: u32,
    /// Whether a leading zero is allowed on a one-digit value (`05`); `[0-7]` allows none.
    two_digits: bool,
}

const CRON_FIELDS: [CronField; 5] = [
    CronField {
        name: "minute",
        value_pattern: "[0-5]?[0-9]",
        min: 0,
        max: 59,
        two_digits: true,
    },
    CronField {
        name: "hour",
        value_pattern: "[01]?[0-9]|2[0-3]",
        min: 0,
        max: 23,
        two_digits: true,
    },
    CronField {
        name: "day of month",
        value_pattern: "0?[1-9]|[12][0-9]|3[01]",
        min: 1,
        max: 31,
        two_digits: true,
    },
    CronField {
        name: "month",
        value_pattern: "0?[1-9]|1[0-2]",
        min: 1,
        max: 12,
        two_digits: true,
    },
    CronField {
        name: "day of week",
        value_pattern: "[0-7]",
        min: 0,
        max: 7,
        two_digits: false,
    },
];

/// A step: `/1` to `/99`.
const CRON_STEP_PATTERN: &str = "/[1-9][0-9]?";

/// A five-field cron expression, fields separated by single spaces. Each field is a
/// comma-separated list of `*`, `N` or `N-M`, each optionally followed by a step `/S`;
/// numbers only (no month or weekday names, no `@daily` macros).
pub fn cron_pattern() -> String {
    let fields: Vec<String> = CRON_FIELDS
        .iter()
        .map(|f| {
            let v = format!("({})", f.value_pattern);
            let item = format!(r"(\*|{v}(-{v})?)({CRON_STEP_PATTERN})?");
            format!("{item}(,{item})*")
        })
        .collect();
    format!("^{}$", fields.join(" "))
}

/// Whether `s` matches [`QUANTITY_PATTERN`].
pub fn is_quantity(s: &str) -> bool {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if !QUANTITY_SUFFIXES.contains(&suffix) {
        return false;
    }
    let (int, frac) = match number.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (number, None),
    };
    let all_digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) {
        return false;
    }
    match frac {
        Some(frac) if !all_digits(frac) => false,
        _ if !int.starts_with('0') => true,
        // `0.<digits with a non-zero one>`: positive and without a leading zero.
        Some(frac) => int == "0" && frac.bytes().any(|b| b != b'0'),
        None => false,
    }
}

fn is_alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// Whether `s` matches [`DNS_SUBDOMAIN_PATTERN`] (the length limit is separate).
pub fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let b = label.as_bytes();
        match (b.first(), b.last()) {
            (Some(&first), Some(&last)) => {
                is_alnum_lower(first)
                    && is_alnum_lower(last)
                    && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
            }
            _ => false,
        }
    })
}

/// Whether `s` matches [`DNS_LABEL_PATTERN`] (the length limit is separate).
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(&last)) => {
            first.is_ascii_lowercase()
                && is_alnum_lower(last)
                && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
        }
        _ => false,
    }
}

/// Whether `s` matches [`SECRET_KEY_PATTERN`].
pub fn is_secret_key(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// Whether `s` matches [`HBA_LINE_PATTERN`].
pub fn is_hba_line(s: &str) -> bool {
    !s.is_empty() && !s.contains(['\r', '\n'])
}

/// Whether `s` matches [`BUCKET_PATTERN`].
pub fn is_bucket(s: &str) -> bool {
    let b = s.as_bytes();
    (3..=63).contains(&b.len())
        && b.first().is_some_and(|&c| is_alnum_lower(c))
        && b.last().is_some_and(|&c| is_alnum_lower(c))
        && b.iter()
            .all(|&c| is_alnum_lower(c) || c == b'.' || c == b'-')
}

/// Whether `s` matches [`URL_PATTERN`].
pub fn is_url(s: &str) -> bool {
    let Some(rest) = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
    else {
        return false;
    };
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    !host.is_empty()
        && !host.bytes().any(|b| b.is_ascii_whitespace())
        && !path.bytes().any(|b| b.is_ascii_whitespace())
}

/// Whether `s` matches [`IDENTIFIER_PATTERN`].
pub fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.first()
            .is_some_and(|&c| c.is_ascii_lowercase() || c == b'_')
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'_')
}

/// Whether `s` matches [`TIMEZONE_PATTERN`].
pub fn is_timezone(s: &str) -> bool {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'+'))
    };
    s.as_bytes().first().is_some_and(u8::is_ascii_alphabetic) && s.split('/').all(part_ok)
}

/// Whether `s` matches [`TIMESTAMP_PATTERN`].
pub fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    // Two digits at `at`, forming a number in `min..=max`.
    let num = |at: usize, min: u32, max: u32| -> bool {
        match (b.get(at), b.get(at + 1)) {
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let n = u32::from(x - b'0') * 10 + u32::from(y - b'0');
                (min..=max).contains(&n)
            }
            _ => false,
        }
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let date_time = b.len() >= 20
        && b[..4].iter().all(u8::is_ascii_digit)
        && at(4, b'-')
        && num(5, 1, 12)
        && at(7, b'-')
        && num(8, 1, 31)
        && at(10, b'T')
        && num(11, 0, 23)
        && at(13, b':')
        && num(14, 0, 59)
        && at(16, b':')
        && num(17, 0, 59);
    if !date_time {
        return false;
    }
    let mut i = 19;
    if at(i, b'.') {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return false;
        }
        i += 1 + digits;
    }
    match b.get(i) {
        Some(b'Z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            i + 6 == b.len() && num(i + 1, 0, 23) && at(i + 3, b':') && num(i + 4, 0, 59)
        }
        _ => false,
    }
}

/// Whether `s` matches [`LSN_PATTERN`].
pub fn is_lsn(s: &str) -> bool {
    let half = |p: &str| (1..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_hexdigit());
    s.split_once('/')
        .is_some_and(|(hi, lo)| half(hi) && half(lo))
}

/// Whether `s` matches [`cron_pattern`].
pub fn is_cron(s: &str) -> bool {
    let parts: Vec<&str> = s.split(' ').collect();
    parts.len() == CRON_FIELDS.len()
        && parts
            .iter()
            .zip(CRON_FIELDS.iter())
            .all(|(part, field)| is_cron_field(part, field))
}

/// Why `s` is not a valid cron expression, for error messages; `None` when it is valid.
pub fn cron_problem(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split(' ').collect();
    if parts.len() != CRON_FIELDS.len() {
        return Some(format!(
            "must have 5 fields separated by single spaces (minute hour day-of-month month \
             day-of-week), found {}",
            parts.len()
        ));
    }
    parts
        .iter()
        .zip(CRON_FIELDS.iter())
        .find(|(part, field)| !is_cron_field(part, field))
        .map(|(part, field)| {
            format!(
                "the {} field {part:?} is not `*`, a number from {} to {}, a range or a list of \
                 them, each with an optional step `/1`..`/99`",
                field.name, field.min, field.max
            )
        })
}

fn is_cron_field(s: &str, field: &CronField) -> bool {
    s.split(',').all(|item| is_cron_item(item, field))
}

fn is_cron_item(s: &str, field: &CronField) -> bool {
    let (base, step) = match s.split_once('/') {
        Some((base, step)) => (base, Some(step)),
        None => (s, None),
    };
    let step_ok = step.is_none_or(|step| {
        let b = step.as_bytes();
        (1..=2).contains(&b.len()) && b.iter().all(u8::is_ascii_digit) && b.first() != Some(&b'0')
    });
    let base_ok = base == "*"
        || match base.split_once('-') {
            Some((from, to)) => is_cron_value(from, field) && is_cron_value(to, field),
            None => is_cron_value(base, field),
        };
    step_ok && base_ok
}

fn is_cron_value(s: &str, field: &CronField) -> bool {
    let max_len = if field.two_digits { 2 } else { 1 };
    (1..=max_len).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_digit())
        && s.parse::<u32>()
            .is_ok_and(|n| (field.min..=field.max).contains(&n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        for good in ["1", "10Gi", "500M", "1.5Ti", "0.5Gi", "100k", "1E"] {
            assert!(is_quantity(good), "{good}");
        }
        for bad in [
            "", "0", "0Gi", "0.0", "00", "01Gi", "ten", "1.", ".5Gi", "1.5.1", "1e9", "100m",
            "10 Gi", "10gi", "-1Gi", "1Gib",
        ] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn cron_expressions() {
        for good in [
            "0 2 * * *",
            "*/15 * * * *",
            "0,30 8-18 * * 1-5",
            "59 23 31 12 7",
            "05 04 01 01 0",
            "0 0 1-31/2 * *",
        ] {
            assert!(is_cron(good), "{good}");
            assert_eq!(cron_problem(good), None);
        }
        for bad in [
            "",
            "0 2 * *",
            "0 2 * * * *",
            "0  2 * * *",
            " 0 2 * * *",
            "60 2 * * *",
            "0 24 * * *",
            "0 2 0 * *",
            "0 2 * 13 *",
            "0 2 * * 8",
            "0 2 * * 01",
            "*/0 * * * *",
            "*/100 * * * *",
            "0 2 * * MON",
            "@daily",
            "0 2 ? * *",
            "0,,1 2 * * *",
            "1- 2 * * *",
        ] {
            assert!(!is_cron(bad), "{bad}");
            assert!(cron_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn cron_pattern_is_anchored_and_has_five_fields() {
        let p = cron_pattern();
        assert!(p.starts_with('^') && p.ends_with('$'));
        assert_eq!(p.matches(' ').count(), 4);
    }

    #[test]
    fn names() {
        assert!(is_dns_subdomain("my-secret.v1"));
        assert!(is_dns_subdomain("a"));
        for bad in ["", "-a", "a-", "A", "a..b", "a_b", "a."] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        assert!(is_dns_label("main"));
        assert!(is_dns_label("pg-1"));
        for bad in ["", "1pg", "pg-", "pg.main", "Pg"] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_secret_key("AWS_ACCESS_KEY_ID"));
        assert!(is_secret_key("tls.crt"));
        assert!(!is_secret_key("a/b"));
        assert!(!is_secret_key(""));
        assert!(is_identifier("app"));
        assert!(is_identifier("_x1"));
        assert!(!is_identifier("1app"));
        assert!(!is_identifier("App"));
        assert!(!is_identifier(&"a".repeat(64)));
    }

    #[test]
    fn buckets_and_urls() {
        assert!(is_bucket("pg-backups.eu"));
        for bad in ["ab", "-abc", "abc-", "ABC", &"a".repeat(64)] {
            assert!(!is_bucket(bad), "{bad}");
        }
        assert!(is_url("https://minio.storage:9000"));
        assert!(is_url("http://127.0.0.1:9000/"));
        for bad in [
            "minio:9000",
            "https://",
            "https:///x",
            "ftp://x",
            "https://a b",
        ] {
            assert!(!is_url(bad), "{bad}");
        }
    }

    #[test]
    fn timezones() {
        for good in [
            "UTC",
            "Europe/Berlin",
            "America/Argentina/Buenos_Aires",
            "Etc/GMT+5",
        ] {
            assert!(is_timezone(good), "{good}");
        }
        for bad in [
            "",
            "/UTC",
            "Europe/",
            "Europe//Berlin",
            "1UTC",
            "Europe Berlin",
        ] {
            assert!(!is_timezone(bad), "{bad}");
        }
    }

    #[test]
    fn timestamps_and_lsns() {
        for good in [
            "2025-01-31T12:00:00Z",
            "2025-01-31T23:59:59.123456+01:00",
            "2025-12-01T00:00:00-05:30",
        ] {
            assert!(is_timestamp(good), "{good}");
        }
        for bad in [
            "2025-01-31",
            "2025-01-31 12:00:00Z",
            "2025-13-01T00:00:00Z",
            "2025-01-32T00:00:00Z",
            "2025-01-31T24:00:00Z",
            "2025-01-31T12:00:00",
            "2025-01-31T12:00:00.Z",
            "2025-01-31T12:00:00+1:00",
            "2025-01-31T12:00:00+01:00 ",
        ] {
            assert!(!is_timestamp(bad), "{bad}");
        }
        assert!(is_lsn("0/3000060"));
        assert!(is_lsn("FFFFFFFF/ffffffff"));
        for bad in ["", "0", "0/", "/1", "0/123456789", "g/1", "0/1/2"] {
            assert!(!is_lsn(bad), "{bad}");
        }
    }

    #[test]
    fn hba_lines() {
        assert!(is_hba_line("host all all 10.0.0.0/8 scram-sha-256"));
        assert!(!is_hba_line(""));
        assert!(!is_hba_line("host all all\nlocal all all trust"));
    }
}
