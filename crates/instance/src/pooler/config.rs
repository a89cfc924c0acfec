//! PgBouncer's files, rendered from what the manager read (pure: no I/O). `pgbouncer.ini`
//! holds only what pgop itself produces (addresses, numbers, enumerations, the run
//! directory's path, checked); the only values from outside, the application owner's name
//! and password (the `<cluster>-app` Secret), go to the auth file, quoted as PgBouncer's
//! parser reads it ([`quote_auth_field`]); a value that parser cannot carry is refused with
//! an error naming the Secret and key, never written.

use pgop_api::pooler::{AUTH_USER, PoolMode};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The user the manager reads PgBouncer's admin console as (`stats_users`). Its password
/// is generated anew at every start of the manager and lives only in the auth file.
pub const STATS_USER: &str = "pgop_pooler_stats";

/// The admin console's database.
pub const ADMIN_DATABASE: &str = "pgbouncer";

/// PgBouncer's own limits on an auth file field (its `MAX_USERNAME`, `MAX_PASSWORD`):
/// the quoted text between the double quotes must be shorter, or PgBouncer stops reading
/// the file there (every user after it is lost). Checked against PgBouncer 1.18.
pub const MAX_USER_FIELD: usize = 127;
pub const MAX_PASSWORD_FIELD: usize = 2047;

/// `server_connect_timeout`: a target that does not answer (a node gone) fails a login
/// after this many seconds rather than PgBouncer's 15.
pub const SERVER_CONNECT_TIMEOUT_SECONDS: u32 = 2;
/// `server_login_retry`: after a failed login PgBouncer tries again after this many
/// seconds (default 15), so that a new primary is used about a second after a failover.
pub const SERVER_LOGIN_RETRY_SECONDS: u32 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{origin} holds {what}, which PgBouncer's auth_file cannot carry")]
    Unrepresentable { origin: String, what: &'static str },
    #[error("{origin} is empty")]
    Empty { origin: String },
    #[error("{origin} is too long for PgBouncer ({len} bytes quoted, at most {max})")]
    TooLong {
        origin: String,
        len: usize,
        max: usize,
    },
    #[error("{origin} names {STATS_USER}, the pooler's own stats user")]
    StatsUserTaken { origin: String },
    #[error("{origin} is not a PEM {what}")]
    NotPem { origin: String, what: &'static str },
    #[error(
        "the pooler's run directory {path:?} may hold only letters, digits and / . _ - (it is written into pgbouncer.ini)"
    )]
    RunDir { path: PathBuf },
    #[error("no server to send connections to")]
    NoTargets,
}

/// A value read from outside, and where it came from (`key password of Secret db-app`):
/// every error about it names that.
#[derive(Clone, PartialEq, Eq)]
pub struct Sourced {
    pub value: String,
    pub origin: String,
}

impl Sourced {
    pub fn new(value: impl Into<String>, origin: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            origin: origin.into(),
        }
    }

    /// `key <key> of Secret <secret>`.
    pub fn from_secret(value: impl Into<String>, secret: &str, key: &str) -> Self {
        Self::new(value, format!("key {key} of Secret {secret}"))
    }
}

impl std::fmt::Debug for Sourced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value: it may be a password or a key.
        f.debug_struct("Sourced")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// Where PgBouncer's files are and where it listens: from the Pod, not from the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The run directory: configuration, auth file, TLS files, the Unix socket.
    pub dir: PathBuf,
    /// `listen_addr`: the Pod's IP.
    pub listen: IpAddr,
    /// `listen_port` (the Unix socket's too).
    pub port: u16,
}

impl Layout {
    pub fn ini(&self) -> PathBuf {
        self.dir.join("pgbouncer.ini")
    }
    pub fn auth_file(&self) -> PathBuf {
        self.dir.join("users.txt")
    }
    pub fn tls_cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }
    pub fn tls_key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }
    pub fn server_ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    /// PgBouncer's Unix socket (the admin console's way in).
    pub fn socket(&self) -> PathBuf {
        self.dir.join(format!(".s.PGSQL.{}", self.port))
    }
}

