//! Real TLS 1.3 handshakes between the two configurations, in memory.

use super::*;
use rustls::{ClientConnection, ServerConnection};

fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

/// Runs the handshake to its end; the first error either side raises.
fn handshake(client: Arc<ClientConfig>, server: Arc<ServerConfig>) -> Result<(), rustls::Error> {
    let mut c = ClientConnection::new(client, manager_server_name())?;
    let mut s = ServerConnection::new(server)?;
    for _ in 0..20 {
        let mut to_server = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut to_server)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        }
        let mut slice = to_server.as_slice();
        while !slice.is_empty() {
            s.read_tls(&mut slice)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        }
        s.process_new_packets()?;
        let mut to_client = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut to_client)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        }
        let mut slice = to_client.as_slice();
        while !slice.is_empty() {
            c.read_tls(&mut slice)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        }
        c.process_new_packets()?;
        if !c.is_handshaking() && !s.is_handshaking() && !c.wants_write() {
            return Ok(());
        }
    }
    Err(rustls::Error::General(
        "the handshake did not finish".into(),
    ))
}

fn manager(ca: &Authority) -> Arc<ServerConfig> {
    let m = ca
        .issue(Usage::ManagerServer, now(), 90)
        .expect("manager cert");
    server_config(&m.cert_pem, &m.key_pem, ca.cert_pem()).expect("server config")
}

fn operator(ca: &Authority) -> Arc<ClientConfig> {
    let o = ca
        .issue(Usage::OperatorClient, now(), 2)
        .expect("operator cert");
    client_config(ca.cert_pem(), &o.cert_pem, &o.key_pem).expect("client config")
}

#[test]
fn the_operator_and_a_manager_of_one_authority_shake_hands() {
    let ca = Authority::generate(now()).expect("authority");
    handshake(operator(&ca), manager(&ca)).expect("handshake");
}

#[test]
fn an_authority_read_back_from_its_secret_signs_certificates_that_chain_to_it() {
    let ca = Authority::generate(now()).expect("authority");
    let again = Authority::from_pem(ca.cert_pem(), ca.key_pem()).expect("read back");
    // The manager's certificate from the original, the operator's from the copy, and the
    // reverse: both chain to the one certificate in ca.crt.
    handshake(operator(&again), manager(&ca)).expect("copy → original");
    handshake(operator(&ca), manager(&again)).expect("original → copy");
}

#[test]
fn a_client_without_a_certificate_is_refused() {
    let ca = Authority::generate(now()).expect("authority");
    let anonymous = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .with_root_certificates(roots(ca.cert_pem()).expect("roots"))
        .with_no_client_auth();
    let err = handshake(Arc::new(anonymous), manager(&ca)).expect_err("refused");
    assert!(
        matches!(err, rustls::Error::NoCertificatesPresented),
        "{err:?}"
    );
}

#[test]
fn another_clusters_operator_certificate_is_refused() {
    let ca = Authority::generate(now()).expect("authority");
    let other = Authority::generate(now()).expect("other authority");
    let o = other.issue(Usage::OperatorClient, now(), 2).expect("cert");
    // It trusts this cluster's authority for the server, but presents the other's cert.
    let client = client_config(ca.cert_pem(), &o.cert_pem, &o.key_pem).expect("config");
    let err = handshake(client, manager(&ca)).expect_err("refused");
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
}

#[test]
fn a_managers_own_certificate_cannot_act_as_the_operator() {
    let ca = Authority::generate(now()).expect("authority");
    let m = ca.issue(Usage::ManagerServer, now(), 90).expect("cert");
    let client = client_config(ca.cert_pem(), &m.cert_pem, &m.key_pem).expect("config");
    let err = handshake(client, manager(&ca)).expect_err("refused");
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
}

#[test]
fn the_operators_certificate_cannot_serve_as_a_manager() {
    let ca = Authority::generate(now()).expect("authority");
    let o = ca.issue(Usage::OperatorClient, now(), 2).expect("cert");
    let server = server_config(&o.cert_pem, &o.key_pem, ca.cert_pem()).expect("config");
    let err = handshake(operator(&ca), server).expect_err("refused");
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
}

