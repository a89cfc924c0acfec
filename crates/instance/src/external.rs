//! Reaching a PostgreSQL outside the cluster: an entry of `spec.externalClusters` with a
//! `connection` ([`pgop_api::external`]), made ready to connect to and asked who it is.
//!
//! [`prepare`] writes what the entry's Secrets hold into files of a directory of their own
//! (mode 0700; each file 0600, owned by PostgreSQL's OS user): the password as a libpq
//! password file (so that it is in no connection string, no process list and no copy of
//! PGDATA), the authority and the client certificate and key. [`Source::conninfo`] is the
//! connection string PostgreSQL's own programs get (`primary_conninfo`, pg_basebackup,
//! psql), every value quoted again for libpq whatever the API let through.
//! [`Source::identify`] asks the server over a replication connection (`IDENTIFY_SYSTEM`,
//! with libpq, as the WAL receiver will connect), and says why not when it cannot:
//! unreachable, TLS refused, authentication refused, no replication privilege.
//!
//! This is step 2 of docs/replica.md's plan: replica clusters and imports are to connect
//! to their source through it.

use crate::pg::sql::conninfo_value;
use crate::pg::{Binaries, RunAs, binaries};
use pgop_api::external::ExternalConnection;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What an entry's Secrets hold, as the manager read them. `Debug` shows which are there,
/// never a password or a key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// `connection.passwordSecret`'s value.
    pub password: Option<String>,
    /// `connection.caSecret`'s value: the authority's certificate, PEM.
    pub ca_pem: Option<String>,
    /// `connection.clientCertificateSecret`'s `tls.crt` and `tls.key`, PEM.
    pub client: Option<(String, String)>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("password", &self.password.as_ref().map(|_| "(set)"))
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "(set)"))
            .field("client", &self.client.as_ref().map(|_| "(set)"))
            .finish()
    }
}

impl Credentials {
    /// What `connection`'s Secrets hold, `secret` giving each Secret by name (`None`: it
    /// does not exist, or cannot be read). `Err` names the field, the Secret and the key
    /// that is missing, empty or not UTF-8, never a value.
    pub fn from_secrets<'s>(
        connection: &ExternalConnection,
        secret: impl Fn(&str) -> Option<&'s k8s_openapi::api::core::v1::Secret>,
    ) -> Result<Self, String> {
        let value = |field: &str, name: &str, key: &str| -> Result<String, String> {
            let s = secret(name).ok_or_else(|| {
                format!("{field}: Secret {name:?} does not exist or cannot be read")
            })?;
            let bytes = s
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .ok_or_else(|| format!("{field}: Secret {name:?} has no key {key:?}"))?;
            let text = String::from_utf8(bytes.0.clone())
                .map_err(|_| format!("{field}: key {key:?} of Secret {name:?} is not UTF-8"))?;
            if text.trim().is_empty() {
                return Err(format!("{field}: key {key:?} of Secret {name:?} is empty"));
            }
            Ok(text)
        };
        let password = match &connection.password_secret {
            Some(s) => Some(
                value("connection.passwordSecret", &s.name, &s.key)?
                    .trim_end_matches(['\n', '\r'])
                    .to_string(),
            ),
            None => None,
        };
        let ca_pem = match &connection.ca_secret {
            Some(s) => Some(value("connection.caSecret", &s.name, &s.key)?),
            None => None,
        };
        let client = match &connection.client_certificate_secret {
            Some(s) => {
                let field = "connection.clientCertificateSecret";
                Some((
                    value(field, &s.name, "tls.crt")?,
                    value(field, &s.name, "tls.key")?,
                ))
            }
            None => None,
        };
        Ok(Self {
            password,
            ca_pem,
            client,
        })
    }
}

