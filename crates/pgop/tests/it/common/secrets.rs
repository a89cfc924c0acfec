//! The Secret fixtures of the tests that play the operator's part: a Secret of string
//! data (`secret`) and PostgreSQL's TLS Secrets as the operator makes them
//! (`postgres_tls_secrets`).

use k8s_openapi::api::core::v1::Secret;

/// A Secret `name` with `data` as its string data.
pub fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "stringData": data}))
        .expect("a Secret")
}

/// PostgreSQL's certificates for cluster `cluster`, as the operator makes them: the
/// authority's certificate (PEM) and the Secrets `<cluster>-server-tls` and
/// `<cluster>-replication-tls`, for tests that play the operator's part.
pub fn postgres_tls_secrets(cluster: &str) -> (String, [Secret; 2]) {
    let now = jiff::Timestamp::now();
    let ca = pgop_tls::Authority::generate_postgres(now).expect("an authority");
    let server = ca
        .issue_postgres_server(&[format!("{cluster}-rw")], now, 1)
        .expect("a server certificate");
    let replication = ca
        .issue_postgres_client("streaming_replica", now, 1)
        .expect("a client certificate");
    let tls = |name: String, issued: &pgop_tls::Issued| {
        secret(
            &name,
            &[
                ("tls.crt", &issued.cert_pem),
                ("tls.key", &issued.key_pem),
                ("ca.crt", ca.cert_pem()),
            ],
        )
    };
    (
        ca.cert_pem().to_string(),
        [
            tls(format!("{cluster}-server-tls"), &server),
            tls(format!("{cluster}-replication-tls"), &replication),
        ],
    )
}