#[test]
fn a_manager_of_another_authority_is_not_trusted() {
    let ca = Authority::generate(now()).expect("authority");
    let other = Authority::generate(now()).expect("other authority");
    let err = handshake(operator(&ca), manager(&other)).expect_err("refused");
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
}

#[test]
fn an_expired_manager_certificate_is_refused() {
    let ca = Authority::generate(now()).expect("authority");
    let long_ago = now()
        .checked_sub(jiff::SignedDuration::from_hours(24 * 30))
        .expect("a month ago");
    let m = ca
        .issue(Usage::ManagerServer, long_ago, 10)
        .expect("expired cert");
    assert!(m.not_after < now());
    let server = server_config(&m.cert_pem, &m.key_pem, ca.cert_pem()).expect("config");
    let err = handshake(operator(&ca), server).expect_err("refused");
    assert!(
        matches!(
            err,
            rustls::Error::InvalidCertificate(rustls::CertificateError::Expired)
                | rustls::Error::InvalidCertificate(
                    rustls::CertificateError::ExpiredContext { .. }
                )
        ),
        "{err:?}"
    );
}

#[test]
fn validity_ends_at_midnight_utc_days_ahead() {
    let at: jiff::Timestamp = "2026-12-01T17:45:00Z".parse().expect("timestamp");
    let ca = Authority::generate(at).expect("authority");
    let m = ca.issue(Usage::ManagerServer, at, 90).expect("cert");
    assert_eq!(m.not_after.to_string(), "2027-03-01T00:00:00Z");
}

#[test]
fn bad_pem_and_keys_are_errors_that_say_which() {
    let ca = Authority::generate(now()).expect("authority");
    let err = Authority::from_pem("not pem", ca.key_pem()).expect_err("bad cert");
    assert!(err.to_string().contains("authority certificate"), "{err}");
    let err = Authority::from_pem(ca.cert_pem(), "not a key").expect_err("bad key");
    assert!(err.to_string().contains("key"), "{err}");
    let err = server_config(ca.cert_pem(), "", ca.cert_pem()).expect_err("no key");
    assert!(err.to_string().contains("manager key"), "{err}");
    // The authority's Debug never shows its key.
    assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
    assert_eq!(manager_server_name().to_str(), MANAGER_SERVER_NAME);
}

#[test]
fn a_brought_server_certificate_must_match_its_key_verify_and_carry_the_name() {
    use crate::postgres::{CheckError, check_server_certificate};
    let ca = Authority::generate_postgres(now()).expect("authority");
    let names = ["db-rw".to_string(), "db-rw.ns.svc".to_string()];
    let good = ca
        .issue_postgres_server(&names, now(), 30)
        .expect("certificate");
    check_server_certificate(&good.cert_pem, &good.key_pem, ca.cert_pem(), "db-rw")
        .expect("a good certificate");
    let other = ca
        .issue_postgres_server(&names, now(), 30)
        .expect("certificate");
    assert!(matches!(
        check_server_certificate(&good.cert_pem, &other.key_pem, ca.cert_pem(), "db-rw"),
        Err(CheckError::Key(_))
    ));
    assert!(matches!(
        check_server_certificate(&good.cert_pem, &good.key_pem, ca.cert_pem(), "other-rw"),
        Err(CheckError::Verify { .. })
    ));
    let stranger = Authority::generate_postgres(now()).expect("authority");
    assert!(matches!(
        check_server_certificate(&good.cert_pem, &good.key_pem, stranger.cert_pem(), "db-rw"),
        Err(CheckError::Verify { .. })
    ));
    let client = ca
        .issue_postgres_client("db-rw", now(), 30)
        .expect("certificate");
    assert!(
        check_server_certificate(&client.cert_pem, &client.key_pem, ca.cert_pem(), "db-rw")
            .is_err(),
        "a client certificate cannot serve"
    );
    assert!(matches!(
        check_server_certificate("junk", &good.key_pem, ca.cert_pem(), "db-rw"),
        Err(CheckError::Read(_))
    ));
}
