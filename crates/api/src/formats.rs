//! String formats of the API: each one as a regular expression for the CRD schema
//! (`pattern`, evaluated by the API server with Go's RE2) and as a Rust function that
//! accepts exactly the same strings, for [`crate::validate`].
//!
//! The two sides of each pair must agree; `tests/crd_validation.rs` feeds a table of
//! samples to both the API server and these functions to prove it.
//!
//! Why this file stays whole: it is one idea, the API's string formats, each a pattern for
//! the schema and a Rust function that must accept exactly the same strings; about 340 of
//! its lines are the unit tests of those functions.

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

/// A key in a Secret's data: letters, digits, `-`, `_` and `.`, never `.` or `..` nor
/// starting with `..` (Kubernetes refuses those keys too).
pub const SECRET_KEY_PATTERN: &str =
    r"^([-_a-zA-Z0-9][-._a-zA-Z0-9]*|\.[-_a-zA-Z0-9][-._a-zA-Z0-9]*)$";

/// One pg_hba.conf rule on one line: a connection type pgop can serve (`local`, `host`,
/// `hostssl`, `hostnossl`, `hostnogssenc`; `hostgssenc` needs GSSAPI, which pgop does not
/// run), its fields (`local`: database and user; the others: database, user and address,
/// or address and mask), an authentication method, then `name=value` options. `cert`
/// (a client certificate) only with `hostssl`, as PostgreSQL requires. A field is either
/// plain (`[-A-Za-z0-9_.,/:+*^$]`) or one double-quoted string; no `@file` inclusion, no
/// `#` comment, no control character.
pub const HBA_LINE_PATTERN: &str = concat!(
    r#"^[ \t]*(local([ \t]+([-A-Za-z0-9_.,/:+*^$]+|"[^"\x00-\x1f\x7f]*")){2}"#,
    r"[ \t]+(trust|reject|scram-sha-256|md5|password|peer|ident|ldap|radius|pam|gss)",
    r#"|(host|hostssl|hostnossl|hostnogssenc)([ \t]+([-A-Za-z0-9_.,/:+*^$]+|"[^"\x00-\x1f\x7f]*")){3,4}"#,
    r"[ \t]+(trust|reject|scram-sha-256|md5|password|peer|ident|ldap|radius|pam|gss)",
    r#"|hostssl([ \t]+([-A-Za-z0-9_.,/:+*^$]+|"[^"\x00-\x1f\x7f]*")){3,4}[ \t]+cert)"#,
    r#"([ \t]+[a-z_]+=("[^"\x00-\x1f\x7f]*"|[!$-~]+))*[ \t]*$"#
);

/// The connection types [`HBA_LINE_PATTERN`] accepts, with how many fields may follow each.
const HBA_TYPES: &[(&str, usize, usize)] = &[
    ("local", 2, 2),
    ("host", 3, 4),
    ("hostssl", 3, 4),
    ("hostnossl", 3, 4),
    ("hostnogssenc", 3, 4),
];

/// The authentication methods [`HBA_LINE_PATTERN`] accepts.
const HBA_METHODS: &[&str] = &[
    "trust",
    "reject",
    "scram-sha-256",
    "md5",
    "password",
    "peer",
    "ident",
    "ldap",
    "radius",
    "pam",
    "gss",
];

/// Longest pg_hba.conf line accepted.
pub const MAX_HBA_LINE_LENGTH: usize = 1024;

/// An S3 bucket name: 3 to 63 characters, dot-separated labels of lower-case letters,
/// digits and `-`, each starting and ending with a letter or digit (so no `..`).
pub const BUCKET_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// An http or https URL of a server: a host name, an IPv4 address or a bracketed IPv6
/// address, an optional port, an optional final `/`; no user, path, query or fragment.
pub const URL_PATTERN: &str = concat!(
    r"^https?://([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*",
    r"|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?/?$"
);

/// An S3 region: letters, digits, `-` and `_`, starting and ending with a letter or digit
/// (`eu-central-1`, `garage`), at most 63 characters.
pub const REGION_PATTERN: &str = r"^[A-Za-z0-9]([-_A-Za-z0-9]*[A-Za-z0-9])?$";

