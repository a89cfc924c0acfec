//! Taking a logical backup: the globals and one dump per database, streamed into the store,
//! the manifest last.

use super::*;

fn source_conninfo(source: &Source, database: &str) -> String {
    format!(
        "host={} port={} user=postgres dbname={} application_name=pgop-logical-backup",
        conninfo_value(&source.socket_dir.display().to_string()),
        source.port,
        conninfo_value(database)
    )
}

/// What a dump is of, for its error.
enum Dumped<'a> {
    Globals,
    Database(&'a str),
}

/// Runs a dump program and streams its stdout into `key`; a nonzero exit fails with its
/// stderr and removes the object.
async fn dump_into(
    store: &Store,
    mut cmd: tokio::process::Command,
    program: &'static str,
    key: &str,
    what: Dumped<'_>,
) -> Result<LogicalObject, Error> {
    let spawn = |source| Error::Spawn { program, source };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut child, _registration) = crate::process::spawn(&mut cmd).map_err(spawn)?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| spawn(std::io::Error::other("no stdout")))?;
    let stderr_task = child.stderr.take().map(|mut stderr| {
        tokio::spawn(async move {
            let mut text = Vec::new();
            let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut text).await;
            // Drain the rest so that the program never blocks on a full pipe.
            let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
            String::from_utf8_lossy(&text).trim().to_string()
        })
    });
    // On a store error the reader is dropped: the program gets EPIPE and exits.
    let uploaded = store.put_stream(key, stdout).await;
    let status = child.wait().await.map_err(spawn)?;
    let stderr = match stderr_task {
        Some(task) => task.await.unwrap_or_default(),
        None => String::new(),
    };
    if !status.success() {
        store.delete(key).await.ok();
        let status = status.to_string();
        return Err(match what {
            Dumped::Globals => Error::DumpGlobals { status, stderr },
            Dumped::Database(database) => Error::Dump {
                database: database.to_string(),
                status,
                stderr,
            },
        });
    }
    let (footer, stored_bytes) = uploaded?;
    Ok(object_of(key, &footer, stored_bytes))
}

fn object_of(key: &str, footer: &Footer, stored_bytes: u64) -> LogicalObject {
    LogicalObject {
        object: key.to_string(),
        size_bytes: footer.content_len,
        stored_bytes,
        sha256: footer.content_sha256.clone(),
    }
}