/// PgBouncer's TLS material (PEM), from `<cluster>-server-tls`: the certificate and key it
/// serves clients with (PostgreSQL's own, which names the pooler Services too) and the
/// authority that issued every server certificate of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub cert: Sourced,
    pub key: Sourced,
    pub ca: Sourced,
}

/// What PgBouncer is to be configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The servers (Pod IPs) new server connections go to, round robin; never empty in a
    /// rendered configuration.
    pub targets: Vec<IpAddr>,
    /// Their PostgreSQL port.
    pub server_port: u16,
    pub pool_mode: PoolMode,
    pub max_client_connections: i32,
    pub default_pool_size: i32,
    /// The application owner (`<cluster>-app`: `username`, `password`).
    pub app_user: Sourced,
    pub app_password: Sourced,
    /// The password of [`pgop_api::pooler::AUTH_USER`] (`<cluster>.pooler`): with it,
    /// every other role that may log in is looked up on the server (`auth_query`); without
    /// it (a cluster from an older operator), only the application owner logs in.
    pub auth_password: Option<Sourced>,
    pub tls: Tls,
}

/// The rendered files, each written only when it changed.
#[derive(Clone, PartialEq, Eq)]
pub struct Files {
    pub ini: String,
    pub auth: String,
    pub tls_cert: String,
    pub tls_key: String,
    pub server_ca: String,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The configuration only: the others hold secrets.
        f.debug_struct("Files")
            .field("ini", &self.ini)
            .finish_non_exhaustive()
    }
}

/// Every file of `desired`, with the stats user's `stats_password`.
pub fn render(layout: &Layout, desired: &Desired, stats_password: &str) -> Result<Files, Error> {
    let stats_user = Sourced::new(STATS_USER, "the stats user");
    let stats_password = Sourced::new(stats_password, "the stats user's generated password");
    if desired.app_user.value == STATS_USER {
        return Err(Error::StatsUserTaken {
            origin: desired.app_user.origin.clone(),
        });
    }
    let auth_user = Sourced::new(AUTH_USER, "the poolers' look-up role");
    let tls = &desired.tls;
    check_pem(&tls.cert, "certificate", "CERTIFICATE")?;
    check_pem(&tls.key, "private key", "PRIVATE KEY")?;
    check_pem(&tls.ca, "certificate", "CERTIFICATE")?;
    Ok(Files {
        ini: render_ini(layout, desired)?,
        auth: render_auth_file(
            &[
                Some((&desired.app_user, &desired.app_password)),
                Some((&stats_user, &stats_password)),
                desired.auth_password.as_ref().map(|p| (&auth_user, p)),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>(),
        )?,
        tls_cert: tls.cert.value.clone(),
        tls_key: tls.key.value.clone(),
        server_ca: tls.ca.value.clone(),
    })
}

/// A PEM block of `label` (`CERTIFICATE`; any `... PRIVATE KEY`): PgBouncer would fail to
/// start (or keep its old material) on anything else, with less to go on.
fn check_pem(value: &Sourced, what: &'static str, label: &str) -> Result<(), Error> {
    let v = &value.value;
    let begins = v.lines().any(|l| {
        l.trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|l| l.ends_with(label))
    });
    if begins && !v.contains('\0') {
        Ok(())
    } else {
        Err(Error::NotPem {
            origin: value.origin.clone(),
            what,
        })
    }
}