/// A key prefix in a bucket: relative, `/`-separated segments of letters, digits, `.`,
/// `_` and `-`, each starting with a letter, digit, `_` or `-` (so never `.` or `..`); no
/// leading, trailing or double `/`. At most 256 characters.
pub const STORE_PATH_PATTERN: &str =
    r"^[-_A-Za-z0-9][-_.A-Za-z0-9]*(/[-_A-Za-z0-9][-_.A-Za-z0-9]*)*$";

/// A PostgreSQL parameter name: an identifier, or two joined by one `.` (a custom or
/// extension parameter such as `pg_stat_statements.max`), ASCII only.
pub const PARAMETER_NAME_PATTERN: &str = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$";

/// A PostgreSQL parameter value: one line, without NUL or any other control character.
pub const PARAMETER_VALUE_PATTERN: &str = r"^[^\x00-\x1f\x7f]*$";

/// Longest parameter name accepted.
pub const MAX_PARAMETER_NAME_LENGTH: usize = 127;
/// Longest parameter value accepted, in characters.
pub const MAX_PARAMETER_VALUE_LENGTH: usize = 4096;

/// A container image reference, as the OCI distribution grammar has it:
/// `[registry[:port]/]path[:tag][@algorithm:hex]`, e.g. `registry.example.com:5000/pgop:0.2.0`.
pub const IMAGE_PATTERN: &str = concat!(
    r"^(([A-Za-z0-9]|[A-Za-z0-9][-A-Za-z0-9]*[A-Za-z0-9])(\.([A-Za-z0-9]|[A-Za-z0-9][-A-Za-z0-9]*[A-Za-z0-9]))*",
    r"(:[0-9]+)?/)?",
    r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*",
    r"(:[A-Za-z0-9_][-.A-Za-z0-9_]{0,127})?",
    r"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?$"
);

/// Longest image reference accepted.
pub const MAX_IMAGE_LENGTH: usize = 512;

/// An unquoted PostgreSQL identifier in lower case, at most 63 bytes.
pub const IDENTIFIER_PATTERN: &str = r"^[a-z_][a-z0-9_]{0,62}$";

/// A PostgreSQL extension's name: lower-case letters, digits, `_` and `-`, starting with a
/// letter or `_` (`pgcrypto`, `pg_trgm`, `uuid-ossp`), at most 63 bytes.
pub const EXTENSION_NAME_PATTERN: &str = r"^[a-z_][a-z0-9_-]{0,62}$";

/// An extension version: letters, digits, `.`, `_` and `-`, starting with a letter or
/// digit (`1.3`, `2.5.0`, `1.0beta1`), at most 64 characters.
pub const EXTENSION_VERSION_PATTERN: &str = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$";

/// A character-set encoding's name (`UTF8`, `LATIN1`, `SQL_ASCII`, `EUC_JP`): a letter,
/// then letters, digits and `_`, at most 32 characters.
pub const ENCODING_PATTERN: &str = r"^[A-Za-z][A-Za-z0-9_]{0,31}$";

/// A locale's name (`C`, `POSIX`, `C.UTF-8`, `en_US.UTF-8`, `sr_RS@latin`): a letter or
/// digit, then letters, digits, `_`, `.`, `@` and `-`, at most 64 characters.
pub const LOCALE_PATTERN: &str = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$";

/// The shape of an IANA time zone name (`UTC`, `Europe/Berlin`, `Etc/GMT+5`). Whether the
/// zone exists is checked where the schedule is evaluated.
pub const TIMEZONE_PATTERN: &str = r"^[A-Za-z][-A-Za-z0-9_+]*(/[-A-Za-z0-9_+]+)*$";

/// An RFC 3339 timestamp with a time zone: `2025-01-31T12:00:00Z`, `...T12:00:00.5+01:00`.
/// The schema adds `format: date-time`, so that the day must exist in its month.
pub const TIMESTAMP_PATTERN: &str = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$";

/// A PostgreSQL LSN: `0/3000060`.
pub const LSN_PATTERN: &str = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$";

