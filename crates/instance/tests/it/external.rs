//! An entry of `spec.externalClusters` against a real PostgreSQL 15 that serves TLS only,
//! as a pgop primary serves it (no Kubernetes): [`pgop_instance::external`] writes the
//! entry's files, builds its connection string, and asks the server who it is over a
//! replication connection with psql, as a standby's WAL receiver will connect; each way
//! it can fail is told apart (TLS, authentication, no replication privilege, unreachable).

use crate::postgres::common::{
    Node, TempDir, TestResult, binaries, credentials, eventually, free_port, make_dir, options,
    run_as,
};
use crate::tls::server_tls;
use pgop_api::external::ExternalConnection;
use pgop_api::instance_status::PgRole;
use pgop_instance::Instance;
use pgop_instance::config::Mode;
use pgop_instance::external::{Credentials, Refusal, Source, prepare};
use std::sync::Arc;
use std::time::Duration;

/// A password with everything a libpq password file and connection string must quote.
const PASSWORD: &str = r#"p'a ss\:=#$(id)"x"#;

struct Server {
    instance: Arc<Instance>,
    port: u16,
    ca: String,
    /// A client certificate for `streaming_replica` from the server's authority.
    replication: pgop_tls::Issued,
    dir: TempDir,
}

impl Server {
    /// A primary on 127.0.0.1 whose certificate names `it-rw` and `localhost`.
    async fn start() -> Self {
        let dir = TempDir::new("external");
        make_dir(&dir.0.join("client"));
        let now = jiff::Timestamp::now();
        let ca = pgop_tls::Authority::generate_postgres(now).expect("an authority");
        let names = ["it-rw".to_string(), "localhost".to_string()];
        let server = ca
            .issue_postgres_server(&names, now, 2)
            .expect("a server certificate");
        let replication = ca
            .issue_postgres_client("streaming_replica", now, 2)
            .expect("a client certificate");
        let port = free_port();
        let instance = Arc::new(Instance::new(options(
            "external-1",
            &dir,
            "127.0.0.1",
            port,
            credentials(),
        )));
        instance
            .set_tls(server_tls(ca.cert_pem(), &server, &replication, "it-rw"))
            .expect("TLS files written");
        instance
            .bootstrap_primary()
            .await
            .expect("PostgreSQL bootstrapped");
        Self {
            instance,
            port,
            ca: ca.cert_pem().to_string(),
            replication,
            dir,
        }
    }

    /// What an entry of the replication user needs: the server's authority and the
    /// user's client certificate, no password.
    fn with_certificate(&self) -> Credentials {
        Credentials {
            password: None,
            ca_pem: Some(self.ca.clone()),
            client: Some((
                self.replication.cert_pem.clone(),
                self.replication.key_pem.clone(),
            )),
        }
    }

    fn connection(&self, host: &str, user: &str, ssl_mode: &str) -> ExternalConnection {
        serde_yaml::from_str(&format!(
            "{{host: {host}, port: {}, user: {user}, sslMode: {ssl_mode}}}",
            self.port
        ))
        .expect("a connection")
    }

    fn prepare(&self, name: &str, c: &ExternalConnection, credentials: &Credentials) -> Source {
        prepare(&self.dir.0.join("client"), name, c, credentials, run_as()).expect("prepared")
    }

    async fn identify(
        &self,
        source: &Source,
    ) -> Result<pgop_instance::external::Identity, Refusal> {
        source
            .identify(
                &binaries(),
                run_as(),
                "it-replica-1",
                Duration::from_secs(20),
            )
            .await
    }

    async fn sql(&self, statement: &str) -> Vec<tokio_postgres::SimpleQueryMessage> {
        let client = self.instance.endpoint().connect().await.expect("superuser");
        client.simple_query(statement).await.expect(statement)
    }

