//! Restoring from a logical backup: one database, or the globals, verified before anything
//! is applied.

use super::*;

/// Where and as whom [`restore`] and [`restore_globals`] connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalTarget {
    /// A host name, an IP address, or a Unix socket directory (starts with `/`).
    pub host: String,
    pub port: u16,
    pub user: String,
    /// Passed to the programs as `PGPASSWORD`, never on a command line.
    pub password: Option<String>,
    /// The database to restore into (it must exist); the database [`restore_globals`]
    /// connects to.
    pub dbname: String,
    /// The authority (PEM file) that signed the server's certificate: with it, the
    /// connection is TLS with the server verified as `sslmode=verify-full` does (a pgop
    /// cluster refuses connections without TLS; its app Secret's `ca.crt` is this file).
    pub ssl_root_cert: Option<PathBuf>,
}

impl LogicalTarget {
    fn conninfo(&self) -> String {
        let mut conninfo = format!(
            "host={} port={} user={} dbname={} application_name=pgop-logical-restore",
            conninfo_value(&self.host),
            self.port,
            conninfo_value(&self.user),
            conninfo_value(&self.dbname)
        );
        if let Some(ca) = &self.ssl_root_cert {
            conninfo.push_str(&format!(
                " sslmode=verify-full sslrootcert={}",
                conninfo_value(&ca.display().to_string())
            ));
        }
        conninfo
    }

    /// How the target is named in messages (no password).
    fn describe(&self) -> String {
        format!(
            "{}:{} as {} (database {:?})",
            self.host, self.port, self.user, self.dbname
        )
    }

    fn command(&self, tools: &PgTools, program: &str) -> tokio::process::Command {
        let mut cmd = tools.command(program);
        // Only what this target says: nothing from the caller's environment.
        for var in ["PGPASSWORD", "PGPASSFILE", "PGSERVICE", "PGOPTIONS"] {
            cmd.env_remove(var);
        }
        if let Some(password) = &self.password {
            cmd.env("PGPASSWORD", password);
        }
        cmd
    }

    async fn connect(&self) -> Result<tokio_postgres::Client, Error> {
        let mut config = tokio_postgres::Config::new();
        if self.host.starts_with('/') {
            config.host_path(&self.host);
        } else {
            config.host(&self.host);
        }
        config
            .port(self.port)
            .user(&self.user)
            .dbname(&self.dbname)
            .application_name("pgop-logical-restore")
            .connect_timeout(Duration::from_secs(10));
        if let Some(password) = &self.password {
            config.password(password);
        }
        let tls = match &self.ssl_root_cert {
            Some(path) => {
                let tls_error =
                    |source: Box<dyn std::error::Error + Send + Sync>| Error::TargetTls {
                        path: path.clone(),
                        source,
                    };
                let ca = std::fs::read_to_string(path).map_err(|e| tls_error(Box::new(e)))?;
                Some(
                    pgop_tls::postgres::PostgresTls::verify_full(&ca, None)
                        .map_err(|e| tls_error(Box::new(e)))?,
                )
            }
            None => None,
        };
        pgop_tls::postgres::connect(&mut config, tls)
            .await
            .map_err(|source| Error::TargetConnect {
                target: self.describe(),
                source,
            })
    }
}

/// A temporary file under the scratch directory, removed on drop.
struct ScratchFile(PathBuf);