/// Why an entry cannot be made ready.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("external cluster {name:?}: {message}")]
    Unusable { name: String, message: String },
    #[error("external cluster {name:?}: writing {path}: {source}")]
    Write {
        name: String,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How long the manager's question to a source ([`Source::identify`]) may take.
pub const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// An entry made ready to connect to: its files written, its connection known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    name: String,
    /// `None`: the entry has a store only, which is all the cluster follows.
    connection: Option<ExternalConnection>,
    /// The entry's directory: files it does not have are named there too, as files that
    /// do not exist, so that libpq never falls back to `~/.postgresql` or `~/.pgpass`.
    home: PathBuf,
    passfile: Option<PathBuf>,
    ca: Option<PathBuf>,
    client: Option<(PathBuf, PathBuf)>,
    /// The entry's store, when WAL the server no longer has is to be read from it: the
    /// store's configuration file (written by the caller at [`Source::store_config_path`])
    /// and the `pgop` binary `restore_command` runs.
    archive: Option<(PathBuf, PathBuf)>,
}

/// The files of entry `name` under `dir`: `<dir>/pgop-external-<name>/`.
pub fn directory(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("pgop-external-{name}"))
}

/// Writes the files entry `name` needs (under [`directory`]) and returns it ready to
/// connect to. Refuses what the API should have refused already (a name that is no DNS
/// label, a verifying TLS mode without an authority) and what a file cannot hold (a line
/// break in the password or the user name).
pub fn prepare(
    dir: &Path,
    name: &str,
    connection: &ExternalConnection,
    credentials: &Credentials,
    run_as: Option<RunAs>,
) -> Result<Source, Error> {
    let unusable = |message: &str| Error::Unusable {
        name: name.to_string(),
        message: message.to_string(),
    };
    if name.len() > pgop_api::external::MAX_EXTERNAL_NAME_LENGTH
        || !pgop_api::formats::is_dns_label(name)
    {
        return Err(unusable("the name is no DNS label"));
    }
    if connection.ssl_mode.verifies() && credentials.ca_pem.is_none() {
        return Err(unusable(&format!(
            "sslMode {} needs the authority of connection.caSecret",
            connection.ssl_mode.as_str()
        )));
    }
    let home = make_home(dir, name, run_as)?;
    let write = |file: &str, content: &str| -> Result<PathBuf, Error> {
        let path = home.join(file);
        crate::config::write_file(&path, content, run_as).map_err(|e| Error::Unusable {
            name: name.to_string(),
            message: e.to_string(),
        })?;
        Ok(path)
    };
    let passfile = match &credentials.password {
        None => None,
        Some(password) => {
            let line = passfile_line(&connection.user, password).ok_or_else(|| {
                unusable("the password of connection.passwordSecret holds a line break")
            })?;
            Some(write("passfile", &line)?)
        }
    };
    let ca = match &credentials.ca_pem {
        Some(pem) => Some(write("ca.crt", pem)?),
        None => None,
    };
    let client = match &credentials.client {
        Some((cert, key)) => Some((write("tls.crt", cert)?, write("tls.key", key)?)),
        None => None,
    };
    Ok(Source {
        name: name.to_string(),
        connection: Some(connection.clone()),
        home: home.clone(),
        passfile,
        ca,
        client,
        archive: None,
    })
}

