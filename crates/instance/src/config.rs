//! postgresql.conf and pg_hba.conf, rendered from the cluster spec: pgop-owned parameters
//! (listening, replication, synchronous standbys) always win; user parameters are validated
//! against the running server's `pg_settings` first. It must never write a parameter the
//! server would reject: a rejected one is reported and its last good value kept.
//!
//! Defence in depth: whatever the API server let through, [`render_postgresql_conf`] and
//! [`render_pg_hba`] are the only writers of the two files, and they never write a name,
//! value or rule that could change a file's structure (a line break, a `=` or `#` in a
//! name, an `include` directive, a parameter pgop owns, a pg_hba rule outside pgop's
//! grammar). [`validate`] reports the same entries under `invalidParameters`.
//!
//! Why this file stays whole: it is one idea, PostgreSQL's configuration from the spec to
//! the server: what the manager writes (postgresql.conf, pg_hba.conf, the TLS files
//! postgresql.conf names), the check of user parameters against `pg_settings` before they
//! are written, and what the server says after a reload (refused entries, restarts
//! pending); about 255 of its lines are the unit tests.

use crate::pg::sql::{SUPERUSER, quote_ident};
use crate::pg::{RunAs, Upstream, sql};
pub use crate::status::InvalidParameter;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_postgres::Client;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to write {path}")]
    WriteFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to read pg_settings")]
    ReadSettings(#[source] tokio_postgres::Error),
    #[error("failed to reload the configuration")]
    Reload(#[source] tokio_postgres::Error),
    #[error("failed to see the configuration reloaded within {0:?}")]
    ReloadTimeout(Duration),
    #[error("failed to read pending restarts")]
    ReadPendingRestart(#[source] tokio_postgres::Error),
    #[error("failed to read pg_file_settings")]
    ReadFileSettings(#[source] tokio_postgres::Error),
}

/// Where a standby's replication password is kept: a password file in the socket
/// directory (a per-Pod volume), outside PGDATA, which base backups and clones copy.
pub fn passfile_path(layout: &Layout) -> PathBuf {
    layout.socket_dir.join("pgop-replication.pgpass")
}

/// PostgreSQL's TLS material (PEM), as the cluster's Secrets hold it.
#[derive(Clone, PartialEq, Eq)]
pub struct Tls {
    pub server_cert: String,
    pub server_key: String,
    /// The authority of the server certificate: verifies the other instances'.
    pub server_ca: String,
    /// The authorities PostgreSQL accepts client certificates from (`ssl_ca_file`): the
    /// cluster's own (the replication certificate's), and `spec.tls.clientCASecret`'s.
    pub client_ca: String,
    /// The replication user's client certificate and key.
    pub replication_cert: String,
    pub replication_key: String,
    /// The name instances verify in each other's certificate (`<cluster>-rw`).
    pub server_name: String,
    /// Whether clients may connect without TLS (`spec.tls.allowPlaintext`).
    pub allow_plaintext: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .field("allow_plaintext", &self.allow_plaintext)
            .finish_non_exhaustive()
    }
}

/// Where PostgreSQL's TLS files are: in the socket directory (a per-Pod volume private to
/// PostgreSQL's OS user), outside PGDATA, so that no base backup or clone copies a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub server_ca: PathBuf,
    pub client_ca: PathBuf,
    pub replication_cert: PathBuf,
    pub replication_key: PathBuf,
}

pub fn tls_files(layout: &Layout) -> TlsFiles {
    let file = |name: &str| layout.socket_dir.join(format!("pgop-tls-{name}"));
    TlsFiles {
        server_cert: file("server.crt"),
        server_key: file("server.key"),
        server_ca: file("ca.crt"),
        client_ca: file("client-ca.crt"),
        replication_cert: file("replication.crt"),
        replication_key: file("replication.key"),
    }
}

/// Writes the TLS files (mode 0600, owned by PostgreSQL's OS user); PostgreSQL reads them
/// again at its next reload.
pub fn write_tls(layout: &Layout, tls: &Tls, run_as: Option<RunAs>) -> Result<(), Error> {
    let files = tls_files(layout);
    std::fs::create_dir_all(&layout.socket_dir).map_err(|source| Error::WriteFile {
        path: layout.socket_dir.clone(),
        source,
    })?;
    for (path, content) in [
        (&files.server_ca, &tls.server_ca),
        (&files.client_ca, &tls.client_ca),
        (&files.server_cert, &tls.server_cert),
        (&files.server_key, &tls.server_key),
        (&files.replication_cert, &tls.replication_cert),
        (&files.replication_key, &tls.replication_key),
    ] {
        write_file(path, content, run_as)?;
    }
    Ok(())
}

/// Where the instance listens and what it is called: the parts of the config that come
/// from the pod, not from the spec.
#[derive(Debug, Clone)]
pub struct Layout {
    pub instance: String,
    pub cluster: String,
    pub pgdata: PathBuf,
    pub listen_addresses: String,
    pub port: u16,
    pub socket_dir: PathBuf,
    /// The WAL volume's directory (`spec.walStorage`): `PGDATA/pg_wal` is made a link to
    /// `<wal_dir>/pg_wal` before PostgreSQL starts ([`crate::pg::waldir`]). `None`: the
    /// WAL stays in PGDATA.
    pub wal_dir: Option<PathBuf>,
}

/// The role the configuration is rendered for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Primary,
    Standby {
        upstream: Upstream,
    },
    /// A replica cluster's designated primary: a standby of the outside source
    /// (`spec.replica`), streaming over the entry's connection without a slot (the source
    /// is not pgop's to create one on).
    DesignatedPrimary {
        source: Box<crate::external::Source>,
    },
}

