//! The first primary's data directory: initdb with data checksums, then (on the running
//! server) the application database and owner and the replication role. It must never run
//! on a directory that holds data: the caller wipes it under the bootstrap marker first.

use super::{Credentials, Error, run};
use crate::pg::sql::{SUPERUSER, quote_ident, quote_literal};
use crate::pg::{Binaries, RunAs, binaries};
use std::path::Path;
use tokio_postgres::Client;

/// Runs initdb into the (empty) PGDATA, with data checksums.
pub async fn initdb(
    binaries: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
) -> Result<(), Error> {
    let cmd = initdb_command(binaries, run_as, pgdata, Checksums::On);
    run("initdb", cmd).await.map(|_| ())
}

/// Whether initdb turns data checksums on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksums {
    On,
    /// Off: `--no-data-checksums` for PostgreSQL 18 and later (checksums are their
    /// default), nothing before (off was theirs).
    Off {
        major: u32,
    },
}

/// The initdb command of every data directory pgop makes (a bootstrap, and the new cluster
/// of a major upgrade): the superuser [`SUPERUSER`] trusted over the Unix socket only,
/// SCRAM over TCP, UTF8, locale C, and data checksums as `checksums` says.
pub fn initdb_command(
    binaries: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
    checksums: Checksums,
) -> tokio::process::Command {
    let mut cmd = binaries::command(binaries, "initdb", run_as);
    cmd.arg("--pgdata").arg(pgdata).args([
        "--username",
        SUPERUSER,
        "--auth-local=trust",
        "--auth-host=scram-sha-256",
        "--encoding=UTF8",
        "--locale=C",
    ]);
    match checksums {
        Checksums::On => {
            cmd.arg("--data-checksums");
        }
        Checksums::Off { major } if major >= 18 => {
            cmd.arg("--no-data-checksums");
        }
        Checksums::Off { .. } => {}
    }
    cmd
}

/// Creates the application owner and database and the replication role. Idempotent, so an
/// interrupted bootstrap can run it again.
pub async fn create_roles(client: &Client, credentials: &Credentials) -> Result<(), Error> {
    let Credentials {
        app_user,
        app_password,
        app_database,
        replication_user,
        replication_password,
    } = credentials;
    // The API refuses these names; the Secrets they come from are checked again here, so
    // that the application never gets the superuser's or the replication role's password.
    for (what, name) in [("owner", app_user), ("database", app_database)] {
        if pgop_api::cluster::is_reserved_name(name) || !pgop_api::formats::is_identifier(name) {
            return Err(Error::ReservedName {
                what,
                name: name.clone(),
            });
        }
    }
    let role = |name: &str, password: &str, extra: &str| {
        format!(
            "DO $pgop$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {lit}) THEN
                 CREATE ROLE {ident} LOGIN {extra};
               END IF;
             END $pgop$;
             ALTER ROLE {ident} LOGIN {extra} PASSWORD {password};",
            lit = quote_literal(name),
            ident = quote_ident(name),
            password = crate::pg::sql::password_literal(password),
        )
    };
    client
        .batch_execute(&role(app_user, app_password, ""))
        .await
        .map_err(Error::CreateRoles)?;
    client
        .batch_execute(&role(replication_user, replication_password, "REPLICATION"))
        .await
        .map_err(Error::CreateRoles)?;
    // pg_rewind reads the new primary's files through these functions: the replication
    // role may use them without being a superuser.
    let replica = quote_ident(replication_user);
    client
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION pg_catalog.pg_ls_dir(text, boolean, boolean) TO {replica};
             GRANT EXECUTE ON FUNCTION pg_catalog.pg_stat_file(text, boolean) TO {replica};
             GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text) TO {replica};
             GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean) TO {replica};"
        ))
        .await
        .map_err(Error::CreateRoles)?;
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_database WHERE datname = $1",
            &[app_database],
        )
        .await
        .map_err(Error::CreateRoles)?;
    if exists.is_none() {
        // CREATE DATABASE cannot run in a transaction block, hence not in the DO above.
        client
            .batch_execute(&format!(
                "CREATE DATABASE {} OWNER {}",
                quote_ident(app_database),
                quote_ident(app_user)
            ))
            .await
            .map_err(Error::CreateRoles)?;
    }
    Ok(())
}
