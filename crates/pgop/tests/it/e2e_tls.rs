//! PostgreSQL's TLS end to end, on the local node: the operator's certificates, verified
//! as `sslmode=verify-full` clients verify them, plaintext refused by default and allowed
//! by `spec.tls.allowPlaintext`, renewal and new instance names without a restart.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use pgop_testenv::wait;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn key(secret: &Secret, key: &str) -> Result<String> {
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| format!("Secret has no {key}"))?;
    Ok(String::from_utf8(value.0.clone())?)
}

/// The certificate PostgreSQL at `ip:5432` serves (DER), read from a TLS handshake that
/// verifies it against `ca_pem` under `name`.
async fn served_certificate(ip: &str, ca_pem: &str, name: &str) -> Result<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut tcp = tokio::net::TcpStream::connect((ip, 5432)).await?;
    // SSLRequest: length 8, code 80877103; PostgreSQL answers `S` before the handshake.
    tcp.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).await?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await?;
    if answer[0] != b'S' {
        return Err(format!("PostgreSQL at {ip} answered {answer:?} to SSLRequest").into());
    }
    let server_name = rustls::pki_types::ServerName::try_from(name.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server_name, tcp)
        .await?;
    let (_, session) = tls.get_ref();
    let leaf = session
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no certificate served")?;
    Ok(leaf.as_ref().to_vec())
}

fn der(pem: &str) -> Result<Vec<u8>> {
    Ok(CertificateDer::from_pem_slice(pem.as_bytes())?
        .as_ref()
        .to_vec())
}

/// A connection without TLS, as the app user.
async fn plaintext(ip: &str, password: &str) -> std::result::Result<(), String> {
    let login = tokio_postgres::Config::new()
        .host(ip)
        .port(5432)
        .user("app")
        .dbname("app")
        .password(password)
        .connect_timeout(std::time::Duration::from_secs(5))
        .ssl_mode(tokio_postgres::config::SslMode::Disable)
        .connect(tokio_postgres::NoTls)
        .await;
    login.map(drop).map_err(|e| format!("{e:?}"))
}