/// Makes entry `name`'s directory under `dir` ([`directory`]): 0700, PostgreSQL's OS
/// user's.
fn make_home(dir: &Path, name: &str, run_as: Option<RunAs>) -> Result<PathBuf, Error> {
    let home = directory(dir, name);
    let write_error = |source| Error::Write {
        name: name.to_string(),
        path: home.clone(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&home)
        .map_err(write_error)?;
    if let Some(user) = run_as {
        user.chown(&home).map_err(write_error)?;
    }
    Ok(home)
}

/// An entry with a store and no connection (`spec.replica` follows its store alone): its
/// directory made (0700, PostgreSQL's OS user's) for the store's configuration and the
/// record `restore_command` keeps ([`ArchiveRecord`]).
pub fn prepare_store_only(dir: &Path, name: &str, run_as: Option<RunAs>) -> Result<Source, Error> {
    if name.len() > pgop_api::external::MAX_EXTERNAL_NAME_LENGTH
        || !pgop_api::formats::is_dns_label(name)
    {
        return Err(Error::Unusable {
            name: name.to_string(),
            message: "the name is no DNS label".into(),
        });
    }
    let home = make_home(dir, name, run_as)?;
    Ok(Source {
        name: name.to_string(),
        connection: None,
        home,
        passfile: None,
        ca: None,
        client: None,
        archive: None,
    })
}

/// What `restore_command` (`pgop instance wal-restore --record FILE`) last did for a
/// designated primary that reads its source's store, kept in the entry's directory as
/// JSON and read by the manager for `/pg/status`: the last segment restored, and the one
/// the store did not have, with whether a later segment of the same timeline is there
/// (a gap: WAL is missing from the store, which recovery cannot step over).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveRecord {
    /// The last WAL segment restored from the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<String>,
    /// When (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<String>,
    /// The segment asked for since, which the store does not have (yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
    /// Since when it has been asked for and missing (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_since: Option<String>,
    /// A later segment of the same timeline is in the store while `missing` is not.
    #[serde(default)]
    pub later_present: bool,
}

impl ArchiveRecord {
    /// The record at `path`; the default when there is none or it cannot be read.
    pub fn read(path: &Path) -> Self {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Writes it to `path` (a temporary file renamed over it, so a reader never sees half).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, path)
    }

    /// After segment `name` was restored at `now`: no longer missing.
    pub fn restored(mut self, name: &str, now: &str) -> Self {
        self.restored = Some(name.to_string());
        self.restored_at = Some(now.to_string());
        self.missing = None;
        self.missing_since = None;
        self.later_present = false;
        self
    }

    /// After segment `name` was asked for at `now` and not found (`later_present`: a later
    /// one of its timeline was): the first time it went missing is kept.
    pub fn missed(mut self, name: &str, later_present: bool, now: &str) -> Self {
        if self.missing.as_deref() != Some(name) {
            self.missing = Some(name.to_string());
            self.missing_since = Some(now.to_string());
        }
        self.later_present = later_present;
        self
    }

    /// A gap: a segment missing while a later one is there, for at least `confirm` by
    /// `now` (the archiver uploads a few segments in parallel when it is behind, so a
    /// later one may briefly arrive first).
    pub fn gap(&self, now: jiff::Timestamp, confirm: Duration) -> Option<&str> {
        let since = self
            .missing_since
            .as_deref()?
            .parse::<jiff::Timestamp>()
            .ok()?;
        let long = now.duration_since(since).as_secs()
            >= i64::try_from(confirm.as_secs()).unwrap_or(i64::MAX);
        (self.later_present && long)
            .then_some(self.missing.as_deref())
            .flatten()
    }
}

/// A libpq password file's line for `user` and `password` on any host, port and database
/// (`*:*:*:user:password`, `\` and `:` escaped as libpq reads them); `None` when either
/// holds a line break, which a password file cannot.
pub fn passfile_line(user: &str, password: &str) -> Option<String> {
    let field =
        |v: &str| (!v.contains(['\n', '\r'])).then(|| v.replace('\\', "\\\\").replace(':', "\\:"));
    Some(format!("*:*:*:{}:{}\n", field(user)?, field(password)?))
}

impl Source {
    /// The entry's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the configuration of the entry's store belongs: in the entry's directory
    /// (0700), as `store.json`.
    pub fn store_config_path(&self) -> PathBuf {
        self.home.join("store.json")
    }

    /// Where `restore_command` keeps its [`ArchiveRecord`]: `archive.json` beside it.
    pub fn archive_record_path(&self) -> PathBuf {
        self.home.join("archive.json")
    }