/// A Kubernetes label key (a qualified name): an optional prefix, an RFC 1123 subdomain of
/// at most [`MAX_LABEL_KEY_PREFIX_LENGTH`] characters followed by `/`, then a name of 1 to
/// 63 letters, digits, `-`, `_` and `.` that starts and ends with a letter or digit
/// (`kubernetes.io/hostname`, `topology.kubernetes.io/zone`, `disktype`). The prefix's
/// length is a separate rule (a CEL rule in the CRD).
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// Longest prefix of a label key (before the `/`).
pub const MAX_LABEL_KEY_PREFIX_LENGTH: usize = 253;
/// Longest label key: a prefix, `/` and a name of 63.
pub const MAX_LABEL_KEY_LENGTH: usize = MAX_LABEL_KEY_PREFIX_LENGTH + 1 + 63;

/// A Kubernetes label value: empty, or 1 to 63 letters, digits, `-`, `_` and `.` that
/// start and end with a letter or digit.
pub const LABEL_VALUE_PATTERN: &str = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$";
/// Longest label value.
pub const MAX_LABEL_VALUE_LENGTH: usize = 63;

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
        && s != "."
        && !s.starts_with("..")
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// Whether `s` matches [`HBA_LINE_PATTERN`] (the length limit is separate).
pub fn is_hba_line(s: &str) -> bool {
    let tokens = hba_tokens(s.trim_matches([' ', '\t']));
    let Some((kind, rest)) = tokens.split_first() else {
        return false;
    };
    let Some(&(_, min, max)) = HBA_TYPES.iter().find(|(k, _, _)| k == kind) else {
        return false;
    };
    // The fields, the method, then options: options hold a `=`, which fields and methods
    // never do, so the method's place is the only freedom.
    (min..=max).any(|fields| {
        rest.len() > fields
            && rest[..fields].iter().all(|t| is_hba_field(t))
            && (HBA_METHODS.contains(&rest[fields])
                || (*kind == "hostssl" && rest[fields] == "cert"))
            && rest[fields + 1..].iter().all(|t| is_hba_option(t))
    })
}

/// Splits a pg_hba.conf line at runs of spaces and tabs outside double quotes.
fn hba_tokens(s: &str) -> Vec<&str> {
    let mut tokens = Vec::new();
    let mut start = None;
    let mut quoted = false;
    for (i, c) in s.char_indices() {
        let blank = (c == ' ' || c == '\t') && !quoted;
        if c == '"' {
            quoted = !quoted;
        }
        match (blank, start) {
            (true, Some(from)) => {
                tokens.push(&s[from..i]);
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(from) = start {
        tokens.push(&s[from..]);
    }
    tokens
}

/// A double-quoted string without quotes or control characters inside.
fn is_hba_quoted(s: &str) -> bool {
    s.len() >= 2
        && s.starts_with('"')
        && s.ends_with('"')
        && !s[1..s.len() - 1].chars().any(|c| c == '"' || is_control(c))
}

fn is_hba_field(s: &str) -> bool {
    is_hba_quoted(s)
        || (!s.is_empty()
            && s.bytes().all(|b| {
                b.is_ascii_alphanumeric()
                    || matches!(
                        b,
                        b'-' | b'_' | b'.' | b',' | b'/' | b':' | b'+' | b'*' | b'^' | b'$'
                    )
            }))
}

fn is_hba_option(s: &str) -> bool {
    let Some((name, value)) = s.split_once('=') else {
        return false;
    };
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        && (is_hba_quoted(value)
            || (!value.is_empty()
                && value
                    .bytes()
                    .all(|b| b == b'!' || (b'$'..=b'~').contains(&b))))
}

/// An ASCII control character (C0 or DEL), as `[\x00-\x1f\x7f]` in the patterns.
fn is_control(c: char) -> bool {
    c < ' ' || c == '\x7f'
}

/// Whether `s` matches [`BUCKET_PATTERN`] and is 3 to 63 characters long.
pub fn is_bucket(s: &str) -> bool {
    (3..=63).contains(&s.len()) && is_dns_subdomain(s)
}

/// A host name: dot-separated labels of letters, digits and `-`, each starting and ending
/// with a letter or digit.
fn is_host_name(s: &str, allow_upper: bool) -> bool {
    s.split('.').all(|label| {
        let b = label.as_bytes();
        let ok = |c: u8| {
            c.is_ascii_digit() || c.is_ascii_lowercase() || (allow_upper && c.is_ascii_uppercase())
        };
        match (b.first(), b.last()) {
            (Some(&first), Some(&last)) => {
                ok(first) && ok(last) && b.iter().all(|&c| ok(c) || c == b'-')
            }
            _ => false,
        }
    })
}

fn is_digits(s: &str, min: usize, max: usize) -> bool {
    (min..=max).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `s` matches [`URL_PATTERN`].
pub fn is_url(s: &str) -> bool {
    let Some(rest) = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
    else {
        return false;
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host_ok, port) = match rest.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, port)) => (
                !addr.is_empty()
                    && addr
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.'),
                port,
            ),
            None => (false, ""),
        },
        None => {
            let (host, port) = rest.split_at(rest.find(':').unwrap_or(rest.len()));
            (is_host_name(host, true), port)
        }
    };
    host_ok && (port.is_empty() || port.strip_prefix(':').is_some_and(|p| is_digits(p, 1, 5)))
}

