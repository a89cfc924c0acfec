//! When a certificate expires: the `notAfter` of its validity, read from its DER encoding
//! (RFC 5280, section 4.1). Only the fields before the validity are walked, by their tags
//! and lengths; nothing is verified here (a certificate's signature and chain are rustls's
//! business when it is used).

use crate::{Error, first_cert};

/// A DER element: its tag and its contents; `rest` follows it.
struct Element<'a> {
    tag: u8,
    contents: &'a [u8],
    rest: &'a [u8],
}

/// The element at the start of `der` (single-byte tags, definite lengths: all DER has).
fn element(der: &[u8]) -> Option<Element<'_>> {
    let (&tag, der) = der.split_first()?;
    let (&first, der) = der.split_first()?;
    let (len, der) = if first < 0x80 {
        (usize::from(first), der)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || der.len() < n {
            return None;
        }
        let (bytes, der) = der.split_at(n);
        let len = bytes
            .iter()
            .fold(0usize, |len, b| (len << 8) | usize::from(*b));
        (len, der)
    };
    if der.len() < len {
        return None;
    }
    let (contents, rest) = der.split_at(len);
    Some(Element {
        tag,
        contents,
        rest,
    })
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const VERSION: u8 = 0xa0; // [0] EXPLICIT
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The `notAfter` of a DER certificate, `None` when it is not one.
fn not_after_der(der: &[u8]) -> Option<jiff::Timestamp> {
    let certificate = element(der).filter(|e| e.tag == SEQUENCE)?;
    let tbs = element(certificate.contents).filter(|e| e.tag == SEQUENCE)?;
    let mut next = element(tbs.contents)?;
    if next.tag == VERSION {
        next = element(next.rest)?;
    }
    // serialNumber, then signature, issuer (both SEQUENCEs), then validity.
    let serial = Some(next).filter(|e| e.tag == INTEGER)?;
    let signature = element(serial.rest).filter(|e| e.tag == SEQUENCE)?;
    let issuer = element(signature.rest).filter(|e| e.tag == SEQUENCE)?;
    let validity = element(issuer.rest).filter(|e| e.tag == SEQUENCE)?;
    let not_before = element(validity.contents)?;
    let not_after = element(not_before.rest)?;
    time(not_after.tag, not_after.contents)
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950 to 2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`), as RFC 5280 has them: in UTC, with seconds, no fraction.
fn time(tag: u8, text: &[u8]) -> Option<jiff::Timestamp> {
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (year, rest) = match (tag, text.len()) {
        (UTC_TIME, 12) => {
            let yy: i16 = text[..2].parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        (GENERALIZED_TIME, 14) => (text[..4].parse().ok()?, &text[4..]),
        _ => return None,
    };
    let two = |i: usize| rest[i..i + 2].parse::<i8>().ok();
    let at =
        jiff::civil::DateTime::new(year, two(0)?, two(2)?, two(4)?, two(6)?, two(8)?, 0).ok()?;
    at.to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

/// When the first certificate in `pem` expires (its `notAfter`): the leaf of a chain as a
/// server sends it. `what` names it in the error.
pub fn not_after(pem: &str, what: &'static str) -> Result<jiff::Timestamp, Error> {
    let der = first_cert(pem, what)?;
    not_after_der(der.as_ref()).ok_or(Error::Validity { what })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Authority, Usage};

    #[test]
    fn the_expiry_of_issued_certificates_is_read_back() {
        let at: jiff::Timestamp = "2026-12-01T17:45:00Z".parse().expect("timestamp");
        let ca = Authority::generate_postgres(at).expect("authority");
        let server = ca
            .issue_postgres_server(&["db-rw".to_string()], at, 90)
            .expect("server certificate");
        assert_eq!(
            not_after(&server.cert_pem, "server certificate").expect("read"),
            server.not_after
        );
        assert_eq!(server.not_after.to_string(), "2027-03-01T00:00:00Z");
        let client = ca
            .issue_postgres_client("streaming_replica", at, 2)
            .expect("client certificate");
        assert_eq!(
            not_after(&client.cert_pem, "client").expect("read"),
            client.not_after
        );
        // A chain: the first certificate's (the leaf's).
        let manager_ca = Authority::generate(at).expect("authority");
        let manager = manager_ca
            .issue(Usage::ManagerServer, at, 30)
            .expect("manager certificate");
        let chain = format!("{}{}", manager.cert_pem, manager_ca.cert_pem());
        assert_eq!(not_after(&chain, "chain").expect("read"), manager.not_after);
        // An authority's: 3,650 days, three leap days among them.
        assert_eq!(
            not_after(manager_ca.cert_pem(), "authority")
                .expect("read")
                .to_string(),
            "2036-11-28T00:00:00Z"
        );
    }

    #[test]
    fn both_time_forms_of_rfc_5280() {
        let t = |tag, s: &str| time(tag, s.as_bytes()).map(|t| t.to_string());
        assert_eq!(
            t(UTC_TIME, "491231235959Z").as_deref(),
            Some("2049-12-31T23:59:59Z")
        );
        assert_eq!(
            t(UTC_TIME, "500101000000Z").as_deref(),
            Some("1950-01-01T00:00:00Z")
        );
        assert_eq!(
            t(GENERALIZED_TIME, "20500101000000Z").as_deref(),
            Some("2050-01-01T00:00:00Z")
        );
        for bad in [
            "4912312359Z",
            "491231235959",
            "49123123595aZ",
            "491331235959Z",
        ] {
            assert_eq!(t(UTC_TIME, bad), None, "{bad}");
        }
        assert_eq!(t(GENERALIZED_TIME, "491231235959Z"), None);
        assert_eq!(t(INTEGER, "491231235959Z"), None);
    }

    #[test]
    fn what_is_not_a_certificate_is_an_error() {
        let err = not_after("no PEM here", "server certificate").expect_err("no certificate");
        assert!(
            matches!(
                err,
                Error::NoCertificate {
                    what: "server certificate"
                }
            ),
            "{err:?}"
        );
        // A PEM certificate block holding something else.
        let junk = "-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n";
        let err = not_after(junk, "server certificate").expect_err("not a certificate");
        assert!(matches!(err, Error::Validity { .. }), "{err:?}");
        // Cut short anywhere, a certificate is refused, never read past its end.
        let at = jiff::Timestamp::now();
        let ca = Authority::generate(at).expect("authority");
        let der = crate::first_cert(ca.cert_pem(), "authority").expect("der");
        let der = der.as_ref();
        assert!(not_after_der(der).is_some());
        for len in 0..der.len() {
            assert_eq!(not_after_der(&der[..len]), None, "cut at {len}");
        }
    }
}
