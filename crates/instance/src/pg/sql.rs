//! SQL connections (tokio-postgres) and the few quoting helpers DDL needs. The manager
//! reaches its own server over the Unix socket as the superuser; it must never build SQL
//! from unquoted input.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_postgres::{Client, NoTls};

/// The superuser the manager connects as over the Unix socket.
pub use pgop_api::constants::SUPERUSER;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to connect to PostgreSQL")]
    Connect(#[source] tokio_postgres::Error),
    #[error("failed to connect to PostgreSQL within {0:?}")]
    ConnectTimeout(Duration),
    #[error("failed to reach the primary at {host}:{port}")]
    ReachPrimary {
        host: String,
        port: u16,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("failed to reach the primary at {host}:{port}: it is in recovery")]
    PrimaryInRecovery { host: String, port: u16 },
    #[error("the timeline history of the primary at {host}: {why}")]
    History { host: String, why: String },
    #[error("failed to read the TLS file {path}")]
    ReadTls {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the TLS files do not make a client configuration")]
    TlsConfig(#[source] pgop_tls::Error),
}

/// How the manager reaches its own server: the Unix socket directory and port.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub socket_dir: PathBuf,
    pub port: u16,
}

impl Endpoint {
    /// A superuser connection to `dbname`; the connection task runs until the client drops.
    pub async fn connect_to(&self, dbname: &str) -> Result<Client, Error> {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(&self.socket_dir)
            .port(self.port)
            .user(SUPERUSER)
            .dbname(dbname)
            .application_name("pgop-instance")
            .connect_timeout(Duration::from_secs(5));
        let (client, connection) = config.connect(NoTls).await.map_err(Error::Connect)?;
        tokio::spawn(async move {
            // The error of a dropped or dead connection surfaces on the client's next query.
            let _ = connection.await;
        });
        Ok(client)
    }

    /// A superuser connection to the `postgres` database.
    pub async fn connect(&self) -> Result<Client, Error> {
        self.connect_to("postgres").await
    }

    /// Retries until the server accepts connections and answers a query.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<Client, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(client) = self.connect().await
                && client.simple_query("SELECT 1").await.is_ok()
            {
                return Ok(client);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::ConnectTimeout(timeout));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Where a standby streams from: the primary's address and the replication credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    /// TLS with a client certificate (`sslmode=verify-full`), when the cluster runs it.
    pub tls: Option<UpstreamTls>,
}

/// How a standby verifies its primary and proves who it is: files in its socket directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    /// The name verified in the primary's certificate, whatever address `host` is.
    pub server_name: String,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password never reaches a log line.
        f.debug_struct("Upstream")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// The connection string of `primary_conninfo`; `application_name` is how the primary
    /// names this standby (in `pg_stat_replication` and `synchronous_standby_names`). The
    /// password is not in it but in `passfile` ([`Upstream::passfile_line`]), kept outside
    /// PGDATA: a copy of PGDATA (a base backup, a clone) never carries it.
    pub fn conninfo_with_passfile(&self, application_name: &str, passfile: &Path) -> String {
        format!(
            "{} passfile={}",
            self.conninfo_without_password(application_name, None),
            conninfo_value(&passfile.display().to_string())
        )
    }

    /// The password file's line for this upstream (`*:*:*:user:password`, with `\` and `:`
    /// escaped as libpq reads them); `None` when the user or the password holds a line
    /// break, which a password file cannot.
    pub fn passfile_line(&self) -> Option<String> {
        crate::external::passfile_line(&self.user, &self.password)
    }

    /// The connection string for programs that get the password as `PGPASSWORD` (so that
    /// it does not show in the process list).
    pub fn conninfo_without_password(
        &self,
        application_name: &str,
        dbname: Option<&str>,
    ) -> String {
        let mut parts = Vec::new();
        match &self.tls {
            // libpq verifies `host` and connects to `hostaddr`: the primary's Pod IP,
            // under the name its certificate carries.
            Some(tls) if self.host.parse::<std::net::IpAddr>().is_ok() => {
                parts.push(format!("host={}", conninfo_value(&tls.server_name)));
                parts.push(format!("hostaddr={}", conninfo_value(&self.host)));
            }
            _ => parts.push(format!("host={}", conninfo_value(&self.host))),
        }
        if let Some(tls) = &self.tls {
            let file = |p: &Path| conninfo_value(&p.display().to_string());
            parts.push("sslmode=verify-full".to_string());
            parts.push(format!("sslrootcert={}", file(&tls.ca_file)));
            parts.push(format!("sslcert={}", file(&tls.cert_file)));
            parts.push(format!("sslkey={}", file(&tls.key_file)));
        }
        parts.extend([
            format!("port={}", self.port),
            format!("user={}", conninfo_value(&self.user)),
            format!("application_name={}", conninfo_value(application_name)),
            "connect_timeout=5".to_string(),
        ]);
        if let Some(db) = dbname {
            parts.push(format!("dbname={}", conninfo_value(db)));
        }
        parts.join(" ")
    }
}

impl Upstream {
    /// The error of a failed request to the upstream.
    pub(crate) fn unreachable(&self, source: tokio_postgres::Error) -> Error {
        Error::ReachPrimary {
            host: self.host.clone(),
            port: self.port,
            source,
        }
    }