/// Whether `s` matches [`REGION_PATTERN`] and is at most 63 characters long.
pub fn is_region(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

/// Whether `s` matches [`STORE_PATH_PATTERN`] and is at most 256 characters long.
pub fn is_store_path(s: &str) -> bool {
    s.len() <= 256
        && s.split('/').all(|segment| {
            let b = segment.as_bytes();
            b.first()
                .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
                && b.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
        })
}

/// Whether `s` matches [`PARAMETER_NAME_PATTERN`] and is at most
/// [`MAX_PARAMETER_NAME_LENGTH`] long.
pub fn is_parameter_name(s: &str) -> bool {
    let ident = |p: &str| {
        let b = p.as_bytes();
        b.first()
            .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_')
            && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
    };
    s.len() <= MAX_PARAMETER_NAME_LENGTH
        && match s.split_once('.') {
            Some((a, b)) => ident(a) && ident(b),
            None => ident(s),
        }
}

/// Whether `s` matches [`PARAMETER_VALUE_PATTERN`] and is at most
/// [`MAX_PARAMETER_VALUE_LENGTH`] characters long.
pub fn is_parameter_value(s: &str) -> bool {
    !s.chars().any(is_control) && s.chars().count() <= MAX_PARAMETER_VALUE_LENGTH
}

/// Whether `s` matches [`IMAGE_PATTERN`] and is at most [`MAX_IMAGE_LENGTH`] long.
pub fn is_image(s: &str) -> bool {
    if s.len() > MAX_IMAGE_LENGTH {
        return false;
    }
    let (name_tag, digest) = match s.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (s, None),
    };
    if digest.is_some_and(|d| !is_image_digest(d)) {
        return false;
    }
    // The tag follows the last ':' when no '/' comes after it; a registry's port is the
    // other reading of a ':', so both are tried.
    let tagged = name_tag
        .rsplit_once(':')
        .is_some_and(|(name, tag)| !tag.contains('/') && is_image_tag(tag) && is_image_name(name));
    tagged || is_image_name(name_tag)
}

fn is_image_name(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    let all_paths = |ps: &[&str]| !ps.is_empty() && ps.iter().all(|p| is_image_path_component(p));
    all_paths(&parts) || (parts.len() >= 2 && is_image_registry(parts[0]) && all_paths(&parts[1..]))
}

fn is_image_registry(s: &str) -> bool {
    let (host, port) = match s.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    is_host_name(host, true) && port.is_none_or(|p| is_digits(p, 1, usize::MAX))
}

/// `[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*`.
fn is_image_path_component(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !(b.first().is_some_and(|&c| alnum(c)) && b.last().is_some_and(|&c| alnum(c))) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &s[start..i];
        let ok = matches!(sep, "." | "_" | "__") || sep.bytes().all(|c| c == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `[A-Za-z0-9_][-.A-Za-z0-9_]{0,127}`.
fn is_image_tag(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=128).contains(&b.len())
        && b.first()
            .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_')
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// `[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}`.
fn is_image_digest(s: &str) -> bool {
    let Some((algorithm, hex)) = s.split_once(':') else {
        return false;
    };
    let component = |p: &str| {
        let b = p.as_bytes();
        b.first().is_some_and(u8::is_ascii_alphabetic) && b.iter().all(u8::is_ascii_alphanumeric)
    };
    hex.len() >= 32
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && algorithm.split(['-', '_', '+', '.']).all(component)
}

/// Whether `s` matches [`IDENTIFIER_PATTERN`].
pub fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.first()
            .is_some_and(|&c| c.is_ascii_lowercase() || c == b'_')
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'_')
}