    /// What `restore_command` last did ([`ArchiveRecord`]); `None` without a store.
    pub fn archive_record(&self) -> Option<ArchiveRecord> {
        self.archive
            .as_ref()
            .map(|_| ArchiveRecord::read(&self.archive_record_path()))
    }

    /// Whether the entry has a connection (else it is followed through its store alone).
    pub fn has_connection(&self) -> bool {
        self.connection.is_some()
    }

    /// The store's configuration file and the `pgop` binary, when it has a store.
    pub fn archive(&self) -> Option<(&Path, &Path)> {
        self.archive
            .as_ref()
            .map(|(c, p)| (c.as_path(), p.as_path()))
    }

    /// The same source, with WAL it no longer has read from the entry's store: a
    /// configuration already written at `store_config`, read by `pgop_binary instance
    /// wal-restore` as PostgreSQL's `restore_command` (PostgreSQL's standby loop tries
    /// streaming first, then the archive).
    pub fn with_archive(mut self, store_config: PathBuf, pgop_binary: PathBuf) -> Self {
        self.archive = Some((store_config, pgop_binary));
        self
    }

    /// Whether WAL is also read from the entry's store.
    pub fn has_archive(&self) -> bool {
        self.archive.is_some()
    }

    /// `'<pgop>' instance wal-restore --store-config '<file>' --record '<file>' %f %p`,
    /// quoted for the shell with `%` doubled where PostgreSQL would substitute it; `None`
    /// without a store.
    pub fn restore_command(&self) -> Option<String> {
        let (config, pgop) = self.archive.as_ref()?;
        let arg = |p: &Path| {
            pgop_backup::restore::shell_quote(&p.display().to_string().replace('%', "%%"))
        };
        Some(format!(
            "{} instance wal-restore --store-config {} --record {} %f %p",
            arg(pgop),
            arg(config),
            arg(&self.archive_record_path())
        ))
    }

    /// The connection string PostgreSQL's programs get: host, port, database, user, the
    /// TLS mode and files, the password file, `application_name` and a 5 s connect timeout,
    /// each value quoted for libpq. No password in it.
    ///
    /// Every file libpq would otherwise look for in the home directory of the OS user it
    /// runs as (`~/.postgresql/root.crt`, `postgresql.crt`, `postgresql.key`, `~/.pgpass`)
    /// is named: the entry's own, or one in its directory that does not exist, which libpq
    /// reads as "none". A home directory's certificate is never sent to the outside server,
    /// and `require` never checks the server's certificate, even against an authority
    /// `caSecret` names.
    /// `None` for an entry without a connection.
    pub fn conninfo(&self, application_name: &str) -> Option<String> {
        let c = self.connection.as_ref()?;
        let file = |p: &Path| conninfo_value(&p.display().to_string());
        let none = |what: &str| file(&self.home.join(format!("no-{what}")));
        let ca = match &self.ca {
            Some(ca) if c.ssl_mode.verifies() => file(ca),
            _ => none("authority"),
        };
        let (cert, key) = match &self.client {
            Some((cert, key)) => (file(cert), file(key)),
            None => (none("client-certificate"), none("client-key")),
        };
        let passfile = match &self.passfile {
            Some(passfile) => file(passfile),
            None => none("passfile"),
        };
        [
            format!("host={}", conninfo_value(&c.host)),
            format!("port={}", c.port),
            format!("dbname={}", conninfo_value(&c.dbname)),
            format!("user={}", conninfo_value(&c.user)),
            format!("sslmode={}", c.ssl_mode.as_str()),
            format!("sslrootcert={ca}"),
            format!("sslcert={cert}"),
            format!("sslkey={key}"),
            format!("passfile={passfile}"),
            format!("application_name={}", conninfo_value(application_name)),
            "connect_timeout=5".to_string(),
        ]
        .join(" ")
        .into()
    }