impl Mode {
    /// Whether PostgreSQL runs in recovery (`standby.signal`), following an upstream.
    pub fn is_standby(&self) -> bool {
        !matches!(self, Mode::Primary)
    }
}

/// The `application_name` a designated primary streams from its source under: never an
/// instance name of pgop's (those have no `:`), so that the source never counts it among
/// its own synchronous standbys, even where both clusters have the same name.
pub fn replica_application_name(instance: &str) -> String {
    format!("replica-cluster:{instance}")
}

/// Defaults pgop picks that a user may override.
const DEFAULTS: &[(&str, &str)] = &[
    ("logging_collector", "off"),
    ("log_destination", "stderr"),
    ("hot_standby_feedback", "on"),
    ("password_encryption", "scram-sha-256"),
    // A standby whose upstream was just promoted (it follows the failover target) retries
    // its connection after 1 s rather than 5: with synchronous replication the new
    // primary's first commit waits for it.
    ("wal_retrieve_retry_interval", "1s"),
];

/// Defaults while WAL is archived: a WAL file at least every minute, so that the archive
/// (and point-in-time recovery) is never more than a minute behind on a quiet server.
const ARCHIVING_DEFAULTS: &[(&str, &str)] = &[("archive_timeout", "60s")];

/// The parameters pgop owns, for this layout, mode and `synchronous_standby_names`.
pub fn owned_parameters(
    layout: &Layout,
    mode: &Mode,
    sync_names: &str,
    archive_command: Option<&str>,
    tls: bool,
) -> Vec<(String, String)> {
    let mut params = vec![
        ("listen_addresses", layout.listen_addresses.clone()),
        ("port", layout.port.to_string()),
        (
            "unix_socket_directories",
            layout.socket_dir.display().to_string(),
        ),
        ("wal_level", "replica".into()),
        ("hot_standby", "on".into()),
        ("wal_log_hints", "on".into()),
        ("full_page_writes", "on".into()),
        ("max_wal_senders", "10".into()),
        ("max_replication_slots", "10".into()),
        ("cluster_name", layout.cluster.clone()),
        ("synchronous_standby_names", sync_names.to_string()),
    ];
    // TLS 1.2 or later with the cluster's certificate; clients' certificates are checked
    // against the cluster's authority (replication logs in with one).
    if tls {
        let files = tls_files(layout);
        let path = |p: &Path| p.display().to_string();
        params.push(("ssl", "on".into()));
        params.push(("ssl_cert_file", path(&files.server_cert)));
        params.push(("ssl_key_file", path(&files.server_key)));
        params.push(("ssl_ca_file", path(&files.client_ca)));
        params.push(("ssl_min_protocol_version", "TLSv1.2".into()));
    }
    match mode {
        Mode::Primary => {}
        Mode::Standby { upstream } => {
            params.push((
                "primary_conninfo",
                upstream.conninfo_with_passfile(&layout.instance, &passfile_path(layout)),
            ));
            params.push(("primary_slot_name", sql::slot_name(&layout.instance)));
        }
        Mode::DesignatedPrimary { source } => {
            // Empty for an entry with a store only: PostgreSQL then reads WAL from the
            // store alone (restore_command, retried every wal_retrieve_retry_interval).
            params.push((
                "primary_conninfo",
                source
                    .conninfo(&replica_application_name(&layout.instance))
                    .unwrap_or_default(),
            ));
            params.push(("primary_slot_name", String::new()));
            // The entry's store, for WAL the source no longer has.
            if let Some(command) = source.restore_command() {
                params.push(("restore_command", command));
            }
        }
    }
    // WAL archiving to the backup store (spec.backup.store). A standby archives too
    // (`on`, not `always`): only once promoted, so that a new primary picks up at once.
    match archive_command {
        Some(command) => {
            params.push(("archive_mode", "on".into()));
            params.push(("archive_command", command.to_string()));
        }
        None => params.push(("archive_mode", "off".into())),
    }
    params
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn is_owned(name: &str) -> bool {
    pgop_api::cluster::is_owned_parameter(name)
}

/// Why a user parameter may never reach postgresql.conf, whatever the server says of it:
/// its name is no parameter name (it could add a line or a directive), pgop owns it or
/// refuses it, or its value could end the line. `None` for a parameter that may be
/// checked further.
pub fn refused(name: &str, value: &str) -> Option<String> {
    use pgop_api::formats;
    if !formats::is_parameter_name(name) {
        Some(format!(
            "not a parameter name (letters, digits and '_', at most one '.', at most {} \
             characters): it could change the structure of postgresql.conf",
            formats::MAX_PARAMETER_NAME_LENGTH
        ))
    } else if is_owned(name) {
        Some("managed by pgop".into())
    } else if pgop_api::cluster::is_unsupported_parameter(name) {
        Some("refused by pgop (an include directive, or TLS, which pgop configures itself)".into())
    } else if !formats::is_parameter_value(value) {
        Some(format!(
            "the value has a line break or another control character, or is longer than {} \
             characters: it could change the structure of postgresql.conf",
            formats::MAX_PARAMETER_VALUE_LENGTH
        ))
    } else {
        None
    }
}

/// postgresql.conf: pgop's defaults, then the (validated) user parameters, then pgop's own.
/// Later lines win in PostgreSQL, and owned names are also filtered out of the user's.
pub fn render_postgresql_conf(
    layout: &Layout,
    mode: &Mode,
    sync_names: &str,
    archive_command: Option<&str>,
    tls: bool,
    user: &BTreeMap<String, String>,
) -> String {
    let mut out = String::from("# Written by pgop; edits are overwritten.\n\n# Defaults\n");
    let archiving_defaults: &[(&str, &str)] = if archive_command.is_some() {
        ARCHIVING_DEFAULTS
    } else {
        &[]
    };
    for (name, value) in DEFAULTS.iter().chain(archiving_defaults) {
        if !user.keys().any(|k| k.eq_ignore_ascii_case(name)) {
            out.push_str(&line(name, value));
        }
    }
    out.push_str("\n# spec.postgresql.parameters\n");
    for (name, value) in user {
        match refused(name, value) {
            None => out.push_str(&line(name, value)),
            Some(reason) => {
                tracing::warn!(parameter = ?name, reason, "left out of postgresql.conf");
            }
        }
    }
    out.push_str("\n# Owned by pgop\n");
    for (name, value) in owned_parameters(layout, mode, sync_names, archive_command, tls) {
        out.push_str(&line(&name, &value));
    }
    out
}

/// One `name = 'value'` line. PostgreSQL reads a quoted value with backslash escapes and
/// `''` for a quote; names and values reaching here passed [`refused`] (or are pgop's own).
fn line(name: &str, value: &str) -> String {
    format!(
        "{name} = '{}'\n",
        value.replace('\\', "\\\\").replace('\'', "''")
    )
}

/// pg_hba.conf: the manager over the socket, replication (with a client certificate over
/// TLS when `tls` is given, else with a password), no superuser over the network (but
/// with `superuser_access`: with a password over TLS only), no
/// connection without TLS unless `tls` allows plaintext, the user's rules, then password
/// access for everyone else. A user rule outside pgop's grammar
/// ([`pgop_api::formats::is_hba_line`]: one line, a known type and method, no `@file`) is
/// left out. `tls`: `Some(allow_plaintext)` when PostgreSQL serves TLS.
pub fn render_pg_hba(
    extra: &[String],
    replication_user: &str,
    tls: Option<bool>,
    superuser_access: bool,
) -> String {
    let mut out = String::from("# Written by pgop; edits are overwritten.\n");
    // The socket directory is private to PostgreSQL's OS user: only the manager gets here.
    out.push_str(&format!("local all {} trust\n", quote_ident(SUPERUSER)));
    out.push_str(&format!(
        "local replication {} trust\n",
        quote_ident(SUPERUSER)
    ));
    let replication = quote_ident(replication_user);
    match tls {
        // Standbys (streaming, pg_basebackup, pg_rewind and the manager's check of its
        // primary) log in with the certificate the operator issued for this user, never
        // with a password.
        Some(_) => out.push_str(&format!(
            "hostssl replication {replication} all cert\nhostssl all {replication} all cert\n\
             host replication {replication} all reject\nhost all {replication} all reject\n"
        )),
        None => out.push_str(&format!(
            "host replication {replication} all scram-sha-256\n"
        )),
    }
    // The superuser connects over the socket, and over the network only with
    // spec.credentials.superuserAccess, with its password, over TLS: no rule below may let
    // it in otherwise (a `trust` rule for `all` users would).
    let su = quote_ident(SUPERUSER);
    if superuser_access && tls.is_some() {
        out.push_str(&format!("hostssl all {su} all scram-sha-256\n"));
    }
    out.push_str(&format!(
        "host all {su} all reject\nhost replication {su} all reject\n"
    ));
    if tls == Some(false) {
        // spec.tls.allowPlaintext is off: whatever the user's rules say.
        out.push_str("hostnossl all all all reject\nhostnossl replication all all reject\n");
    }
    out.push_str("\n# spec.postgresql.pgHba\n");
    for rule in extra {
        if hba_rule_refused(rule) {
            tracing::warn!(rule = ?rule, "pg_hba rule left out of pg_hba.conf");
            continue;
        }
        out.push_str(rule);
        out.push('\n');
    }
    out.push_str("\nlocal all all scram-sha-256\nhost all all all scram-sha-256\n");
    out
}

/// Whether a pg_hba rule may never reach pg_hba.conf (see [`render_pg_hba`]).
pub fn hba_rule_refused(rule: &str) -> bool {
    rule.chars().count() > pgop_api::formats::MAX_HBA_LINE_LENGTH
        || !pgop_api::formats::is_hba_line(rule)
}

/// Writes a file PostgreSQL reads: a temp file, chowned, renamed into place.
pub fn write_file(path: &Path, content: &str, run_as: Option<RunAs>) -> Result<(), Error> {
    let write = || -> std::io::Result<()> {
        let tmp = path.with_extension("pgop-tmp");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(content.as_bytes())?;
        file.sync_all()?;
        if let Some(user) = run_as {
            user.chown(&tmp)?;
        }
        std::fs::rename(&tmp, path)
    };
    write().map_err(|source| Error::WriteFile {
        path: path.to_path_buf(),
        source,
    })
}

/// What `pg_settings` says about one parameter.
#[derive(Debug, Clone)]
pub struct Setting {
    pub name: String,
    pub vartype: String,
    pub context: String,
    pub unit: Option<String>,
    pub min_val: Option<String>,
    pub max_val: Option<String>,
    pub enumvals: Vec<String>,
}

/// All of the server's settings, by lower-case name.
pub async fn settings(client: &Client) -> Result<BTreeMap<String, Setting>, Error> {
    let rows = client
        .query(
            "SELECT name, vartype, context, unit, min_val, max_val, enumvals FROM pg_settings",
            &[],
        )
        .await
        .map_err(Error::ReadSettings)?;
    let mut out = BTreeMap::new();
    for row in rows {
        let setting = Setting {
            name: row.try_get(0).map_err(Error::ReadSettings)?,
            vartype: row.try_get(1).map_err(Error::ReadSettings)?,
            context: row.try_get(2).map_err(Error::ReadSettings)?,
            unit: row.try_get(3).map_err(Error::ReadSettings)?,
            min_val: row.try_get(4).map_err(Error::ReadSettings)?,
            max_val: row.try_get(5).map_err(Error::ReadSettings)?,
            enumvals: row
                .try_get::<_, Option<Vec<String>>>(6)
                .map_err(Error::ReadSettings)?
                .unwrap_or_default(),
        };
        out.insert(setting.name.to_ascii_lowercase(), setting);
    }
    Ok(out)
}

/// Splits the user's parameters into the ones the server accepts and the ones it would
/// not. Parameters a session may set are tried with `set_config` in a rolled-back
/// transaction (the server's own check); the others are checked by type, range and enum.
pub async fn validate(
    client: &mut Client,
    user: &BTreeMap<String, String>,
) -> Result<(BTreeMap<String, String>, Vec<InvalidParameter>), Error> {
    let known = settings(client).await?;
    let mut valid = BTreeMap::new();
    let mut invalid = Vec::new();
    for (name, value) in user {
        let reject = |reason: String| InvalidParameter {
            name: name.clone(),
            value: value.clone(),
            reason,
        };
        if let Some(reason) = refused(name, value) {
            invalid.push(reject(reason));
            continue;
        }
        let Some(setting) = known.get(&name.to_ascii_lowercase()) else {
            // Dotted names belong to extensions, which PostgreSQL accepts as placeholders.
            if name.contains('.') {
                valid.insert(name.clone(), value.clone());
            } else {
                invalid.push(reject("unknown parameter".into()));
            }
            continue;
        };
        if let Err(reason) = check_value(setting, value) {
            invalid.push(reject(reason));
            continue;
        }
        if matches!(setting.context.as_str(), "user" | "superuser")
            && let Err(reason) = try_set(client, &setting.name, value).await
        {
            invalid.push(reject(reason));
            continue;
        }
        valid.insert(setting.name.clone(), value.clone());
    }
    Ok((valid, invalid))
}

/// The server's own check of a session-settable value, rolled back.
async fn try_set(client: &mut Client, name: &str, value: &str) -> Result<(), String> {
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    let result = tx
        .query("SELECT set_config($1, $2, true)", &[&name, &value])
        .await;
    let _ = tx.rollback().await;
    result.map(|_| ()).map_err(|e| match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => e.to_string(),
    })
}