/// Whether `s` matches [`EXTENSION_NAME_PATTERN`].
pub fn is_extension_name(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.first()
            .is_some_and(|&c| c.is_ascii_lowercase() || c == b'_')
        && b.iter()
            .all(|&c| is_alnum_lower(c) || c == b'_' || c == b'-')
}

/// Whether `s` matches [`EXTENSION_VERSION_PATTERN`].
pub fn is_extension_version(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=64).contains(&b.len())
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// Whether `s` matches [`ENCODING_PATTERN`].
pub fn is_encoding(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=32).contains(&b.len())
        && b.first().is_some_and(u8::is_ascii_alphabetic)
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Whether `s` matches [`LOCALE_PATTERN`].
pub fn is_locale(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=64).contains(&b.len())
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'@' | b'-'))
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
    // The day must exist in its month (Go's time.Parse, behind the schema's
    // `format: date-time`, refuses 2026-02-30 as well).
    let year: u32 = s.get(..4).and_then(|y| y.parse().ok()).unwrap_or(0);
    let month = s.get(5..7).and_then(|m| m.parse().ok()).unwrap_or(0);
    let day: u32 = s.get(8..10).and_then(|d| d.parse().ok()).unwrap_or(0);
    if !date_time || day > days_in_month(year, month) {
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

/// Days in a month of the proleptic Gregorian calendar.
fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Whether `s` matches [`LSN_PATTERN`].
pub fn is_lsn(s: &str) -> bool {
    let half = |p: &str| (1..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_hexdigit());
    s.split_once('/')
        .is_some_and(|(hi, lo)| half(hi) && half(lo))
}

/// Whether `s` matches [`LABEL_VALUE_PATTERN`] (which bounds its length to 63).
pub fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.is_empty()
        || (b.len() <= MAX_LABEL_VALUE_LENGTH
            && b.first().is_some_and(u8::is_ascii_alphanumeric)
            && b.last().is_some_and(u8::is_ascii_alphanumeric)
            && b.iter()
                .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
}

/// Whether `s` matches [`LABEL_KEY_PATTERN`] with a prefix of at most
/// [`MAX_LABEL_KEY_PREFIX_LENGTH`] characters: a label key Kubernetes accepts.
pub fn is_label_key(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty() && p.len() <= MAX_LABEL_KEY_PREFIX_LENGTH && is_dns_subdomain(p)
    });
    prefix_ok && !name.is_empty() && is_label_value(name)
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
        assert!(is_secret_key(".x"));
        for bad in [".", "..", "..x"] {
            assert!(!is_secret_key(bad), "{bad}");
        }
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
        assert!(is_url("http://[::1]:9000"));
        for bad in [
            "minio:9000",
            "https://",
            "https:///x",
            "ftp://x",
            "https://a b",
            "https://s3.example.com/a/b",
            "https://user@host",
            "https://host:123456",
            "https://host/$(id)",
            "https://host?x=1",
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
        for good in [
            "host all all 10.0.0.0/8 scram-sha-256",
            "local all all peer",
            "  host\tapp,shop +admins 10.0.0.0 255.0.0.0 md5  ",
            "host \"my db\" \"Ünïcode\" ::1/128 scram-sha-256",
            "host all all all ldap ldapserver=ldap.example.com ldapprefix=\"cn=\" ldapsuffix=\", dc=example\"",
            "hostnossl all all samenet reject",
            "hostssl all all 10.0.0.0/8 scram-sha-256",
            "hostssl all app all cert clientname=CN",
        ] {
            assert!(is_hba_line(good), "{good}");
        }
        for bad in [
            "",
            "host all all\nlocal all all trust",
            "host all all 10.0.0.0/8 cert",
            "hostnossl all all all cert",
            "local all all cert",
            "hostgssenc all all all gss",
            "host all all 10.0.0.0/8 scram-sha-256 # comment",
            "host @dbs all 10.0.0.0/8 md5",
            "include /etc/passwd",
            "host all all md5",
            "host all all a b c d md5",
            "host all all all trust\u{0}",
            "host a\"b all all md5",
            "host \"unterminated all all md5",
            "host all all all md5 Map=x",
            "local all all peer map",
        ] {
            assert!(!is_hba_line(bad), "{bad}");
        }
    }

    #[test]
    fn parameter_names_and_values() {
        for good in [
            "work_mem",
            "Work_Mem",
            "_x",
            "pg_stat_statements.max",
            "a1.b_2",
        ] {
            assert!(is_parameter_name(good), "{good}");
        }
        for bad in [
            "",
            "1x",
            "a.b.c",
            "a.",
            ".a",
            "a b",
            "a=b",
            "a#b",
            "pgop.x = 'y'\narchive_cleanup_command",
            "wоrk_mem",
            &"a".repeat(128),
        ] {
            assert!(!is_parameter_name(bad), "{bad:?}");
        }
        assert!(is_parameter_value("'\"$user\", public'"));
        assert!(is_parameter_value(""));
        assert!(is_parameter_value(&"é".repeat(MAX_PARAMETER_VALUE_LENGTH)));
        for bad in ["a\nb", "a\rb", "a\u{0}b", "a\tb", "\u{7f}"] {
            assert!(!is_parameter_value(bad), "{bad:?}");
        }
        assert!(!is_parameter_value(
            &"a".repeat(MAX_PARAMETER_VALUE_LENGTH + 1)
        ));
    }

    #[test]
    fn images() {
        for good in [
            "pgop",
            "pgop:0.1.0",
            "library/postgres:15",
            "registry.example.com:5000/team/pgop:v1.2_3",
            "localhost/pgop@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "Registry.Example.COM/a__b/c-d---e.f:TAG",
        ] {
            assert!(is_image(good), "{good}");
        }
        for bad in [
            "",
            "pgop:1; rm -rf /",
            "pgop :1",
            "PGOP",
            "pgop:",
            "/pgop",
            "pgop/",
            "a..b",
            "a___b",
            "pgop@sha256:short",
            "pgop:$(id)",
            "reg:port/pgop",
        ] {
            assert!(!is_image(bad), "{bad}");
        }
    }

    #[test]
    fn store_paths_and_regions() {
        for good in ["clusters/prod", "a", "x.y/_z-1", "a..b"] {
            assert!(is_store_path(good), "{good}");
        }
        for bad in [
            "", "/abs", "a/", "a//b", "..", "../x", "a/../b", ".", "a/./b", "a b", "a\nb",
        ] {
            assert!(!is_store_path(bad), "{bad:?}");
        }
        for good in ["eu-central-1", "garage", "us_east"] {
            assert!(is_region(good), "{good}");
        }
        for bad in ["", "-x", "x-", "eu central", "eu$(id)"] {
            assert!(!is_region(bad), "{bad}");
        }
    }

    #[test]
    fn label_keys_and_values() {
        for good in [
            "kubernetes.io/hostname",
            "topology.kubernetes.io/zone",
            "disktype",
            "a",
            "A_b.c-D",
            "example.com/Some.Name_1",
            &format!("{}/{}", "a".repeat(253), "b".repeat(63)),
        ] {
            assert!(is_label_key(good), "{good}");
        }
        for bad in [
            "",
            "/",
            "/name",
            "prefix/",
            "a/b/c",
            "Example.com/name",
            "a..b/name",
            "-a",
            "a-",
            ".a",
            "a b",
            "a\nb",
            "kubernetes.io/hostname\n",
            "a\"b",
            "a'b",
            "..",
            "$(id)",
            "a$(id)",
            &"a".repeat(64),
            &format!("{}/b", "a".repeat(254)),
            "h\u{43e}stname",
        ] {
            assert!(!is_label_key(bad), "{bad:?}");
        }
        for good in ["", "true", "a", "ssd_1.x-Y"] {
            assert!(is_label_value(good), "{good}");
        }
        for bad in ["-", "a-", "a/b", "a b", "a\nb", &"a".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn days_must_exist_in_their_month() {
        assert!(is_timestamp("2024-02-29T00:00:00Z"));
        assert!(is_timestamp("2000-02-29T00:00:00Z"));
        assert!(!is_timestamp("2026-02-29T00:00:00Z"));
        assert!(!is_timestamp("1900-02-29T00:00:00Z"));
        assert!(!is_timestamp("2026-02-30T00:00:00Z"));
        assert!(!is_timestamp("2026-04-31T00:00:00Z"));
    }
}