    async fn system_identifier(&self) -> String {
        let answer = self
            .sql("SELECT system_identifier::text FROM pg_control_system()")
            .await;
        answer
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no row: {answer:?}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pid) = self.instance.pid().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill has no memory-safety preconditions; -pid is the server's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

/// Asserts that `result` is refused for `reason`, showing what libpq said when not.
fn assert_refused<T: std::fmt::Debug>(result: Result<T, Refusal>, reason: &str, what: &str) {
    match result {
        Ok(ok) => panic!("{what}: accepted ({ok:?}), expected {reason}"),
        Err(refusal) => assert_eq!(refusal.reason(), reason, "{what}: {refusal}"),
    }
}

#[tokio::test]
async fn an_entry_is_identified_over_verified_tls_and_each_refusal_is_told_apart() -> TestResult {
    let server = Server::start().await;
    let system = server.system_identifier().await;
    let with_certificate = server.with_certificate();

    // The replication user with its client certificate, the certificate verified for the
    // host name: the server's identity, the same system as the server's own.
    let full = server.connection("localhost", "streaming_replica", "verify-full");
    let source = server.prepare("site-a", &full, &with_certificate);
    let identity = server.identify(&source).await.map_err(|r| r.to_string())?;
    assert_eq!(identity.system_identifier, system);
    assert_eq!(identity.timeline, 1);
    assert_eq!(identity.server_version_num / 10000, 15);

    // The address is not a name the certificate carries: verify-full refuses it,
    // verify-ca (the authority only) and require (nothing checked) accept it.
    let by_address = server.connection("127.0.0.1", "streaming_replica", "verify-full");
    let source = server.prepare("by-address", &by_address, &with_certificate);
    assert_refused(
        server.identify(&source).await,
        "SourceTLSRefused",
        "verify-full by address",
    );
    for mode in ["verify-ca", "require"] {
        let c = server.connection("127.0.0.1", "streaming_replica", mode);
        let source = server.prepare(mode, &c, &with_certificate);
        let identity = server
            .identify(&source)
            .await
            .map_err(|r| format!("{mode}: {r}"))?;
        assert_eq!(identity.system_identifier, system, "{mode}");
    }

    // Another authority: the server's certificate does not verify.
    let other = pgop_tls::Authority::generate_named(jiff::Timestamp::now(), "pgop-it-other-ca")?;
    let source = server.prepare(
        "other-ca",
        &full,
        &Credentials {
            ca_pem: Some(other.cert_pem().to_string()),
            ..with_certificate.clone()
        },
    );
    assert_refused(
        server.identify(&source).await,
        "SourceTLSRefused",
        "another authority",
    );

    // The replication user without its certificate: pg_hba.conf wants one.
    let source = server.prepare(
        "no-certificate",
        &full,
        &Credentials {
            client: None,
            password: Some(PASSWORD.into()),
            ..with_certificate.clone()
        },
    );
    assert_refused(
        server.identify(&source).await,
        "SourceAuthenticationFailed",
        "no client certificate",
    );

    // A role that logs in with a password, the password full of what must be quoted: it
    // travels in the password file only.
    server
        .sql(&format!(
            "CREATE ROLE follower LOGIN PASSWORD {}",
            pgop_instance::pg::sql::quote_literal(PASSWORD)
        ))
        .await;
    // The rule a user of the source adds (spec.postgresql.pgHba, were it a pgop cluster).
    server
        .instance
        .apply_config(
            &Default::default(),
            &["hostssl replication follower all scram-sha-256".to_string()],
        )
        .await?;
    let follower = server.connection("localhost", "follower", "verify-full");
    let with_password = |password: &str| Credentials {
        password: Some(password.into()),
        ca_pem: Some(server.ca.clone()),
        client: None,
    };
    // Logged in, but no REPLICATION: told apart from a refused login.
    let source = server.prepare("follower", &follower, &with_password(PASSWORD));
    assert_refused(
        server.identify(&source).await,
        "SourceNoReplication",
        "no REPLICATION",
    );
    server.sql("ALTER ROLE follower REPLICATION").await;
    let identity = server.identify(&source).await.map_err(|r| r.to_string())?;
    assert_eq!(identity.system_identifier, system);
    let source = server.prepare("wrong-password", &follower, &with_password("not it"));
    assert_refused(
        server.identify(&source).await,
        "SourceAuthenticationFailed",
        "a wrong password",
    );

    // Nothing listens there.
    let mut closed = full.clone();
    closed.port = i32::from(free_port());
    let source = server.prepare("closed", &closed, &with_certificate);
    assert_refused(
        server.identify(&source).await,
        "SourceUnreachable",
        "nothing listening",
    );
    Ok(())
}

/// Rows of `t` in the app database of `instance`, over its socket.
async fn rows(instance: &Instance) -> Option<i64> {
    let client = instance.endpoint().connect_to("app").await.ok()?;
    let row = client.query_one("SELECT count(*) FROM t", &[]).await.ok()?;
    row.try_get(0).ok()
}

/// Waits until `instance` has `expected` rows of `t`.
async fn has_rows(what: &str, instance: &Instance, expected: i64) {
    eventually(what, Duration::from_secs(60), || async {
        (rows(instance).await == Some(expected)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_designated_primary_follows_the_source_its_standbys_cascade_and_a_failover_repoints_it()
-> TestResult {
    let server = Server::start().await;
    let app = server.instance.endpoint().connect_to("app").await?;
    app.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 100)",
    )
    .await?;
    // What a replica cluster of a pgop cluster writes: the source's replication user, its
    // client certificate, the name its server certificate carries, verified.
    let with_certificate = server.with_certificate();
    let full = server.connection("localhost", "streaming_replica", "verify-full");

    // The replica cluster's first instance: cloned from the source, following it.
    let designated = Node::new("replica-1");
    // (Its files where both instances find them; each manager writes its own.)
    let source = server.prepare("site-a", &full, &with_certificate);
    designated.instance.bootstrap_designated(&source).await?;
    let status = designated.instance.status().await;
    assert_eq!(status.role, PgRole::DesignatedPrimary);
    assert!(status.in_recovery);
    assert_eq!(
        status.system_identifier,
        Some(server.system_identifier().await)
    );
    has_rows("the clone's rows", &designated.instance, 100).await;
    app.batch_execute("INSERT INTO t SELECT generate_series(101, 150)")
        .await?;
    has_rows("rows streamed from the source", &designated.instance, 150).await;
    // It takes no writes.
    let local = designated.instance.endpoint().connect_to("app").await?;
    let refused = local.batch_execute("INSERT INTO t VALUES (0)").await;
    assert_eq!(
        refused.err().and_then(|e| e.code().cloned()),
        Some(tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION),
        "a write on the designated primary"
    );
    // The source sees it under a name no pgop instance has, so it never counts as one of
    // the source's own synchronous standbys.
    let names = server
        .sql("SELECT application_name FROM pg_stat_replication")
        .await;
    let streaming: Vec<String> = names
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
            _ => None,
        })
        .collect();
    assert_eq!(streaming, ["replica-cluster:replica-1"]);

    // A standby of the replica cluster cascades from the designated primary, through the
    // slot the designated primary keeps for it.
    designated
        .instance
        .ensure_slots(&["replica-2".to_string()])
        .await?;
    let standby = Node::new("replica-2");
    standby
        .instance
        .bootstrap_standby(&designated.upstream())
        .await?;
    app.batch_execute("INSERT INTO t SELECT generate_series(151, 200)")
        .await?;
    has_rows("rows cascaded", &standby.instance, 200).await;
    assert_eq!(standby.instance.status().await.role, PgRole::Replica);

    // The designated primary is lost: the standby is re-pointed at the source (a reload),
    // never promoted, and keeps following it.
    designated.instance.stop_now().await?;
    drop(designated);
    standby.instance.follow_source(&source).await?;
    app.batch_execute("INSERT INTO t SELECT generate_series(201, 250)")
        .await?;
    has_rows("rows streamed after the failover", &standby.instance, 250).await;
    let status = standby.instance.status().await;
    assert_eq!(status.role, PgRole::DesignatedPrimary);
    assert!(status.in_recovery && status.streaming);
    Ok(())
}

#[tokio::test]
async fn a_designated_primary_whose_source_removed_its_wal_is_cloned_afresh() -> TestResult {
    let server = Server::start().await;
    let app = server.instance.endpoint().connect_to("app").await?;
    app.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 10)",
    )
    .await?;
    let full = server.connection("localhost", "streaming_replica", "verify-full");
    let source = server.prepare("site-a", &full, &server.with_certificate());
    let designated = Node::new("replica-1");
    designated.instance.bootstrap_designated(&source).await?;
    has_rows("the clone's rows", &designated.instance, 10).await;
    designated.instance.stop().await?;

    // Meanwhile the source writes and checkpoints past the WAL the designated primary
    // needs next, and removes it (it keeps no slot for it).
    for round in 0..4 {
        app.batch_execute(&format!(
            "INSERT INTO t SELECT generate_series({}, {}); SELECT pg_switch_wal(); CHECKPOINT",
            11 + round * 1000,
            10 + (round + 1) * 1000
        ))
        .await?;
    }
    server.sql("CHECKPOINT").await;

    // Started again (consistent at once: it stopped cleanly), its WAL receiver is told
    // the WAL it needs was removed; the manager sees it, and clones it afresh.
    designated
        .instance
        .start_as(Mode::DesignatedPrimary {
            source: Box::new(source.clone()),
        })
        .await?;
    eventually(
        "the source's \"requested WAL segment has already been removed\"",
        Duration::from_secs(60),
        || async { designated.instance.upstream_wal_gone().then_some(()) },
    )
    .await;
    assert!(!designated.instance.status().await.streaming);
    designated.instance.reclone_from_source(&source).await?;
    has_rows("the rows after the re-clone", &designated.instance, 4010).await;
    let status = designated.instance.status().await;
    assert_eq!(status.role, PgRole::DesignatedPrimary);
    Ok(())
}
