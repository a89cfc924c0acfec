//! `spec.databases` on the primary: each declared database made to match (`CREATE
//! DATABASE` with its owner, encoding, locale and connection limit, or `ALTER DATABASE` for
//! the owner and connection limit; a different encoding or locale of an existing database
//! is reported, never changed), then, connected to that database, its schemas and
//! extensions, then the drops of `ensure: absent`. Databases, schemas and extensions not
//! declared are never touched. Runs after [`Instance::apply_roles`], so that declared
//! owners exist.
//!
//! Every name is one the API refused otherwise, and is quoted again here
//! ([`sql::quote_ident`], [`sql::quote_literal`]). What PostgreSQL refuses (a missing
//! extension, a non-empty schema, a database with sessions) is reported for that database
//! on `/pg/status`, never returned as a failed pass, and retried like the roles (see
//! [`super::roles::RETRY_FAILED`]).

use super::roles::{digest, refused};
use super::{Error, Instance};
use crate::pg::sql::{self, Endpoint};
use pgop_api::databases::{DatabaseSpec, ExtensionSpec, SchemaSpec};
use pgop_api::roles::{AppliedStatus, Ensure};
use tokio_postgres::Client;

impl Instance {
    /// Primary: makes PostgreSQL's databases match `databases` (see the module doc). Only a
    /// failed connection to the `postgres` database is an error.
    pub async fn apply_databases(&self, databases: &[DatabaseSpec]) -> Result<(), Error> {
        let wanted = digest(&serde_json::to_string(databases).unwrap_or_default());
        if !self.desired().databases.due(wanted) {
            return Ok(());
        }
        let mut report = Vec::with_capacity(databases.len());
        if !databases.is_empty() {
            let endpoint = self.endpoint();
            let client = endpoint.connect().await.map_err(Error::Connect)?;
            let app_database = &self.options.credentials.app_database;
            let mut outcomes = Vec::with_capacity(databases.len());
            for db in databases {
                outcomes.push(match db.ensure {
                    Ensure::Present => present(&client, &endpoint, db).await,
                    // After every present one: nothing declared present is dropped first.
                    Ensure::Absent => Ok(()),
                });
            }
            for (db, outcome) in databases.iter().zip(outcomes.iter_mut()) {
                if db.ensure == Ensure::Absent {
                    *outcome = absent(&client, db, app_database).await;
                }
            }
            for (db, outcome) in databases.iter().zip(outcomes) {
                if let Err(why) = &outcome {
                    tracing::warn!(database = %db.name, error = %why, "a declared database was not applied");
                }
                report.push(AppliedStatus {
                    name: db.name.clone(),
                    applied: outcome.is_ok(),
                    message: outcome.err(),
                });
            }
            tracing::info!(
                databases = databases.len(),
                failed = report.iter().filter(|r| !r.applied).count(),
                "applied spec.databases"
            );
        }
        self.desired().databases.applied(wanted, report);
        Ok(())
    }
}

/// The database as PostgreSQL has it.
struct Found {
    encoding: String,
    collate: String,
    ctype: String,
    connection_limit: i32,
    owner: String,
}

