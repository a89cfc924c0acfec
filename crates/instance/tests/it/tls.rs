//! What the TLS-only test servers share (the pooler's and the external cluster's).

/// The TLS of a test server as the operator gives it: its certificate, one authority for
/// the server and its clients, the replication user's client certificate, TLS only.
pub fn server_tls(
    ca: &str,
    server: &pgop_tls::Issued,
    replication: &pgop_tls::Issued,
    server_name: &str,
) -> pgop_instance::config::Tls {
    pgop_instance::config::Tls {
        server_cert: server.cert_pem.clone(),
        server_key: server.key_pem.clone(),
        server_ca: ca.to_string(),
        client_ca: ca.to_string(),
        replication_cert: replication.cert_pem.clone(),
        replication_key: replication.key_pem.clone(),
        server_name: server_name.to_string(),
        allow_plaintext: false,
    }
}