    /// A connection to the upstream's `postgres` database as the replication role (over
    /// TLS when the cluster runs it), for SQL.
    pub(crate) async fn connect(&self) -> Result<Client, Error> {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.host)
            .port(self.port)
            .user(&self.user)
            .password(&self.password)
            .dbname("postgres")
            .application_name("pgop-instance")
            .connect_timeout(Duration::from_secs(5));
        let tls = self.tls.as_ref().map(UpstreamTls::connector).transpose()?;
        pgop_tls::postgres::connect(&mut config, tls)
            .await
            .map_err(|e| self.unreachable(e))
    }

    /// Checks that the upstream answers and accepts writes (not in recovery), before
    /// anything is thrown away to copy from it.
    pub async fn probe_primary(&self) -> Result<(), Error> {
        let reach = |source| self.unreachable(source);
        let client = self.connect().await?;
        let row = client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .map_err(reach)?;
        let in_recovery: bool = row.try_get(0).map_err(reach)?;
        if in_recovery {
            return Err(Error::PrimaryInRecovery {
                host: self.host.clone(),
                port: self.port,
            });
        }
        Ok(())
    }
}

impl UpstreamTls {
    /// A tokio-postgres connector as libpq's `sslmode=verify-full` with these files.
    pub fn connector(&self) -> Result<pgop_tls::postgres::PostgresTls, Error> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| Error::ReadTls {
                path: path.to_path_buf(),
                source,
            })
        };
        let (ca, cert, key) = (
            read(&self.ca_file)?,
            read(&self.cert_file)?,
            read(&self.key_file)?,
        );
        pgop_tls::postgres::PostgresTls::verify_full(&ca, Some((&cert, &key)))
            .and_then(|t| t.server_name(&self.server_name))
            .map_err(Error::TlsConfig)
    }
}

/// A libpq conninfo value: single-quoted, with `\` and `'` escaped.
pub fn conninfo_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// An SQL string literal (standard_conforming_strings is on in every supported version).
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// The literal of a role's password in `ALTER ROLE ... PASSWORD`: its SCRAM-SHA-256
/// verifier (random salt), computed here so that the password itself never reaches the
/// server, its statement logs or `pg_stat_statements`.
pub fn password_literal(password: &str) -> String {
    quote_literal(&postgres_protocol::password::scram_sha_256(
        password.as_bytes(),
    ))
}

/// An SQL identifier.
pub fn quote_ident(value: &str) -> String {
    format!("\"{}\"", value.replace('"', "\"\""))
}

/// A physical replication slot name for an instance: slot names allow only `[a-z0-9_]`.
pub fn slot_name(instance: &str) -> String {
    let cleaned: String = instance
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect();
    let mut name = format!("pgop_{cleaned}");
    name.truncate(63);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(conninfo_value("p'w\\"), "'p\\'w\\\\'");
        assert_eq!(slot_name("demo-3"), "pgop_demo_3");
    }

    #[test]
    fn passwords_stay_out_of_debug_output_and_off_command_lines() {
        let upstream = Upstream {
            host: "10.0.0.1".into(),
            port: 5432,
            user: "streaming_replica".into(),
            password: "s3cret".into(),
            tls: None,
        };
        assert!(!format!("{upstream:?}").contains("s3cret"));
        assert!(
            !upstream
                .conninfo_without_password("demo-2", None)
                .contains("s3cret")
        );
        let conninfo =
            upstream.conninfo_with_passfile("demo-2", Path::new("/run/postgresql/x.pgpass"));
        assert!(!conninfo.contains("s3cret"), "{conninfo}");
        assert!(
            conninfo.ends_with(" passfile='/run/postgresql/x.pgpass'"),
            "{conninfo}"
        );
        assert_eq!(
            upstream.passfile_line().as_deref(),
            Some("*:*:*:streaming_replica:s3cret\n")
        );
    }

    #[test]
    fn passfile_lines_escape_what_libpq_unescapes_and_refuse_line_breaks() {
        let with = |password: &str| Upstream {
            host: "h".into(),
            port: 5432,
            user: "u".into(),
            password: password.into(),
            tls: None,
        };
        assert_eq!(
            with("a:b\\c").passfile_line().as_deref(),
            Some("*:*:*:u:a\\:b\\\\c\n")
        );
        assert_eq!(with("a\nb").passfile_line(), None);
        assert_eq!(with("a\rb").passfile_line(), None);
    }

    #[test]
    fn with_tls_the_primary_is_verified_by_name_and_reached_by_address() {
        let upstream = Upstream {
            host: "10.0.0.1".into(),
            port: 5432,
            user: "streaming_replica".into(),
            password: "s3cret".into(),
            tls: Some(UpstreamTls {
                server_name: "db-rw".into(),
                ca_file: "/run/postgresql/pgop-tls-ca.crt".into(),
                cert_file: "/run/postgresql/pgop-tls-replication.crt".into(),
                key_file: "/run/postgresql/pgop-tls-replication.key".into(),
            }),
        };
        assert_eq!(
            upstream.conninfo_without_password("db-2", None),
            "host='db-rw' hostaddr='10.0.0.1' sslmode=verify-full \
             sslrootcert='/run/postgresql/pgop-tls-ca.crt' \
             sslcert='/run/postgresql/pgop-tls-replication.crt' \
             sslkey='/run/postgresql/pgop-tls-replication.key' port=5432 \
             user='streaming_replica' application_name='db-2' connect_timeout=5"
        );
        let by_name = Upstream {
            host: "localhost".into(),
            ..upstream
        };
        assert!(
            by_name
                .conninfo_without_password("db-2", None)
                .starts_with("host='localhost' sslmode=verify-full "),
        );
    }
}