/// `pgbouncer.ini`. Every value is pgop's: addresses and numbers formatted here, fixed
/// words, and the run directory (refused unless plain, [`check_dir`]).
pub fn render_ini(layout: &Layout, desired: &Desired) -> Result<String, Error> {
    check_dir(&layout.dir)?;
    if desired.targets.is_empty() {
        return Err(Error::NoTargets);
    }
    let hosts = desired
        .targets
        .iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let path = |p: PathBuf| p.display().to_string();
    let mut out = String::from(
        ";; Written by pgop's pooler manager (`pgop pooler run`); rewritten on every change.\n",
    );
    // Every database a client names, on the targets, as the client's own user (one pool
    // per database and user): no user or password in this file.
    let _ = writeln!(
        out,
        "[databases]\n* = host={hosts} port={}\n",
        desired.server_port
    );
    let mut settings: Vec<(&str, String)> = vec![
        ("listen_addr", layout.listen.to_string()),
        ("listen_port", layout.port.to_string()),
        ("unix_socket_dir", path(layout.dir.clone())),
        ("auth_type", "scram-sha-256".into()),
        ("auth_file", path(layout.auth_file())),
        ("stats_users", STATS_USER.into()),
        ("pool_mode", desired.pool_mode.as_str().into()),
        (
            "max_client_conn",
            desired.max_client_connections.max(1).to_string(),
        ),
        (
            "default_pool_size",
            desired.default_pool_size.max(1).to_string(),
        ),
        // Clients: TLS or nothing (the Unix socket, the manager's, is exempt).
        ("client_tls_sslmode", "require".into()),
        ("client_tls_cert_file", path(layout.tls_cert())),
        ("client_tls_key_file", path(layout.tls_key())),
        // Servers: PostgreSQL rejects every TCP connection without TLS. The instances'
        // certificates name `<cluster>-rw`, not Pod IPs, so the name cannot be verified
        // against an address; the authority is the cluster's own.
        ("server_tls_sslmode", "verify-ca".into()),
        ("server_tls_ca_file", path(layout.server_ca())),
        ("server_login_retry", SERVER_LOGIN_RETRY_SECONDS.to_string()),
        (
            "server_connect_timeout",
            SERVER_CONNECT_TIMEOUT_SECONDS.to_string(),
        ),
        // pgbench and JDBC send these in the startup packet.
        (
            "ignore_startup_parameters",
            "extra_float_digits,options".into(),
        ),
        // The manager's stderr is the Pod's log.
        ("syslog", "0".into()),
        // The manager's /metrics serves the statistics; no log line a minute.
        ("log_stats", "0".into()),
    ];
    if desired.auth_password.is_some() {
        // Users not in the auth file: their SCRAM verifier from the server, through the
        // one function the look-up role may call (in the database the client names).
        settings.push(("auth_user", AUTH_USER.into()));
        settings.push(("auth_query", pgop_api::pooler::AUTH_QUERY.into()));
    }
    out.push_str("[pgbouncer]\n");
    for (name, value) in settings {
        let _ = writeln!(out, "{name} = {value}");
    }
    Ok(out)
}

/// The run directory goes into `pgbouncer.ini` as is: only plain absolute paths.
fn check_dir(dir: &Path) -> Result<(), Error> {
    let plain = dir.to_str().is_some_and(|s| {
        s.starts_with('/')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'))
    });
    if plain {
        Ok(())
    } else {
        Err(Error::RunDir {
            path: dir.to_path_buf(),
        })
    }
}

/// The auth file: one `"user" "password"` line per entry.
pub fn render_auth_file(entries: &[(&Sourced, &Sourced)]) -> Result<String, Error> {
    let mut out = String::new();
    for (user, password) in entries {
        let user = quote_auth_field(user, MAX_USER_FIELD)?;
        let password = quote_auth_field(password, MAX_PASSWORD_FIELD)?;
        let _ = writeln!(out, "{user} {password}");
    }
    Ok(out)
}