impl ScratchFile {
    fn create(scratch: &Path, id: &str, name: &str) -> Result<(Self, std::fs::File), Error> {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = scratch.join(format!(
            ".pgop-logical-{id}-{}-{}-{n}.tmp",
            encode_name(name),
            std::process::id()
        ));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| Error::Scratch {
                path: path.clone(),
                source,
            })?;
        Ok((Self(path), file))
    }

    fn open(&self) -> Result<std::fs::File, Error> {
        std::fs::File::open(&self.0).map_err(|source| Error::Scratch {
            path: self.0.clone(),
            source,
        })
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Downloads `object` into a new file under `scratch` and verifies it (the store's footer
/// and the manifest's SHA-256) before anything reads it.
async fn download(
    store: &Store,
    id: &str,
    name: &str,
    object: &LogicalObject,
    scratch: &Path,
) -> Result<ScratchFile, Error> {
    let (temp, file) = ScratchFile::create(scratch, id, name)?;
    let sink = std::io::BufWriter::with_capacity(1024 * 1024, file);
    let (footer, sink) = store.get_stream(&object.object, sink).await?;
    let scratch_error = |source| Error::Scratch {
        path: temp.0.clone(),
        source,
    };
    sink.into_inner()
        .map_err(|e| scratch_error(e.into_error()))?
        .sync_all()
        .map_err(scratch_error)?;
    if footer.content_sha256 != object.sha256 {
        return Err(Error::Mismatch {
            object: store.name(&object.object),
            expected: object.sha256.clone(),
            actual: footer.content_sha256,
        });
    }
    Ok(temp)
}

/// Runs a program with `input` as its stdin; its stderr (the start of it) on failure.
async fn run_with_input(
    mut cmd: tokio::process::Command,
    program: &'static str,
    input: std::fs::File,
) -> Result<Result<(), (String, String)>, Error> {
    cmd.stdin(Stdio::from(input))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let output = crate::process::output(&mut cmd)
        .await
        .map_err(|source| Error::Spawn { program, source })?;
    if output.status.success() {
        return Ok(Ok(()));
    }
    let mut stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if stderr.len() > 16 * 1024 {
        let mut cut = 16 * 1024;
        while !stderr.is_char_boundary(cut) {
            cut -= 1;
        }
        stderr.truncate(cut);
        stderr.push_str(" ...");
    }
    Ok(Err((output.status.to_string(), stderr)))
}

fn find_backup(
    manifest: Option<LogicalManifest>,
    store: &Store,
    backup_id: &str,
) -> Result<LogicalManifest, Error> {
    manifest.ok_or_else(|| Error::UnknownBackup {
        id: backup_id.to_string(),
        store: format!("{store:?}"),
    })
}

/// Restores the dump of `database` from logical backup `backup_id` into the existing
/// database `target.dbname`: the dump is downloaded into a temporary file under `scratch`
/// (removed afterwards) and verified first, then `pg_restore --single-transaction
/// --exit-on-error` applies it, all or nothing. Owners and privileges are restored as
/// dumped: the roles must exist (see [`restore_globals`]), and `target.user` must be
/// allowed to create objects owned by them (a superuser). Returns the dump's size.
pub async fn restore(
    store: &Store,
    tools: &PgTools,
    backup_id: &str,
    database: &str,
    target: &LogicalTarget,
    scratch: &Path,
) -> Result<u64, Error> {
    let manifest = find_backup(get(store, backup_id).await?, store, backup_id)?;
    let Some(entry) = manifest.database(database) else {
        return Err(Error::UnknownDatabase {
            id: backup_id.to_string(),
            database: database.to_string(),
            available: manifest.databases.iter().map(|d| d.name.clone()).collect(),
        });
    };
    let object = store.name(&entry.dump.object);
    tracing::info!(backup_id, database, target = %target.describe(), "restoring a logical backup");
    let temp = download(store, backup_id, database, &entry.dump, scratch).await?;
    let mut cmd = target.command(tools, "pg_restore");
    cmd.args([
        "--format=custom",
        "--single-transaction",
        "--exit-on-error",
        "--no-password",
    ])
    .arg(format!("--dbname={}", target.conninfo()));
    // The verified file as pg_restore's stdin: PostgreSQL's OS user needs no access to
    // the scratch directory.
    let result = run_with_input(cmd, "pg_restore", temp.open()?).await?;
    drop(temp);
    match result {
        Ok(()) => {
            tracing::info!(
                backup_id,
                database,
                size = entry.dump.size_bytes,
                "logical backup restored"
            );
            Ok(entry.dump.size_bytes)
        }
        Err((status, stderr)) => Err(Error::Restore {
            object,
            database: target.dbname.clone(),
            status,
            stderr,
        }),
    }
}

/// What [`restore_globals`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GlobalsRestored {
    /// Roles of the backup that the target did not have: created, with their attributes,
    /// passwords, settings and comments as dumped.
    pub created_roles: Vec<String>,
    /// Roles the target already had: left as they are (never altered).
    pub existing_roles: Vec<String>,
    /// Tablespaces the target already had: left as they are.
    pub existing_tablespaces: Vec<String>,
}

/// Applies the globals (`pg_dumpall --globals-only`) of logical backup `backup_id` to the
/// target server with `psql -v ON_ERROR_STOP=1`, connected to `target.dbname`, after
/// downloading and verifying them into a temporary file under `scratch` like [`restore`].
/// Roles and tablespaces the target already has are left alone: their `CREATE`, `ALTER`
/// and `COMMENT` statements are skipped (the target's own superuser and replication roles
/// keep their passwords); the rest (new roles, role memberships, new tablespaces, whose
/// directories must exist on the target) is applied. Not one transaction: `CREATE
/// TABLESPACE` cannot run in one; a failure stops at the failing statement.
pub async fn restore_globals(
    store: &Store,
    tools: &PgTools,
    backup_id: &str,
    target: &LogicalTarget,
    scratch: &Path,
) -> Result<GlobalsRestored, Error> {
    let manifest = find_backup(get(store, backup_id).await?, store, backup_id)?;
    let object = store.name(&manifest.globals.object);
    let temp = download(store, backup_id, "globals", &manifest.globals, scratch).await?;
    let sql = std::fs::read(&temp.0).map_err(|source| Error::Scratch {
        path: temp.0.clone(),
        source,
    })?;
    drop(temp);
    let sql = String::from_utf8_lossy(&sql);

    let client = target.connect().await?;
    let query = |source| Error::TargetQuery {
        target: target.describe(),
        source,
    };
    let names = |rows: Vec<tokio_postgres::Row>| -> Result<Vec<String>, Error> {
        rows.iter()
            .map(|r| r.try_get::<_, String>(0))
            .collect::<Result<_, _>>()
            .map_err(query)
    };
    let roles = names(
        client
            .query("SELECT rolname::text FROM pg_roles", &[])
            .await
            .map_err(query)?,
    )?;
    let tablespaces = names(
        client
            .query("SELECT spcname::text FROM pg_tablespace", &[])
            .await
            .map_err(query)?,
    )?;
    drop(client);
    let filtered = filter_globals(&sql, &roles, &tablespaces);

    let (temp, mut file) = ScratchFile::create(scratch, backup_id, "globals-filtered")?;
    file.write_all(filtered.sql.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| Error::Scratch {
            path: temp.0.clone(),
            source,
        })?;
    drop(file);
    let mut cmd = target.command(tools, "psql");
    cmd.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "--no-password"])
        .arg(format!("--dbname={}", target.conninfo()));
    let result = run_with_input(cmd, "psql", temp.open()?).await?;
    drop(temp);
    if let Err((status, stderr)) = result {
        return Err(Error::RestoreGlobals {
            object,
            target: target.describe(),
            status,
            stderr,
        });
    }
    tracing::info!(backup_id, created = ?filtered.restored.created_roles, "logical backup globals restored");
    Ok(filtered.restored)
}