async fn find(client: &Client, name: &str) -> Result<Option<Found>, String> {
    let row = client
        .query_opt(
            "SELECT pg_encoding_to_char(encoding)::text, datcollate::text, datctype::text, \
                    datconnlimit, pg_get_userbyid(datdba)::text \
             FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .map_err(|e| refused(&e))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let text = |i: usize| row.try_get::<_, String>(i).map_err(|e| refused(&e));
    Ok(Some(Found {
        encoding: text(0)?,
        collate: text(1)?,
        ctype: text(2)?,
        connection_limit: row.try_get(3).map_err(|e| refused(&e))?,
        owner: text(4)?,
    }))
}

/// The `CREATE DATABASE` of a declaration: `template0` when an encoding or locale is
/// declared (`template1` may hold objects in another encoding).
fn create_statement(db: &DatabaseSpec) -> String {
    let mut statement = format!(
        "CREATE DATABASE {} OWNER {}",
        sql::quote_ident(&db.name),
        sql::quote_ident(&db.owner)
    );
    if db.encoding.is_some() || db.locale.is_some() {
        statement.push_str(" TEMPLATE template0");
    }
    if let Some(encoding) = &db.encoding {
        statement.push_str(&format!(" ENCODING {}", sql::quote_literal(encoding)));
    }
    if let Some(locale) = &db.locale {
        statement.push_str(&format!(" LOCALE {}", sql::quote_literal(locale)));
    }
    statement.push_str(&format!(" CONNECTION LIMIT {}", db.connection_limit));
    statement
}

/// `ensure: present`: the database created or altered, then its schemas and extensions.
/// Every problem is reported, joined with `; `.
async fn present(client: &Client, endpoint: &Endpoint, db: &DatabaseSpec) -> Result<(), String> {
    let ident = sql::quote_ident(&db.name);
    let mut problems = Vec::new();
    match find(client, &db.name).await? {
        None => {
            client
                .batch_execute(&create_statement(db))
                .await
                .map_err(|e| refused(&e))?;
        }
        Some(found) => {
            if found.owner != db.owner {
                let statement = format!(
                    "ALTER DATABASE {ident} OWNER TO {}",
                    sql::quote_ident(&db.owner)
                );
                if let Err(e) = client.batch_execute(&statement).await {
                    problems.push(refused(&e));
                }
            }
            if found.connection_limit != db.connection_limit {
                let statement = format!(
                    "ALTER DATABASE {ident} CONNECTION LIMIT {}",
                    db.connection_limit
                );
                if let Err(e) = client.batch_execute(&statement).await {
                    problems.push(refused(&e));
                }
            }
            if let Some(encoding) = &db.encoding {
                // PostgreSQL's own name for the declared encoding (`utf8` is `UTF8`).
                let canonical: Option<String> = client
                    .query_one(
                        "SELECT CASE WHEN pg_char_to_encoding($1) >= 0 \
                         THEN pg_encoding_to_char(pg_char_to_encoding($1))::text END",
                        &[encoding],
                    )
                    .await
                    .and_then(|r| r.try_get(0))
                    .map_err(|e| refused(&e))?;
                if canonical.as_deref() != Some(found.encoding.as_str()) {
                    problems.push(format!(
                        "the encoding is {}, declared {encoding}: it is set only when the \
                         database is created",
                        found.encoding
                    ));
                }
            }
            if let Some(locale) = &db.locale
                && (found.collate != *locale || found.ctype != *locale)
            {
                problems.push(format!(
                    "the locale is {} (LC_COLLATE) and {} (LC_CTYPE), declared {locale}: it \
                     is set only when the database is created",
                    found.collate, found.ctype
                ));
            }
        }
    }
    if !db.schemas.is_empty() || !db.extensions.is_empty() {
        let inside = endpoint
            .connect_to(&db.name)
            .await
            .map_err(|e| format!("connecting to the database: {}", crate::error_chain(&e)))?;
        contents(&inside, db, &mut problems).await;
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// The database's schemas and extensions: present schemas, present extensions (which may
/// go into those schemas), absent extensions, absent schemas (which those may have held).
async fn contents(client: &Client, db: &DatabaseSpec, problems: &mut Vec<String>) {
    let owner = |s: &SchemaSpec| s.owner.clone().unwrap_or_else(|| db.owner.clone());
    for schema in db.schemas.iter().filter(|s| s.ensure == Ensure::Present) {
        if let Err(why) = schema_present(client, &schema.name, &owner(schema)).await {
            problems.push(format!("schema {:?}: {why}", schema.name));
        }
    }
    for ext in db.extensions.iter().filter(|e| e.ensure == Ensure::Present) {
        if let Err(why) = extension_present(client, ext).await {
            problems.push(format!("extension {:?}: {why}", ext.name));
        }
    }
    for ext in db.extensions.iter().filter(|e| e.ensure == Ensure::Absent) {
        let statement = format!("DROP EXTENSION IF EXISTS {}", sql::quote_ident(&ext.name));
        if let Err(e) = client.batch_execute(&statement).await {
            problems.push(format!("extension {:?}: {}", ext.name, refused(&e)));
        }
    }
    for schema in db.schemas.iter().filter(|s| s.ensure == Ensure::Absent) {
        let statement = format!("DROP SCHEMA IF EXISTS {}", sql::quote_ident(&schema.name));
        if let Err(e) = client.batch_execute(&statement).await {
            problems.push(format!("schema {:?}: {}", schema.name, refused(&e)));
        }
    }
}

async fn schema_present(client: &Client, name: &str, owner: &str) -> Result<(), String> {
    let found: Option<String> = client
        .query_opt(
            "SELECT pg_get_userbyid(nspowner)::text FROM pg_namespace WHERE nspname = $1",
            &[&name],
        )
        .await
        .and_then(|row| row.map(|r| r.try_get(0)).transpose())
        .map_err(|e| refused(&e))?;
    let statement = match found {
        None => format!(
            "CREATE SCHEMA {} AUTHORIZATION {}",
            sql::quote_ident(name),
            sql::quote_ident(owner)
        ),
        Some(o) if o != owner => format!(
            "ALTER SCHEMA {} OWNER TO {}",
            sql::quote_ident(name),
            sql::quote_ident(owner)
        ),
        Some(_) => return Ok(()),
    };
    client
        .batch_execute(&statement)
        .await
        .map_err(|e| refused(&e))
}

/// The statements that bring an extension from what PostgreSQL has (`found`: its version
/// and schema, or nothing) to its declaration.
fn extension_statements(ext: &ExtensionSpec, found: Option<(&str, &str)>) -> Vec<String> {
    let ident = sql::quote_ident(&ext.name);
    let Some((version, schema)) = found else {
        let mut create = format!("CREATE EXTENSION {ident}");
        if let Some(schema) = &ext.schema {
            create.push_str(&format!(" SCHEMA {}", sql::quote_ident(schema)));
        }
        if let Some(version) = &ext.version {
            create.push_str(&format!(" VERSION {}", sql::quote_literal(version)));
        }
        return vec![create];
    };
    let mut out = Vec::new();
    if let Some(wanted) = ext.version.as_deref().filter(|w| *w != version) {
        out.push(format!(
            "ALTER EXTENSION {ident} UPDATE TO {}",
            sql::quote_literal(wanted)
        ));
    }
    if let Some(wanted) = ext.schema.as_deref().filter(|w| *w != schema) {
        out.push(format!(
            "ALTER EXTENSION {ident} SET SCHEMA {}",
            sql::quote_ident(wanted)
        ));
    }
    out
}

async fn extension_present(client: &Client, ext: &ExtensionSpec) -> Result<(), String> {
    let row = client
        .query_opt(
            "SELECT e.extversion::text, n.nspname::text FROM pg_extension e \
             JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = $1",
            &[&ext.name],
        )
        .await
        .map_err(|e| refused(&e))?;
    let found = match &row {
        None => None,
        Some(r) => Some((
            r.try_get::<_, String>(0).map_err(|e| refused(&e))?,
            r.try_get::<_, String>(1).map_err(|e| refused(&e))?,
        )),
    };
    let found = found.as_ref().map(|(v, s)| (v.as_str(), s.as_str()));
    for statement in extension_statements(ext, found) {
        client
            .batch_execute(&statement)
            .await
            .map_err(|e| refused(&e))?;
    }
    Ok(())
}

/// `ensure: absent`: the database dropped if it exists; never the application database.
async fn absent(client: &Client, db: &DatabaseSpec, app_database: &str) -> Result<(), String> {
    if db.name == app_database {
        return Err(format!(
            "{:?} is the application database (spec.bootstrap.initdb.database): pgop never \
             drops it",
            db.name
        ));
    }
    client
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {}",
            sql::quote_ident(&db.name)
        ))
        .await
        .map_err(|e| refused(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(v: serde_json::Value) -> DatabaseSpec {
        serde_json::from_value(v).expect("database")
    }

    #[test]
    fn a_database_is_created_from_template0_only_with_an_encoding_or_locale() {
        let plain = database(serde_json::json!({"name": "shop", "owner": "reporting"}));
        assert_eq!(
            create_statement(&plain),
            "CREATE DATABASE \"shop\" OWNER \"reporting\" CONNECTION LIMIT -1"
        );
        let full = database(serde_json::json!({"name": "shop", "owner": "reporting",
            "encoding": "UTF8", "locale": "C.UTF-8", "connectionLimit": 5}));
        assert_eq!(
            create_statement(&full),
            "CREATE DATABASE \"shop\" OWNER \"reporting\" TEMPLATE template0 ENCODING 'UTF8' \
             LOCALE 'C.UTF-8' CONNECTION LIMIT 5"
        );
        // Whatever slipped past the API is still one quoted identifier or literal.
        let mut odd = full.clone();
        odd.name = "x\"; DROP DATABASE app; --".into();
        odd.locale = Some("C'; DROP DATABASE app; --".into());
        let statement = create_statement(&odd);
        assert!(statement.starts_with("CREATE DATABASE \"x\"\"; DROP DATABASE app; --\" "));
        assert!(statement.contains("LOCALE 'C''; DROP DATABASE app; --'"));
    }

    #[test]
    fn an_extension_is_created_then_only_updated_or_moved_as_declared() {
        let ext: ExtensionSpec = serde_json::from_value(
            serde_json::json!({"name": "uuid-ossp", "version": "1.1", "schema": "sales"}),
        )
        .expect("extension");
        assert_eq!(
            extension_statements(&ext, None),
            ["CREATE EXTENSION \"uuid-ossp\" SCHEMA \"sales\" VERSION '1.1'"]
        );
        assert!(extension_statements(&ext, Some(("1.1", "sales"))).is_empty());
        assert_eq!(
            extension_statements(&ext, Some(("1.0", "public"))),
            [
                "ALTER EXTENSION \"uuid-ossp\" UPDATE TO '1.1'",
                "ALTER EXTENSION \"uuid-ossp\" SET SCHEMA \"sales\"",
            ]
        );
        let loose: ExtensionSpec =
            serde_json::from_value(serde_json::json!({"name": "pgcrypto"})).expect("extension");
        assert_eq!(
            extension_statements(&loose, None),
            ["CREATE EXTENSION \"pgcrypto\""]
        );
        assert!(extension_statements(&loose, Some(("1.3", "public"))).is_empty());
    }
}