/// One auth file field as PgBouncer's loader reads it: between double quotes, a double
/// quote doubled; everything else literal (backslashes, `$`, `#`, `;`, `=`, spaces). A
/// line break would end the entry and a NUL the file, so neither is ever written; nor an
/// empty value, nor one longer than PgBouncer reads (`max`, quoted).
pub fn quote_auth_field(field: &Sourced, max: usize) -> Result<String, Error> {
    let value = &field.value;
    let refuse = |what| Error::Unrepresentable {
        origin: field.origin.clone(),
        what,
    };
    if value.is_empty() {
        return Err(Error::Empty {
            origin: field.origin.clone(),
        });
    }
    if value.contains('\0') {
        return Err(refuse("a NUL character"));
    }
    if value.contains('\n') || value.contains('\r') {
        return Err(refuse("a line break"));
    }
    let inner = value.replace('"', "\"\"");
    if inner.len() > max {
        return Err(Error::TooLong {
            origin: field.origin.clone(),
            len: inner.len(),
            max,
        });
    }
    Ok(format!("\"{inner}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

    fn layout() -> Layout {
        Layout {
            dir: "/run/pgbouncer".into(),
            listen: "10.1.2.3".parse().expect("ip"),
            port: 5432,
        }
    }

    fn desired(user: &str, password: &str) -> Desired {
        Desired {
            targets: vec!["10.0.0.7".parse().expect("ip")],
            server_port: 5432,
            pool_mode: PoolMode::Transaction,
            max_client_connections: 1000,
            default_pool_size: 20,
            app_user: Sourced::from_secret(user, "db-app", "username"),
            app_password: Sourced::from_secret(password, "db-app", "password"),
            auth_password: None,
            tls: Tls {
                cert: Sourced::from_secret(CERT, "db-server-tls", "tls.crt"),
                key: Sourced::from_secret(KEY, "db-server-tls", "tls.key"),
                ca: Sourced::from_secret(CERT, "db-server-tls", "ca.crt"),
            },
        }
    }

    /// The `name = value` settings of `[pgbouncer]`.
    fn settings(ini: &str) -> std::collections::BTreeMap<String, String> {
        ini.split("[pgbouncer]\n")
            .nth(1)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(" = "))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_configuration_points_every_database_at_the_targets_with_tls_both_ways() {
        let mut d = desired("app", "secret");
        d.targets.push("10.0.0.8".parse().expect("ip"));
        d.targets.push("fd00::9".parse().expect("ip"));
        d.pool_mode = PoolMode::Session;
        d.max_client_connections = 250;
        d.default_pool_size = 7;
        let ini = render_ini(&layout(), &d).expect("rendered");
        assert!(
            ini.contains("[databases]\n* = host=10.0.0.7,10.0.0.8,fd00::9 port=5432\n"),
            "{ini}"
        );
        let s = settings(&ini);
        let get = |k: &str| s.get(k).map(String::as_str);
        assert_eq!(get("listen_addr"), Some("10.1.2.3"));
        assert_eq!(get("listen_port"), Some("5432"));
        assert_eq!(get("unix_socket_dir"), Some("/run/pgbouncer"));
        assert_eq!(get("auth_type"), Some("scram-sha-256"));
        assert_eq!(get("auth_file"), Some("/run/pgbouncer/users.txt"));
        assert_eq!(get("stats_users"), Some(STATS_USER));
        assert_eq!(get("pool_mode"), Some("session"));
        assert_eq!(get("max_client_conn"), Some("250"));
        assert_eq!(get("default_pool_size"), Some("7"));
        assert_eq!(get("client_tls_sslmode"), Some("require"));
        assert_eq!(get("client_tls_cert_file"), Some("/run/pgbouncer/tls.crt"));
        assert_eq!(get("client_tls_key_file"), Some("/run/pgbouncer/tls.key"));
        assert_eq!(get("server_tls_sslmode"), Some("verify-ca"));
        assert_eq!(get("server_tls_ca_file"), Some("/run/pgbouncer/ca.crt"));
        assert_eq!(get("server_login_retry"), Some("1"));
        assert_eq!(get("server_connect_timeout"), Some("2"));
        assert_eq!(
            get("ignore_startup_parameters"),
            Some("extra_float_digits,options")
        );
        // Nothing from the Secret reaches the configuration file.
        assert!(!ini.contains("app"), "{ini}");
        assert!(!ini.contains("secret"), "{ini}");
    }

    #[test]
    fn with_the_look_up_secret_other_roles_are_looked_up_as_pgop_pooler() {
        let mut d = desired("app", "secret");
        let without = render(&layout(), &d, "stats").expect("rendered");
        assert!(!settings(&without.ini).contains_key("auth_user"));
        assert!(
            !without.auth.contains("\"pgop_pooler\" "),
            "{}",
            without.ini
        );
        d.auth_password = Some(Sourced::from_secret("look\"up", "db.pooler", "password"));
        let with = render(&layout(), &d, "stats").expect("rendered");
        let s = settings(&with.ini);
        assert_eq!(s.get("auth_user").map(String::as_str), Some("pgop_pooler"));
        assert_eq!(
            s.get("auth_query").map(String::as_str),
            Some("SELECT usename, passwd FROM pgop_pooler.user_lookup($1)")
        );
        assert!(
            with.auth.contains("\"pgop_pooler\" \"look\"\"up\"\n"),
            "{}",
            with.auth
        );
        // A password the auth file cannot carry is refused naming its Secret.
        d.auth_password = Some(Sourced::from_secret("a\nb", "db.pooler", "password"));
        let refused = render(&layout(), &d, "stats")
            .expect_err("refused")
            .to_string();
        assert!(
            refused.contains("key password of Secret db.pooler"),
            "{refused}"
        );
    }

    #[test]
    fn no_target_renders_nothing() {
        let mut d = desired("app", "secret");
        d.targets.clear();
        assert_eq!(render_ini(&layout(), &d), Err(Error::NoTargets));
    }

    #[test]
    fn a_run_directory_that_could_change_the_file_is_refused() {
        for dir in [
            "/run/pg bouncer",
            "/run/pgbouncer\nadmin_users = app",
            "/run/#x",
            "/run/;x",
            "relative/dir",
            "/run/\"x\"",
        ] {
            let l = Layout {
                dir: dir.into(),
                ..layout()
            };
            assert!(
                matches!(
                    render_ini(&l, &desired("app", "pw")),
                    Err(Error::RunDir { .. })
                ),
                "{dir:?}"
            );
        }
        let l = Layout {
            dir: "/tmp/pgop-it-pooler-1.2/run_x".into(),
            ..layout()
        };
        assert!(render_ini(&l, &desired("app", "pw")).is_ok());
    }

    /// What PgBouncer 1.18's loader (`load_auth_file`) reads back from a line: each field
    /// between double quotes, `""` standing for `"`.
    fn parse_auth_line(line: &str) -> Vec<String> {
        let mut fields = Vec::new();
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '"' {
                continue;
            }
            let mut field = String::new();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') | None => break,
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
        }
        fields
    }

    #[test]
    fn hostile_values_are_quoted_so_they_read_back_as_they_were() {
        let hostile = [
            "pa\"ss",
            "\"",
            "\"\"",
            "a=b",
            "#comment",
            ";comment",
            "$(rm -rf /)",
            "`id`",
            "back\\slash\\",
            "with spaces ",
            " leading",
            "é ü 密码",
            "\" \"admin\" \"x",
        ];
        for value in hostile {
            let files = render(&layout(), &desired("app", value), "stats").expect(value);
            let lines: Vec<&str> = files.auth.lines().collect();
            assert_eq!(lines.len(), 2, "{value:?}: {}", files.auth);
            assert_eq!(
                parse_auth_line(lines[0]),
                ["app".to_string(), value.to_string()],
                "{value:?}"
            );
            assert_eq!(
                parse_auth_line(lines[1]),
                [STATS_USER.to_string(), "stats".to_string()]
            );
            // And as a user name.
            let files = render(&layout(), &desired(value, "pw"), "stats").expect(value);
            let first = files.auth.lines().next().unwrap_or_default();
            assert_eq!(
                parse_auth_line(first),
                [value.to_string(), "pw".to_string()]
            );
        }
    }

    #[test]
    fn what_the_auth_file_cannot_carry_is_refused_naming_the_secret_and_key() {
        for (value, what) in [
            ("line\nbreak", "a line break"),
            ("carriage\rreturn", "a line break"),
            ("\n\"admin\" \"x\"", "a line break"),
            ("nul\0byte", "a NUL character"),
        ] {
            let err = render(&layout(), &desired("app", value), "s").expect_err(value);
            assert_eq!(
                err,
                Error::Unrepresentable {
                    origin: "key password of Secret db-app".into(),
                    what
                }
            );
            let text = err.to_string();
            assert!(text.contains("key password of Secret db-app"), "{text}");
            assert!(!text.contains(value), "never the value: {text}");
            let err = render(&layout(), &desired(value, "pw"), "s").expect_err(value);
            assert!(
                err.to_string().contains("key username of Secret db-app"),
                "{err}"
            );
        }
        assert_eq!(
            render(&layout(), &desired("", "pw"), "s"),
            Err(Error::Empty {
                origin: "key username of Secret db-app".into()
            })
        );
        assert!(matches!(
            render(&layout(), &desired("app", ""), "s"),
            Err(Error::Empty { .. })
        ));
    }

    #[test]
    fn values_longer_than_pgbouncer_reads_are_refused_counting_doubled_quotes() {
        let fits = "u".repeat(MAX_USER_FIELD);
        assert!(render(&layout(), &desired(&fits, "pw"), "s").is_ok());
        let long = "u".repeat(MAX_USER_FIELD + 1);
        assert!(matches!(
            render(&layout(), &desired(&long, "pw"), "s"),
            Err(Error::TooLong {
                max: MAX_USER_FIELD,
                ..
            })
        ));
        // 64 quotes are 128 bytes quoted.
        let quotes = "\"".repeat(64);
        assert!(matches!(
            render(&layout(), &desired(&quotes, "pw"), "s"),
            Err(Error::TooLong { len: 128, .. })
        ));
        let fits = "p".repeat(MAX_PASSWORD_FIELD);
        assert!(render(&layout(), &desired("app", &fits), "s").is_ok());
        let long = "p".repeat(MAX_PASSWORD_FIELD + 1);
        assert!(matches!(
            render(&layout(), &desired("app", &long), "s"),
            Err(Error::TooLong { .. })
        ));
    }

    #[test]
    fn the_app_user_may_not_be_the_stats_user_and_tls_material_must_be_pem() {
        assert!(matches!(
            render(&layout(), &desired(STATS_USER, "pw"), "s"),
            Err(Error::StatsUserTaken { .. })
        ));
        let mut d = desired("app", "pw");
        d.tls.key = Sourced::from_secret("not a key", "db-server-tls", "tls.key");
        let err = render(&layout(), &d, "s").expect_err("not PEM");
        assert_eq!(
            err.to_string(),
            "key tls.key of Secret db-server-tls is not a PEM private key"
        );
        let mut d = desired("app", "pw");
        d.tls.ca = Sourced::from_secret(KEY, "db-server-tls", "ca.crt");
        assert!(matches!(
            render(&layout(), &d, "s"),
            Err(Error::NotPem { .. })
        ));
        let mut d = desired("app", "pw");
        d.tls.key = Sourced::from_secret(
            "-----BEGIN EC PRIVATE KEY-----\nx\n-----END EC PRIVATE KEY-----\n",
            "db-server-tls",
            "tls.key",
        );
        assert!(render(&layout(), &d, "s").is_ok());
    }

    #[test]
    fn secrets_never_reach_debug_output() {
        let d = desired("app", "hunter2");
        let files = render(&layout(), &d, "stats-pw").expect("rendered");
        for text in [format!("{d:?}"), format!("{files:?}")] {
            assert!(!text.contains("hunter2"), "{text}");
            assert!(!text.contains("stats-pw"), "{text}");
            assert!(!text.contains("BEGIN PRIVATE KEY"), "{text}");
        }
    }
}