/// The globals' SQL without the statements about roles and tablespaces that exist.
struct FilteredGlobals {
    sql: String,
    restored: GlobalsRestored,
}

/// The identifier at the start of `s` (quoted or not), unquoted.
fn leading_ident(s: &str) -> Option<String> {
    if let Some(rest) = s.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    out.push('"');
                } else {
                    return Some(out);
                }
            } else {
                out.push(c);
            }
        }
        None
    } else {
        let end = s
            .find(|c: char| c.is_whitespace() || c == ';')
            .unwrap_or(s.len());
        (end > 0).then(|| s[..end].to_string())
    }
}

fn filter_globals(sql: &str, roles: &[String], tablespaces: &[String]) -> FilteredGlobals {
    let mut out = String::with_capacity(sql.len());
    let mut restored = GlobalsRestored::default();
    for line in sql.split_inclusive('\n') {
        let role = ["CREATE ROLE ", "ALTER ROLE ", "COMMENT ON ROLE "]
            .iter()
            .find_map(|p| line.strip_prefix(p))
            .and_then(leading_ident);
        let tablespace = [
            "CREATE TABLESPACE ",
            "ALTER TABLESPACE ",
            "COMMENT ON TABLESPACE ",
        ]
        .iter()
        .find_map(|p| line.strip_prefix(p))
        .and_then(leading_ident);
        if let Some(role) = role {
            let created = line.starts_with("CREATE ROLE ");
            // The poolers' look-up role is pgop's: the target's manager makes it, with the
            // target's password, when the target has poolers.
            if role == pgop_api::pooler::AUTH_USER {
                continue;
            }
            if roles.contains(&role) {
                if created {
                    restored.existing_roles.push(role);
                }
                continue;
            }
            if created {
                restored.created_roles.push(role);
            }
        } else if let Some(tablespace) = tablespace
            && tablespaces.contains(&tablespace)
        {
            if line.starts_with("CREATE TABLESPACE ") {
                restored.existing_tablespaces.push(tablespace);
            }
            continue;
        }
        out.push_str(line);
    }
    FilteredGlobals { sql: out, restored }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globals_of_existing_roles_and_tablespaces_are_skipped() {
        let sql = "--\n-- Roles\n--\n\nCREATE ROLE app;\nALTER ROLE app WITH NOSUPERUSER LOGIN PASSWORD 'x';\nCREATE ROLE \"Report \"\"Reader\"\"\";\nALTER ROLE \"Report \"\"Reader\"\"\" WITH LOGIN;\nCOMMENT ON ROLE \"Report \"\"Reader\"\"\" IS 'r';\nCREATE ROLE postgres;\nALTER ROLE postgres WITH SUPERUSER PASSWORD 'secret';\nGRANT app TO \"Report \"\"Reader\"\"\" GRANTED BY postgres;\nCREATE TABLESPACE fast OWNER postgres LOCATION '/fast';\nCREATE TABLESPACE slow OWNER postgres LOCATION '/slow';\nCREATE ROLE pgop_pooler;\nALTER ROLE pgop_pooler WITH LOGIN PASSWORD 'SCRAM-SHA-256$x';\n";
        let out = filter_globals(
            sql,
            &["postgres".into(), "app".into()],
            &["pg_default".into(), "fast".into()],
        );
        assert_eq!(out.restored.created_roles, vec!["Report \"Reader\""]);
        assert_eq!(out.restored.existing_roles, vec!["app", "postgres"]);
        assert_eq!(out.restored.existing_tablespaces, vec!["fast"]);
        assert!(!out.sql.contains("PASSWORD 'secret'"), "{}", out.sql);
        assert!(!out.sql.contains("CREATE ROLE app;"), "{}", out.sql);
        assert!(out.sql.contains("CREATE ROLE \"Report \"\"Reader\"\"\";\n"));
        assert!(out.sql.contains("COMMENT ON ROLE \"Report"));
        assert!(out.sql.contains("GRANT app TO"));
        assert!(!out.sql.contains("/fast"));
        assert!(out.sql.contains("LOCATION '/slow'"));
        // pgop's pooler look-up role is never restored (nor reported).
        assert!(!out.sql.contains("pgop_pooler"), "{}", out.sql);
    }
}
