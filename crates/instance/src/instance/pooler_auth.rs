//! The poolers' look-up of passwords (PgBouncer's `auth_user` and `auth_query`), on the
//! primary: the role [`AUTH_USER`] with the password of `<cluster>.pooler`, and in every
//! database that takes connections (`template1` included, so that a database created later
//! has it) a schema [`AUTH_SCHEMA`] with one `SECURITY DEFINER` function,
//! [`AUTH_FUNCTION`]`(name)`, that only [`AUTH_USER`] may call. It returns a role's SCRAM
//! verifier when that role may log in, its password has not expired, and it is neither a
//! superuser nor a replication role nor one of pgop's (`pgop_*`): no pooler ever logs
//! those in. Without poolers [`AUTH_USER`] cannot log in.
//!
//! Nothing here comes from a user but the password, which reaches PostgreSQL as its SCRAM
//! verifier only ([`sql::password_literal`]); database names are quoted by the driver.

use super::roles::digest;
use super::{Error, Instance};
use crate::pg::sql;
use pgop_api::pooler::{AUTH_FUNCTION, AUTH_SCHEMA, AUTH_USER};
use std::collections::BTreeSet;

/// What was last done on this primary.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// A digest of the password set (`None`: the role is not set up, or is shut).
    password: Option<u64>,
    /// The databases (by oid: one dropped and made again is new) that have the function.
    databases: BTreeSet<u32>,
    /// Without poolers: the role was found shut (or shut) since the manager started.
    shut: bool,
}

/// The function and its schema in one database; idempotent.
fn install_sql() -> String {
    let user = sql::quote_ident(AUTH_USER);
    let schema = sql::quote_ident(AUTH_SCHEMA);
    format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         REVOKE ALL ON SCHEMA {schema} FROM PUBLIC;
         GRANT USAGE ON SCHEMA {schema} TO {user};
         CREATE OR REPLACE FUNCTION {AUTH_FUNCTION}(i_username text, OUT usename name, OUT passwd text)
           RETURNS record LANGUAGE sql STABLE STRICT SECURITY DEFINER
           SET search_path = pg_catalog, pg_temp
           AS $pgop$
             SELECT a.rolname, a.rolpassword FROM pg_catalog.pg_authid a
             WHERE a.rolname = i_username AND a.rolcanlogin AND NOT a.rolsuper
               AND NOT a.rolreplication AND a.rolname NOT LIKE 'pgop\\_%'
               AND (a.rolvaliduntil IS NULL OR a.rolvaliduntil > pg_catalog.now())
           $pgop$;
         REVOKE ALL ON FUNCTION {AUTH_FUNCTION}(text) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION {AUTH_FUNCTION}(text) TO {user};"
    )
}

impl Instance {
    /// Primary: with `password` (the cluster has poolers), [`AUTH_USER`] logs in with it
    /// and every database has the look-up function; without, [`AUTH_USER`] (if any) may not
    /// log in. Each database is done once per manager (a new one at the next pass).
    pub async fn apply_pooler_auth(&self, password: Option<&str>) -> Result<(), Error> {
        if password.is_none() {
            let d = self.desired();
            if d.pooler_auth.shut && d.pooler_auth.password.is_none() {
                return Ok(());
            }
        }
        let client = self.endpoint().connect().await.map_err(Error::Connect)?;
        let user = sql::quote_ident(AUTH_USER);
        let Some(password) = password else {
            let had = self.desired().pooler_auth.password.take().is_some();
            self.desired().pooler_auth.databases.clear();
            if had
                || client
                    .query_opt(
                        "SELECT 1 FROM pg_roles WHERE rolname = $1 AND rolcanlogin",
                        &[&AUTH_USER],
                    )
                    .await
                    .map_err(Error::PoolerAuth)?
                    .is_some()
            {
                client
                    .batch_execute(&format!("ALTER ROLE {user} NOLOGIN PASSWORD NULL"))
                    .await
                    .map_err(Error::PoolerAuth)?;
                tracing::info!(
                    role = AUTH_USER,
                    "no poolers: their look-up role may no longer log in"
                );
            }
            self.desired().pooler_auth.shut = true;
            return Ok(());
        };
        self.desired().pooler_auth.shut = false;
        let wanted = digest(&password);
        if self.desired().pooler_auth.password != Some(wanted) {
            let exists = client
                .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&AUTH_USER])
                .await
                .map_err(Error::PoolerAuth)?
                .is_some();
            let verb = if exists { "ALTER" } else { "CREATE" };
            client
                .batch_execute(&format!(
                    "{verb} ROLE {user} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT \
                     NOREPLICATION NOBYPASSRLS CONNECTION LIMIT -1 PASSWORD {}",
                    sql::password_literal(password)
                ))
                .await
                .map_err(Error::PoolerAuth)?;
            self.desired().pooler_auth.password = Some(wanted);
            tracing::info!(role = AUTH_USER, "the poolers' look-up role is set up");
        }
        let databases = client
            .query(
                "SELECT oid, datname::text FROM pg_database WHERE datallowconn ORDER BY datname",
                &[],
            )
            .await
            .map_err(Error::PoolerAuth)?;
        let install = install_sql();
        for row in databases {
            let oid: u32 = row.try_get(0).map_err(Error::PoolerAuth)?;
            let name: String = row.try_get(1).map_err(Error::PoolerAuth)?;
            if self.desired().pooler_auth.databases.contains(&oid) {
                continue;
            }
            let result = async {
                let db = self
                    .endpoint()
                    .connect_to(&name)
                    .await
                    .map_err(Error::Connect)?;
                db.batch_execute(&install).await.map_err(Error::PoolerAuth)
            }
            .await;
            match result {
                Ok(()) => {
                    self.desired().pooler_auth.databases.insert(oid);
                    tracing::info!(database = %name, function = AUTH_FUNCTION, "the poolers' password look-up is installed");
                }
                // One database that refuses (being dropped, a read-only one) does not stop
                // the others; it is tried again at the next pass.
                Err(err) => {
                    tracing::warn!(database = %name, error = %crate::error_chain(&err), "could not install the poolers' password look-up");
                }
            }
        }
        Ok(())
    }
}