    /// Asks the server who it is over a replication connection (what a standby of it
    /// needs: a role with `REPLICATION`, and pg_hba.conf letting it replicate), with
    /// PostgreSQL's own client (psql, libpq). At most `timeout`.
    pub async fn identify(
        &self,
        binaries: &Binaries,
        run_as: Option<RunAs>,
        application_name: &str,
        timeout: Duration,
    ) -> Result<Identity, Refusal> {
        let Some(conninfo) = self.conninfo(application_name) else {
            return Err(Refusal::Other(
                "the entry has no connection, only a store".into(),
            ));
        };
        let mut cmd = binaries::command(binaries, "psql", run_as);
        cmd.args(["-X", "-A", "-t", "-F", "|", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(format!("{conninfo} replication=database"))
            .args(["-c", "IDENTIFY_SYSTEM", "-c", "SHOW server_version_num"])
            // Whatever the environment says, only the files above.
            .env_remove("PGPASSWORD")
            .env_remove("PGPASSFILE")
            .env_remove("PGSERVICE")
            .env_remove("PGSSLMODE")
            .stdin(std::process::Stdio::null());
        let output = match tokio::time::timeout(timeout, cmd.output()).await {
            Err(_) => {
                return Err(Refusal::Unreachable(format!(
                    "no answer within {} s",
                    timeout.as_secs()
                )));
            }
            Ok(Err(e)) => return Err(Refusal::Other(format!("running psql: {e}"))),
            Ok(Ok(output)) => output,
        };
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        if !output.status.success() {
            return Err(Refusal::of(&stderr));
        }
        Identity::parse(&String::from_utf8_lossy(&output.stdout))
            .ok_or_else(|| Refusal::Other(format!("an answer pgop cannot read: {stderr}")))
    }
}

/// Who a server is: `IDENTIFY_SYSTEM` and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The database system identifier: the same on a primary and every standby cloned
    /// from it, different for any other initdb.
    pub system_identifier: String,
    /// The timeline the server is on.
    pub timeline: u32,
    /// Its current WAL position (flushed, or replayed on a standby).
    pub wal_position: String,
    /// `server_version_num` (`150020`, `180006`).
    pub server_version_num: u32,
}

impl Identity {
    fn parse(stdout: &str) -> Option<Self> {
        let mut lines = stdout.lines().map(str::trim).filter(|l| !l.is_empty());
        let mut system = lines.next()?.split('|');
        let system_identifier = system.next()?.to_string();
        let timeline = system.next()?.parse().ok()?;
        let wal_position = system.next()?.to_string();
        let server_version_num = lines.next()?.parse().ok()?;
        (!system_identifier.is_empty()
            && system_identifier.bytes().all(|b| b.is_ascii_digit())
            && pgop_api::formats::is_lsn(&wal_position))
        .then_some(Self {
            system_identifier,
            timeline,
            wal_position,
            server_version_num,
        })
    }
}

/// Why a server could not be asked, in the words of libpq and the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No connection: the name does not resolve, nothing listens, no answer in time.
    Unreachable(String),
    /// The TLS handshake failed: the certificate does not verify, or the server speaks none.
    Tls(String),
    /// The server refused the login: the password, the certificate, pg_hba.conf.
    Authentication(String),
    /// Logged in, but the role may not replicate.
    NoReplication(String),
    /// Anything else.
    Other(String),
}

impl Refusal {
    /// Sorts psql's error output.
    pub fn of(stderr: &str) -> Self {
        let message = stderr.to_string();
        let has = |needles: &[&str]| needles.iter().any(|n| stderr.contains(n));
        if has(&[
            "must have the REPLICATION",
            "must be superuser or replication role",
            "permission denied to start WAL sender",
        ]) {
            Refusal::NoReplication(message)
        } else if has(&[
            // password and certificate authentication alike
            "authentication failed",
            "no password supplied",
            "no pg_hba.conf entry",
            "pg_hba.conf rejects",
            "requires a valid client certificate",
        ]) {
            Refusal::Authentication(message)
        } else if has(&[
            "certificate verify failed",
            "does not match host name",
            "root certificate",
            // SSL errors, and a server that does not support SSL
            "SSL",
        ]) {
            Refusal::Tls(message)
        } else if has(&[
            "could not translate host name",
            "Connection refused",
            "timeout expired",
            "No route to host",
            "Network is unreachable",
            "could not connect",
        ]) {
            Refusal::Unreachable(message)
        } else {
            Refusal::Other(message)
        }
    }