/// Takes a logical backup of every database of `source` that allows connections and is
/// not a template (`postgres` included), and of its globals; the manifest is written last.
/// Each database is dumped in its own snapshot, one after the other. On any error what was
/// written is removed again (best effort: a leftover has no manifest and is never listed).
pub async fn take(
    store: &Store,
    tools: &PgTools,
    source: &Source,
    cluster: &str,
) -> Result<LogicalManifest, Error> {
    let client = source.connect().await.map_err(Error::Connect)?;
    let row = client
        .query_one(
            "SELECT (SELECT system_identifier::text FROM pg_control_system()),
                    current_setting('server_version_num')::int",
            &[],
        )
        .await
        .map_err(Error::ListDatabases)?;
    let system_identifier: String = row.try_get(0).map_err(Error::ListDatabases)?;
    let server_version_num: i32 = row.try_get(1).map_err(Error::ListDatabases)?;
    let databases: Vec<String> = client
        .query(
            "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate
             ORDER BY datname",
            &[],
        )
        .await
        .map_err(Error::ListDatabases)?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(Error::ListDatabases)?;
    drop(client);

    // One backup per second: a second backup within the same second waits for the next.
    let mut begin = jiff::Timestamp::now();
    for _ in 0..3 {
        let id = base::backup_id(begin);
        let manifest_key = format!("{}{MANIFEST_FILE}", backup_dir(&id));
        if store.footer(&manifest_key).await?.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        begin = jiff::Timestamp::now();
    }
    let backup_id = base::backup_id(begin);
    let dir = backup_dir(&backup_id);
    tracing::info!(%backup_id, store = ?store, databases = ?databases, "taking a logical backup");
    let result = dump_all(store, tools, source, &backup_id, &databases).await;
    let (globals, dumps) = match result {
        Ok(done) => done,
        Err(err) => {
            remove_objects(store, &dir).await;
            return Err(err);
        }
    };
    // Every object is still there as written before the manifest says so: a backup under
    // way for longer than INCOMPLETE_GRACE looks like a leftover to retention.
    for object in std::iter::once(&globals).chain(dumps.iter().map(|d| &d.dump)) {
        let intact = match store.footer(&object.object).await {
            Ok(found) => found.is_some_and(|f| f.content_sha256 == object.sha256),
            Err(err) => {
                remove_objects(store, &dir).await;
                return Err(err.into());
            }
        };
        if !intact {
            remove_objects(store, &dir).await;
            return Err(Error::Vanished {
                object: store.name(&object.object),
            });
        }
    }
    let end = jiff::Timestamp::now();
    let manifest = LogicalManifest {
        format: LOGICAL_MANIFEST_FORMAT,
        backup_id: backup_id.clone(),
        cluster: cluster.to_string(),
        system_identifier,
        server_version_num,
        begin_time: begin.to_string(),
        end_time: end.to_string(),
        globals,
        databases: dumps,
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(Error::Encode)?;
    if let Err(err) = store
        .put(&format!("{dir}{MANIFEST_FILE}"), json.into(), false)
        .await
    {
        remove_objects(store, &dir).await;
        return Err(err.into());
    }
    tracing::info!(%backup_id, size = manifest.size_bytes(), stored = manifest.stored_bytes(), "logical backup completed");
    Ok(manifest)
}

async fn dump_all(
    store: &Store,
    tools: &PgTools,
    source: &Source,
    id: &str,
    databases: &[String],
) -> Result<(LogicalObject, Vec<LogicalDatabase>), Error> {
    let dir = backup_dir(id);
    let mut cmd = tools.command("pg_dumpall");
    cmd.arg("--globals-only")
        .arg("--no-password")
        .arg(format!("--dbname={}", source_conninfo(source, "postgres")));
    let globals = dump_into(
        store,
        cmd,
        "pg_dumpall",
        &format!("{dir}{GLOBALS_FILE}"),
        Dumped::Globals,
    )
    .await?;
    let mut dumps = Vec::with_capacity(databases.len());
    for name in databases {
        let mut cmd = tools.command("pg_dump");
        cmd.arg("--format=custom")
            .arg(format!("--compress={PG_DUMP_COMPRESSION}"))
            // pgop's own schema (the poolers' password look-up): the target's manager
            // installs it, and a restore into a database that has it would fail on it.
            .arg(format!(
                "--exclude-schema={}",
                pgop_api::pooler::AUTH_SCHEMA
            ))
            .arg("--no-password")
            .arg(format!("--dbname={}", source_conninfo(source, name)));
        let key = dump_key(id, name);
        let started = std::time::Instant::now();
        let dump = dump_into(store, cmd, "pg_dump", &key, Dumped::Database(name)).await?;
        tracing::info!(database = %name, size = dump.size_bytes, stored = dump.stored_bytes, elapsed = ?started.elapsed(), "database dumped");
        dumps.push(LogicalDatabase {
            name: name.clone(),
            dump,
        });
    }
    Ok((globals, dumps))
}

/// Deletes every object under `dir`, best effort.
async fn remove_objects(store: &Store, dir: &str) {
    match store.list(dir).await {
        Ok(objects) => {
            for object in objects {
                if let Err(err) = store.delete(&object.key).await {
                    tracing::warn!(error = %err, "failed to remove a leftover of a failed logical backup");
                }
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, "failed to list the leftovers of a failed logical backup")
        }
    }
}