/// Checks a value against a setting's type, unit, range and enum values.
pub fn check_value(setting: &Setting, value: &str) -> Result<(), String> {
    let value = value.trim();
    match setting.vartype.as_str() {
        _ if setting.context == "internal" => Err("cannot be set".into()),
        "bool" => parse_bool(value)
            .map(|_| ())
            .ok_or_else(|| format!("{value:?} is not a boolean")),
        "enum" => {
            if setting
                .enumvals
                .iter()
                .any(|v| v.eq_ignore_ascii_case(value))
            {
                Ok(())
            } else {
                Err(format!(
                    "{value:?} is not one of {}",
                    setting.enumvals.join(", ")
                ))
            }
        }
        "integer" | "real" => {
            let number = parse_number(value, setting.unit.as_deref())?;
            let number = if setting.vartype == "integer" {
                number.round()
            } else {
                number
            };
            let bound = |b: &Option<String>| b.as_deref().and_then(|b| b.parse::<f64>().ok());
            if let Some(min) = bound(&setting.min_val)
                && number < min
            {
                return Err(format!("{value:?} is below the minimum {min}"));
            }
            if let Some(max) = bound(&setting.max_val)
                && number > max
            {
                return Err(format!("{value:?} is above the maximum {max}"));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// PostgreSQL's boolean spellings (including unambiguous prefixes).
fn parse_bool(value: &str) -> Option<bool> {
    let v = value.to_ascii_lowercase();
    let prefix_of = |word: &str, min: usize| v.len() >= min && word.starts_with(&v);
    if v == "1" || v == "on" || prefix_of("true", 1) || prefix_of("yes", 1) {
        Some(true)
    } else if v == "0" || prefix_of("off", 2) || prefix_of("false", 1) || prefix_of("no", 1) {
        Some(false)
    } else {
        None
    }
}

/// Memory units in bytes and time units in microseconds, as PostgreSQL spells them.
fn unit_scale(unit: &str) -> Option<(char, f64)> {
    Some(match unit {
        "B" => ('m', 1.0),
        "kB" => ('m', 1024.0),
        "MB" => ('m', 1024.0 * 1024.0),
        "GB" => ('m', 1024.0 * 1024.0 * 1024.0),
        "TB" => ('m', 1024.0 * 1024.0 * 1024.0 * 1024.0),
        "us" => ('t', 1.0),
        "ms" => ('t', 1e3),
        "s" => ('t', 1e6),
        "min" => ('t', 60e6),
        "h" => ('t', 3600e6),
        "d" => ('t', 86400e6),
        _ => return None,
    })
}

/// A number with an optional unit, in the setting's base unit (`8kB`, `ms`, ...).
fn parse_number(value: &str, base_unit: Option<&str>) -> Result<f64, String> {
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(value.len());
    let (digits, unit) = (value[..split].trim(), value[split..].trim());
    let number: f64 = digits
        .parse()
        .map_err(|_| format!("{value:?} is not a number"))?;
    if unit.is_empty() {
        return Ok(number);
    }
    let base = base_unit.ok_or_else(|| format!("{value:?}: this parameter takes no unit"))?;
    // A base unit may carry a multiplier: "8kB", "16MB".
    let base_split = base.find(|c: char| !c.is_ascii_digit()).unwrap_or(0);
    let base_mult: f64 = base[..base_split].parse().unwrap_or(1.0);
    let (base_kind, base_scale) =
        unit_scale(&base[base_split..]).ok_or_else(|| format!("unknown base unit {base:?}"))?;
    let (kind, scale) =
        unit_scale(unit).ok_or_else(|| format!("{value:?}: unknown unit {unit:?}"))?;
    if kind != base_kind {
        return Err(format!("{value:?}: wrong kind of unit"));
    }
    Ok(number * scale / (base_scale * base_mult))
}

/// Reloads the configuration and waits until new sessions see it.
pub async fn reload(client: &Client) -> Result<(), Error> {
    let row = client
        .query_one("SELECT pg_conf_load_time()::text", &[])
        .await
        .map_err(Error::Reload)?;
    let before: String = row.try_get(0).map_err(Error::Reload)?;
    client
        .simple_query("SELECT pg_reload_conf()")
        .await
        .map_err(Error::Reload)?;
    // The postmaster rereads the files asynchronously; a new backend inherits its load time.
    let timeout = Duration::from_secs(10);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let row = client
            .query_one("SELECT pg_conf_load_time()::text", &[])
            .await
            .map_err(Error::Reload)?;
        // This session rereads the files at its next command after the SIGHUP.
        let now: String = row.try_get(0).map_err(Error::Reload)?;
        if now != before {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::ReloadTimeout(timeout));
        }
    }
}

/// The entries of postgresql.conf that PostgreSQL refused when it last read the file
/// (`pg_file_settings.error`), other than values that only wait for a restart. A file it
/// could not parse at all shows as one entry named `postgresql.conf`.
pub async fn file_errors(client: &Client) -> Result<Vec<InvalidParameter>, Error> {
    let rows = client
        .query(
            "SELECT COALESCE(name, 'postgresql.conf'), COALESCE(setting, ''), error \
             FROM pg_file_settings \
             WHERE error IS NOT NULL AND error <> 'setting could not be applied' \
             ORDER BY seqno",
            &[],
        )
        .await
        .map_err(Error::ReadFileSettings)?;
    rows.iter()
        .map(|r| {
            Ok(InvalidParameter {
                name: r.try_get(0).map_err(Error::ReadFileSettings)?,
                value: r.try_get(1).map_err(Error::ReadFileSettings)?,
                reason: format!(
                    "PostgreSQL refused it: {}",
                    r.try_get::<_, String>(2).map_err(Error::ReadFileSettings)?
                ),
            })
        })
        .collect()
}

/// Parameters whose new value waits for a restart.
pub async fn pending_restart(client: &Client) -> Result<Vec<String>, Error> {
    let rows = client
        .query(
            "SELECT name FROM pg_settings WHERE pending_restart ORDER BY name",
            &[],
        )
        .await
        .map_err(Error::ReadPendingRestart)?;
    rows.iter()
        .map(|r| r.try_get(0).map_err(Error::ReadPendingRestart))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(vartype: &str, unit: Option<&str>, min: &str, max: &str) -> Setting {
        Setting {
            name: "x".into(),
            vartype: vartype.into(),
            context: "user".into(),
            unit: unit.map(Into::into),
            min_val: Some(min.into()),
            max_val: Some(max.into()),
            enumvals: vec!["on".into(), "off".into(), "local".into()],
        }
    }

    #[test]
    fn numbers_with_units_are_checked_in_the_base_unit() {
        let shared_buffers = setting("integer", Some("8kB"), "16", "1073741823");
        assert!(check_value(&shared_buffers, "128MB").is_ok());
        assert!(check_value(&shared_buffers, "64kB").is_err());
        assert!(check_value(&shared_buffers, "lots").is_err());
        assert!(check_value(&shared_buffers, "10s").is_err());
        let timeout = setting("integer", Some("ms"), "0", "2147483647");
        assert!(check_value(&timeout, "5min").is_ok());
        assert!(check_value(&timeout, "-1").is_err());
    }

    #[test]
    fn booleans_and_enums() {
        let b = setting("bool", None, "", "");
        for ok in ["on", "off", "true", "f", "yes", "0"] {
            assert!(check_value(&b, ok).is_ok(), "{ok}");
        }
        assert!(check_value(&b, "maybe").is_err());
        let e = setting("enum", None, "", "");
        assert!(check_value(&e, "LOCAL").is_ok());
        assert!(check_value(&e, "remote").is_err());
    }

    #[test]
    fn archiving_owns_archive_mode_and_command_and_defaults_the_timeout() {
        let layout = layout();
        let command = "'/pgop' instance wal-archive --store-config '/run/x.json' %p";
        let none = BTreeMap::new();
        let conf = render_postgresql_conf(&layout, &Mode::Primary, "", Some(command), false, &none);
        assert!(conf.contains("archive_mode = 'on'"), "{conf}");
        assert!(
            conf.contains(
                "archive_command = '''/pgop'' instance wal-archive --store-config ''/run/x.json'' %p'"
            ),
            "{conf}"
        );
        assert!(conf.contains("archive_timeout = '60s'"), "{conf}");
        let user = BTreeMap::from([("archive_timeout".to_string(), "5min".to_string())]);
        let conf = render_postgresql_conf(&layout, &Mode::Primary, "", Some(command), false, &user);
        assert!(
            !conf.contains("'60s'") && conf.contains("archive_timeout = '5min'"),
            "{conf}"
        );
        let conf = render_postgresql_conf(&layout, &Mode::Primary, "", None, false, &none);
        assert!(
            conf.contains("archive_mode = 'off'") && !conf.contains("archive_command"),
            "{conf}"
        );
    }

    #[test]
    fn owned_parameters_win_and_values_are_quoted() {
        let layout = Layout {
            instance: "demo-2".into(),
            listen_addresses: "10.0.0.2".into(),
            ..layout()
        };
        let user = BTreeMap::from([
            ("port".to_string(), "1".to_string()),
            ("search_path".to_string(), "it's".to_string()),
        ]);
        let conf =
            render_postgresql_conf(&layout, &Mode::Primary, "ANY 1 (\"a\")", None, false, &user);
        assert!(!conf.contains("port = '1'"));
        assert!(conf.contains("port = '5432'"));
        assert!(conf.contains("search_path = 'it''s'"));
        assert!(conf.contains("synchronous_standby_names = 'ANY 1 (\"a\")'"));
        let hba = render_pg_hba(
            &[
                "host all all 10.0.0.0/8 md5\nhost all all all trust".into(),
                "host all app 10.0.0.0/8 md5".into(),
            ],
            "streaming_replica",
            None,
            false,
        );
        assert!(!hba.contains("trust\n\n"), "{hba}");
        assert!(!hba.contains("host all all all trust"), "{hba}");
        assert!(hba.contains("\nhost all app 10.0.0.0/8 md5\n"), "{hba}");
    }

    fn layout() -> Layout {
        Layout {
            instance: "demo-1".into(),
            cluster: "demo".into(),
            pgdata: "/data".into(),
            listen_addresses: "10.0.0.1".into(),
            port: 5432,
            socket_dir: "/run/postgresql".into(),
            wal_dir: None,
        }
    }

    /// What PostgreSQL's configuration lexer would see as the start of each setting: every
    /// line that is neither blank nor a comment starts with a name and ` = '`.
    fn setting_names(conf: &str) -> Vec<String> {
        conf.lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (name, rest) = l.split_once(" = '").expect("name = 'value'");
                assert!(rest.ends_with('\''), "one quoted value per line: {l}");
                name.to_string()
            })
            .collect()
    }

    #[test]
    fn hostile_parameters_never_reach_postgresql_conf() {
        let hostile = [
            ("pgop.x = 'y'\narchive_cleanup_command", "touch /tmp/pwned"),
            ("work_mem = '1'\nport", "1"),
            ("a#b", "1"),
            ("", "1"),
            ("include", "/etc/passwd"),
            ("include_if_exists", "/etc/passwd"),
            ("INCLUDE_DIR", "/tmp"),
            ("ssl", "on"),
            ("ssl_passphrase_command", "id"),
            ("Archive_Cleanup_Command", "id"),
            ("application_name", "x\nport = '5433'"),
            ("search_path", "x\r\nlisten_addresses = '*'"),
            ("statement_timeout", "1\u{0}"),
            ("w\u{43e}rk_mem", "1MB"),
        ];
        let user: BTreeMap<String, String> = hostile
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([
                ("work_mem".to_string(), "8MB".to_string()),
                ("log_line_prefix".to_string(), "%m [%p] '\\' ".to_string()),
            ])
            .collect();
        let conf = render_postgresql_conf(&layout(), &Mode::Primary, "", None, false, &user);
        let names = setting_names(&conf);
        for (name, value) in hostile {
            assert!(refused(name, value).is_some(), "{name:?} = {value:?}");
            assert!(!names.iter().any(|n| n == name), "{name:?} in {conf}");
        }
        for owned in ["archive_cleanup_command", "port", "listen_addresses"] {
            assert!(
                names
                    .iter()
                    .filter(|n| n.eq_ignore_ascii_case(owned))
                    .count()
                    <= 1,
                "{owned} set twice: {conf}"
            );
        }
        assert!(!conf.contains("pwned") && !conf.contains("5433") && !conf.contains("'*'"));
        assert!(conf.contains("work_mem = '8MB'\n"), "{conf}");
        assert!(
            conf.contains("log_line_prefix = '%m [%p] ''\\\\'' '\n"),
            "{conf}"
        );
    }

    #[test]
    fn the_superuser_is_refused_over_the_network_before_any_user_rule() {
        let hba = render_pg_hba(
            &[
                "host all all 0.0.0.0/0 trust".into(),
                "host @dbs all all md5".into(),
            ],
            "streaming_replica",
            None,
            true,
        );
        assert!(
            !hba.contains("hostssl all \"postgres\""),
            "without TLS, no password login as the superuser even with superuserAccess: {hba}"
        );
        let reject = hba
            .find("host all \"postgres\" all reject")
            .expect("superuser rejected");
        let user = hba
            .find("host all all 0.0.0.0/0 trust")
            .expect("user rule kept");
        assert!(reject < user, "{hba}");
        assert!(
            hba.contains("host replication \"postgres\" all reject\n"),
            "{hba}"
        );
        assert!(!hba.contains('@'), "{hba}");
    }

    #[test]
    fn with_tls_replication_needs_a_certificate_and_plaintext_is_refused_before_user_rules() {
        let rules = ["host all all 0.0.0.0/0 scram-sha-256".to_string()];
        let hba = render_pg_hba(&rules, "streaming_replica", Some(false), false);
        let position = |line: &str| {
            hba.find(&format!("{line}\n"))
                .unwrap_or_else(|| panic!("{line:?} missing from:\n{hba}"))
        };
        let cert = position("hostssl replication \"streaming_replica\" all cert");
        position("hostssl all \"streaming_replica\" all cert");
        let no_password = position("host replication \"streaming_replica\" all reject");
        let plaintext = position("hostnossl all all all reject");
        let user = position("host all all 0.0.0.0/0 scram-sha-256");
        assert!(cert < no_password && no_password < user, "{hba}");
        assert!(plaintext < user, "{hba}");
        assert!(
            !hba.contains("streaming_replica\" all scram-sha-256"),
            "{hba}"
        );

        let allowed = render_pg_hba(&rules, "streaming_replica", Some(true), false);
        assert!(!allowed.contains("hostnossl"), "{allowed}");
        assert!(allowed.contains("hostssl replication \"streaming_replica\" all cert\n"));

        // superuserAccess: the superuser's password over TLS, before the rule that
        // refuses it; never over plaintext, even when plaintext is allowed.
        for allow_plaintext in [false, true] {
            let hba = render_pg_hba(&rules, "streaming_replica", Some(allow_plaintext), true);
            let su = hba
                .find("hostssl all \"postgres\" all scram-sha-256\n")
                .unwrap_or_else(|| panic!("superuser over TLS missing from:\n{hba}"));
            let reject = hba
                .find("host all \"postgres\" all reject\n")
                .expect("superuser otherwise refused");
            assert!(su < reject, "{hba}");
            assert!(!hba.contains("host all \"postgres\" all scram"), "{hba}");
        }

        let conf =
            render_postgresql_conf(&layout(), &Mode::Primary, "", None, true, &BTreeMap::new());
        for line in [
            "ssl = 'on'",
            "ssl_cert_file = '/run/postgresql/pgop-tls-server.crt'",
            "ssl_key_file = '/run/postgresql/pgop-tls-server.key'",
            "ssl_ca_file = '/run/postgresql/pgop-tls-client-ca.crt'",
            "ssl_min_protocol_version = 'TLSv1.2'",
        ] {
            assert!(
                conf.contains(&format!("{line}\n")),
                "{line} missing from:\n{conf}"
            );
        }
    }
}