    /// The reason a condition or Event gives.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Unreachable(_) => "SourceUnreachable",
            Refusal::Tls(_) => "SourceTLSRefused",
            Refusal::Authentication(_) => "SourceAuthenticationFailed",
            Refusal::NoReplication(_) => "SourceNoReplication",
            Refusal::Other(_) => "SourceRefused",
        }
    }

    /// What libpq or the server said.
    pub fn message(&self) -> &str {
        match self {
            Refusal::Unreachable(m)
            | Refusal::Tls(m)
            | Refusal::Authentication(m)
            | Refusal::NoReplication(m)
            | Refusal::Other(m) => m,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason(), self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_record_keeps_the_first_miss_and_calls_a_gap_only_when_confirmed() {
        let t = |s: &str| s.parse::<jiff::Timestamp>().expect("time");
        let r =
            ArchiveRecord::default().restored("000000010000000000000005", "2027-01-15T08:00:00Z");
        assert_eq!(r.restored.as_deref(), Some("000000010000000000000005"));
        // The end of the store: missing, nothing later.
        let r = r.missed("000000010000000000000006", false, "2027-01-15T08:00:01Z");
        assert_eq!(
            r.gap(t("2027-01-15T09:00:00Z"), Duration::from_secs(30)),
            None
        );
        // A later one arrives: a gap once it has lasted 30 s since the first miss.
        let r = r.missed("000000010000000000000006", true, "2027-01-15T08:00:20Z");
        assert_eq!(r.missing_since.as_deref(), Some("2027-01-15T08:00:01Z"));
        assert_eq!(
            r.gap(t("2027-01-15T08:00:21Z"), Duration::from_secs(30)),
            None
        );
        assert_eq!(
            r.gap(t("2027-01-15T08:00:31Z"), Duration::from_secs(30)),
            Some("000000010000000000000006")
        );
        // Restored after all: no gap, no miss.
        let r = r.restored("000000010000000000000006", "2027-01-15T08:01:00Z");
        assert_eq!((r.missing.as_deref(), r.later_present), (None, false));
        // Written and read back whole; an unreadable file reads as nothing recorded.
        let dir = std::env::temp_dir().join(format!("pgop-archive-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("archive.json");
        let r = r.missed("000000010000000000000007", false, "2027-01-15T08:02:00Z");
        r.write(&path).expect("write");
        assert_eq!(ArchiveRecord::read(&path), r);
        std::fs::write(&path, "{not json").expect("write");
        assert_eq!(ArchiveRecord::read(&path), ArchiveRecord::default());
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn connection(yaml: &str) -> ExternalConnection {
        serde_yaml::from_str(yaml).expect("a connection")
    }

    #[test]
    fn the_conninfo_quotes_every_value_and_holds_no_password() {
        let dir = std::env::temp_dir().join(format!("pgop-external-unit-{}", std::process::id()));
        let c = connection(
            "{host: db.site-a.example.com, port: 5433, user: streaming_replica, sslMode: verify-full}",
        );
        let password = r#"p'a ss\:=#$(id)"#;
        let source = prepare(
            &dir,
            "site-a",
            &c,
            &Credentials {
                password: Some(password.into()),
                ca_pem: Some("CA".into()),
                client: Some(("CERT".into(), "KEY".into())),
            },
            None,
        )
        .expect("prepared");
        let home = directory(&dir, "site-a");
        let conninfo = source.conninfo("db-1 'x").expect("a connection");
        assert_eq!(
            conninfo,
            format!(
                "host='db.site-a.example.com' port=5433 dbname='postgres' user='streaming_replica' \
                 sslmode=verify-full sslrootcert='{h}/ca.crt' sslcert='{h}/tls.crt' \
                 sslkey='{h}/tls.key' passfile='{h}/passfile' application_name='db-1 \\'x' \
                 connect_timeout=5",
                h = home.display()
            )
        );
        assert!(!conninfo.contains("p'a"), "no password in {conninfo}");
        let line = std::fs::read_to_string(home.join("passfile")).expect("the passfile");
        assert_eq!(line, "*:*:*:streaming_replica:p'a ss\\\\\\:=#$(id)\n");
        use std::os::unix::fs::PermissionsExt;
        for file in ["passfile", "ca.crt", "tls.crt", "tls.key"] {
            let mode = std::fs::metadata(home.join(file))
                .expect("a file")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{file}");
        }
        let mode = std::fs::metadata(&home)
            .expect("the directory")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);

        // Nothing given, nothing checked: every file libpq would look for in a home
        // directory is named, in the entry's directory, where it does not exist; the
        // authority is not used by `require`.
        let bare = prepare(
            &dir,
            "bare",
            &connection("{host: 10.0.3.7, user: app, sslMode: require}"),
            &Credentials {
                ca_pem: Some("CA".into()),
                ..Credentials::default()
            },
            None,
        )
        .expect("prepared");
        let home = directory(&dir, "bare");
        assert_eq!(
            bare.conninfo("db-1").expect("a connection"),
            format!(
                "host='10.0.3.7' port=5432 dbname='postgres' user='app' sslmode=require \
                 sslrootcert='{h}/no-authority' sslcert='{h}/no-client-certificate' \
                 sslkey='{h}/no-client-key' passfile='{h}/no-passfile' \
                 application_name='db-1' connect_timeout=5",
                h = home.display()
            )
        );
        for absent in [
            "no-authority",
            "no-client-certificate",
            "no-client-key",
            "no-passfile",
        ] {
            assert!(!home.join(absent).exists(), "{absent}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn what_a_file_or_the_api_should_have_refused_is_refused_naming_the_entry() {
        let dir =
            std::env::temp_dir().join(format!("pgop-external-refused-{}", std::process::id()));
        let verify = connection("{host: db, user: app}");
        let require = connection("{host: db, user: app, sslMode: require}");
        let refused = |name: &str, c: &ExternalConnection, credentials: Credentials| {
            prepare(&dir, name, c, &credentials, None)
                .expect_err("refused")
                .to_string()
        };
        let e = refused("site-a", &verify, Credentials::default());
        assert!(e.contains("\"site-a\"") && e.contains("caSecret"), "{e}");
        let e = refused("../x", &require, Credentials::default());
        assert!(e.contains("no DNS label"), "{e}");
        let e = refused(
            "site-a",
            &require,
            Credentials {
                password: Some("a\nb".into()),
                ..Credentials::default()
            },
        );
        assert!(e.contains("line break"), "{e}");
        assert!(!e.contains("a\nb"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn credentials_come_from_the_secrets_the_entry_names_and_a_bad_one_is_named() {
        use k8s_openapi::ByteString;
        use k8s_openapi::api::core::v1::Secret;
        let secret = |name: &str, data: &[(&str, &[u8])]| Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Default::default()
        };
        let secrets = [
            secret("site-a", &[("password", b"s3cr'et\n")]),
            secret("site-a-ca", &[("ca.crt", b"CA PEM")]),
            secret(
                "site-a-client",
                &[("tls.crt", b"CERT"), ("tls.key", b"KEY")],
            ),
            secret("half", &[("tls.crt", b"CERT")]),
            secret("blank", &[("password", b"  ")]),
            secret("binary", &[("password", &[0xff, 0xfe])]),
        ];
        let lookup = |name: &str| {
            secrets
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(name))
        };
        let c = connection(
            "{host: db, user: streaming_replica, passwordSecret: {name: site-a}, \
             caSecret: {name: site-a-ca}, clientCertificateSecret: {name: site-a-client}}",
        );
        let got = Credentials::from_secrets(&c, lookup).expect("read");
        assert_eq!(
            got,
            Credentials {
                password: Some("s3cr'et".into()),
                ca_pem: Some("CA PEM".into()),
                client: Some(("CERT".into(), "KEY".into())),
            }
        );
        assert!(!format!("{got:?}").contains("s3cr"), "{got:?}");
        let refused =
            |yaml: &str| Credentials::from_secrets(&connection(yaml), lookup).expect_err("refused");
        let e = refused("{host: db, user: u, sslMode: require, passwordSecret: {name: gone}}");
        assert!(
            e.starts_with("connection.passwordSecret: Secret \"gone\" does not exist"),
            "{e}"
        );
        let e = refused(
            "{host: db, user: u, sslMode: require, passwordSecret: {name: site-a, key: pw}}",
        );
        assert!(e.contains("has no key \"pw\""), "{e}");
        let e =
            refused("{host: db, user: u, sslMode: require, clientCertificateSecret: {name: half}}");
        assert!(
            e.starts_with("connection.clientCertificateSecret") && e.contains("tls.key"),
            "{e}"
        );
        let e = refused("{host: db, user: u, sslMode: require, passwordSecret: {name: blank}}");
        assert!(e.contains("is empty"), "{e}");
        let e = refused("{host: db, user: u, sslMode: require, passwordSecret: {name: binary}}");
        assert!(e.contains("not UTF-8"), "{e}");
    }

    #[test]
    fn psql_s_errors_are_sorted_by_what_to_do_about_them() {
        let cases = [
            (
                "psql: error: connection to server at \"127.0.0.1\", port 1 failed: Connection refused",
                "SourceUnreachable",
            ),
            (
                "psql: error: could not translate host name \"nope\" to address: Name or service not known",
                "SourceUnreachable",
            ),
            (
                "psql: error: connection to server at \"localhost\" (127.0.0.1), port 5432 failed: SSL error: certificate verify failed",
                "SourceTLSRefused",
            ),
            (
                "psql: error: connection to server at \"localhost\" (127.0.0.1), port 5432 failed: FATAL:  password authentication failed for user \"app\"",
                "SourceAuthenticationFailed",
            ),
            (
                "psql: error: connection to server failed: FATAL:  no pg_hba.conf entry for replication connection from host \"127.0.0.1\", user \"app\", SSL encryption",
                "SourceAuthenticationFailed",
            ),
            (
                "psql: error: connection to server at \"localhost\" (127.0.0.1), port 5432 failed: FATAL:  connection requires a valid client certificate",
                "SourceAuthenticationFailed",
            ),
            (
                "psql: error: connection to server failed: FATAL:  permission denied to start WAL sender\nDETAIL:  Only roles with the REPLICATION attribute may start a WAL sender process.",
                "SourceNoReplication",
            ),
            ("psql: error: something else entirely", "SourceRefused"),
        ];
        for (stderr, reason) in cases {
            assert_eq!(Refusal::of(stderr).reason(), reason, "{stderr}");
        }
    }

    #[test]
    fn identify_system_s_answer_is_read_and_nothing_else() {
        assert_eq!(
            Identity::parse("7312345678901234567|1|0/3000148|postgres\n150020\n"),
            Some(Identity {
                system_identifier: "7312345678901234567".into(),
                timeline: 1,
                wal_position: "0/3000148".into(),
                server_version_num: 150020,
            })
        );
        assert_eq!(Identity::parse(""), None);
        assert_eq!(Identity::parse("x|1|0/1|postgres\n150020\n"), None);
        assert_eq!(Identity::parse("1|1|nope|postgres\n150020\n"), None);
        assert_eq!(Identity::parse("1|1|0/1|postgres\n"), None);
    }
}