async fn set_allow_plaintext(env: &Env, cluster: &str, allow: bool) -> Result {
    let patch = serde_json::json!({"spec": {"tls": {"allowPlaintext": allow}}});
    env.clusters()
        .patch(cluster, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[tokio::test]
async fn e2e_postgresql_serves_the_clusters_certificate_refuses_plaintext_and_renews_without_a_restart()
-> Result {
    let _serial = SERIAL.lock().await;
    let env = start("e2e-tls").await?;
    let ns = env.n().to_string();
    env.create(
        "tls",
        serde_json::json!({"replicas": 2, "storage": {"size": "1Gi"}}),
    )
    .await?;
    env.wait_ready("tls", 2).await?;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &ns);

    // The app Secret: the authority, the sslmode, a URI that asks for TLS.
    let app = secrets.get("tls-app").await?;
    let ca = key(&app, "ca.crt")?;
    let password = key(&app, "password")?;
    assert_eq!(key(&app, "sslmode")?, "require");
    assert!(
        key(&app, "uri")?.ends_with(&format!("@tls-rw.{ns}:5432/app?sslmode=require")),
        "{}",
        key(&app, "uri")?
    );
    let primary = env.current_primary("tls").await?;
    let ips = env.pod_ips("tls").await?;
    let primary_ip = env.pod_ip(&primary).await?;

    // verify-full: under every Service name, short and fully qualified, and the Pod's.
    for name in [
        "tls-rw".to_string(),
        format!("tls-rw.{ns}"),
        format!("tls-ro.{ns}.svc"),
        format!("tls-r.{ns}.svc.cluster.local"),
        primary.clone(),
    ] {
        let c = connect_verified(&primary_ip, 5432, ("app", &password, "app"), &ca, &name)
            .await
            .map_err(|e| format!("verify-full as {name}: {e:?}"))?;
        let row = c
            .query_one(
                "select ssl, version from pg_stat_ssl where pid = pg_backend_pid()",
                &[],
            )
            .await?;
        let (ssl, version): (bool, String) = (row.get(0), row.get(1));
        assert!(ssl && version.starts_with("TLSv1."), "{ssl} {version}");
    }
    // A name the certificate does not carry, or another authority: refused by the client.
    let wrong_name = connect_verified(
        &primary_ip,
        5432,
        ("app", &password, "app"),
        &ca,
        "db.example.com",
    )
    .await;
    assert!(wrong_name.is_err(), "a name outside the certificate");
    let other = pgop_tls::Authority::generate_postgres(jiff::Timestamp::now())?;
    let wrong_ca = connect_verified(
        &primary_ip,
        5432,
        ("app", &password, "app"),
        other.cert_pem(),
        "tls-rw",
    )
    .await;
    assert!(wrong_ca.is_err(), "a certificate of another authority");
    // Plaintext: refused by PostgreSQL, on every instance.
    for (name, ip) in &ips {
        let refused = plaintext(ip, &password).await.err().unwrap_or_default();
        assert!(
            refused.contains("no encryption"),
            "{name} accepted or failed otherwise without TLS: {refused}"
        );
    }
    // The standby streams (over TLS, with the replication certificate: pg_hba has no
    // other way in for the replication role).
    let c = connect(&primary_ip, &password).await?;
    c.batch_execute("create table t(id int); insert into t values (1)")
        .await?;
    for (name, ip) in ips.iter().filter(|(n, _)| *n != primary) {
        wait_rows(name, ip, &password, "t", 1).await?;
    }

    // Renewal: the operator renews a certificate with under 30 days left; PostgreSQL
    // serves the new one after a reload, not a restart.
    let started = start_times(&env, "tls", &password).await?;
    let renewal = std::time::Instant::now();
    let old_cert = key(&secrets.get("tls-server-tls").await?, "tls.crt")?;
    let soon = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24);
    let patch = serde_json::json!({"metadata": {"annotations": {
        "database.example.com/not-after": soon.to_string()
    }}});
    secrets
        .patch(
            "tls-server-tls",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    let new_cert = wait::until("the server certificate renewed", TIMEOUT, || async {
        let secret = secrets
            .get("tls-server-tls")
            .await
            .map_err(|e| e.to_string())?;
        match key(&secret, "tls.crt") {
            Ok(cert) if cert != old_cert => Ok(cert),
            other => Err(format!("{:?}", other.map(|_| "unchanged"))),
        }
    })
    .await?;
    let new_der = der(&new_cert)?;
    // The managers watch the Secret: the renewed certificate reaches them well before
    // their 60 s resync would have read it.
    for (name, ip) in &ips {
        wait::until(
            &format!("{name} serving the renewed certificate"),
            std::time::Duration::from_secs(30),
            || async {
                match served_certificate(ip, &ca, "tls-rw").await {
                    Ok(served) if served == new_der => Ok(()),
                    Ok(_) => Err("the old certificate".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await?;
    }
    println!(
        "renewed certificate served by every instance {:.1?} after the annotation",
        renewal.elapsed()
    );
    assert_eq!(
        start_times(&env, "tls", &password).await?,
        started,
        "renewal restarted PostgreSQL"
    );

    // A new instance's name joins the certificate.
    let patch = serde_json::json!({"spec": {"replicas": 3}});
    env.clusters()
        .patch("tls", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    env.wait_ready("tls", 3).await?;
    let ips = env.pod_ips("tls").await?;
    let (third, third_ip) = ips
        .iter()
        .find(|(n, _)| !started.contains_key(n))
        .ok_or("no new instance")?;
    wait::until(
        &format!("{third}'s name in the certificate"),
        TIMEOUT,
        || async {
            connect_verified(third_ip, 5432, ("app", &password, "app"), &ca, third)
                .await
                .map(drop)
                .map_err(|e| format!("{e:?}"))
        },
    )
    .await?;

    // spec.tls.allowPlaintext: the user's choice, taken back as easily.
    set_allow_plaintext(&env, "tls", true).await?;
    wait::until("plaintext allowed", TIMEOUT, || async {
        plaintext(&primary_ip, &password).await
    })
    .await?;
    set_allow_plaintext(&env, "tls", false).await?;
    wait::until("plaintext refused again", TIMEOUT, || async {
        match plaintext(&primary_ip, &password).await {
            Err(e) if e.contains("no encryption") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    env.stop().await
}

/// A Secret in the cert-manager shape.
fn tls_secret(name: &str, issued: &pgop_tls::Issued, ca: &str) -> Secret {
    secret(
        name,
        &[
            ("tls.crt", &issued.cert_pem),
            ("tls.key", &issued.key_pem),
            ("ca.crt", ca),
        ],
    )
}

/// A connection as `app` with a client certificate and no password, verifying the server
/// against `ca` under `byo-rw`.
async fn with_client_certificate(
    ip: &str,
    ca: &str,
    client: &pgop_tls::Issued,
) -> std::result::Result<tokio_postgres::Client, String> {
    let tls =
        pgop_tls::postgres::PostgresTls::verify_full(ca, Some((&client.cert_pem, &client.key_pem)))
            .and_then(|t| t.server_name("byo-rw"))
            .map_err(|e| e.to_string())?;
    let mut config = tokio_postgres::Config::new();
    config
        .host(ip)
        .port(5432)
        .user("app")
        .dbname("app")
        .connect_timeout(std::time::Duration::from_secs(5));
    pgop_tls::postgres::connect(&mut config, Some(tls))
        .await
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn e2e_a_brought_server_certificate_is_served_and_renewed_and_client_certificates_log_in()
-> Result {
    let _serial = SERIAL.lock().await;
    let env = start("e2e-tls-byo").await?;
    let ns = env.n().to_string();
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &ns);
    let now = jiff::Timestamp::now();
    // Another issuer (cert-manager's part): the server's authority and the clients'.
    let issuer = pgop_tls::Authority::generate_named(now, "example issuer")?;
    let names = ["byo-rw".to_string(), format!("byo-rw.{ns}.svc")];
    let first = issuer.issue_postgres_server(&names, now, 30)?;
    let clients = pgop_tls::Authority::generate_named(now, "example clients")?;
    let pp = kube::api::PostParams::default();
    secrets
        .create(&pp, &tls_secret("byo-cert", &first, issuer.cert_pem()))
        .await?;
    secrets
        .create(
            &pp,
            &secret("byo-clients", &[("ca.crt", clients.cert_pem())]),
        )
        .await?;
    env.create(
        "byo",
        serde_json::json!({
            "replicas": 2, "storage": {"size": "1Gi"},
            "tls": {"serverSecret": "byo-cert", "clientCASecret": "byo-clients"},
            "postgresql": {"pgHba": ["hostssl all app all cert"]}
        }),
    )
    .await?;
    // Ready: the standby verified the brought certificate under byo-rw to stream.
    env.wait_ready("byo", 2).await?;
    let app = secrets.get("byo-app").await?;
    assert_eq!(key(&app, "ca.crt")?, issuer.cert_pem());
    let primary = env.current_primary("byo").await?;
    let ip = env.pod_ip(&primary).await?;
    for (name, pod_ip) in env.pod_ips("byo").await? {
        assert_eq!(
            served_certificate(&pod_ip, issuer.cert_pem(), "byo-rw").await?,
            der(&first.cert_pem)?,
            "{name} serves another certificate"
        );
    }

    // A client certificate of the clients' authority logs in as its common name, with no
    // password; one of another authority does not.
    let app_cert = clients.issue_postgres_client("app", now, 1)?;
    let c = with_client_certificate(&ip, issuer.cert_pem(), &app_cert).await?;
    let row = c
        .query_one(
            "select current_user::text, client_dn from pg_stat_ssl where pid = pg_backend_pid()",
            &[],
        )
        .await?;
    let (user, dn): (String, Option<String>) = (row.get(0), row.get(1));
    assert_eq!((user.as_str(), dn.as_deref()), ("app", Some("/CN=app")));
    let stranger = pgop_tls::Authority::generate_named(now, "example stranger")?
        .issue_postgres_client("app", now, 1)?;
    assert!(
        with_client_certificate(&ip, issuer.cert_pem(), &stranger)
            .await
            .is_err(),
        "a client certificate of another authority"
    );

    // Renewal by the issuer: the Secret's new certificate is served, no restart.
    let c = with_client_certificate(&ip, issuer.cert_pem(), &app_cert).await?;
    let started = postmaster_started(&c).await?;
    let second = issuer.issue_postgres_server(&names, now, 60)?;
    let patch = serde_json::json!({"stringData": {
        "tls.crt": second.cert_pem, "tls.key": second.key_pem
    }});
    secrets
        .patch("byo-cert", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let second_der = der(&second.cert_pem)?;
    wait::until("the renewed certificate served", TIMEOUT, || async {
        match served_certificate(&ip, issuer.cert_pem(), "byo-rw").await {
            Ok(served) if served == second_der => Ok(()),
            other => Err(format!("{:?}", other.map(|_| "the first certificate"))),
        }
    })
    .await?;
    let c = with_client_certificate(&ip, issuer.cert_pem(), &app_cert).await?;
    assert_eq!(
        postmaster_started(&c).await?,
        started,
        "renewal restarted PostgreSQL"
    );

    // A certificate without the name the instances verify is refused, naming the field;
    // the one served so far stays.
    let unnamed = issuer.issue_postgres_server(&["elsewhere".to_string()], now, 30)?;
    let patch = serde_json::json!({"stringData": {
        "tls.crt": unnamed.cert_pem, "tls.key": unnamed.key_pem
    }});
    secrets
        .patch("byo-cert", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let refused = env.wait_event("TLSSecretRefused").await?;
    assert!(
        refused.contains("spec.tls.serverSecret") && refused.contains("byo-rw"),
        "{refused}"
    );
    assert_eq!(
        served_certificate(&ip, issuer.cert_pem(), "byo-rw").await?,
        second_der,
        "a refused certificate replaced the one served"
    );
    env.stop().await
}
