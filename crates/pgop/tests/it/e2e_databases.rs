//! Declared databases (`spec.databases`) end to end on the local node with real
//! PostgreSQL: the primary's manager creates them with their owner (a declared role),
//! encoding, locale and connection limit, their schemas and extensions, also in the
//! application database; an extension PostgreSQL does not have is a
//! `DatabasesApplied=False` condition quoting PostgreSQL, with a `DatabaseFailed` Event,
//! while the cluster stays Ready and the other databases are applied; a changed limit is
//! altered, `ensure: absent` drops an extension and a database; a schema that still holds a
//! table is not dropped (reported, the table kept); what is removed from the spec is kept.

use crate::common;

use common::*;
use kube::api::{Api, PostParams};
use pgop_api::conditions;
use serde_json::json;

const FIVE_SECONDS: std::time::Duration = std::time::Duration::from_secs(5);

fn databases_applied(s: &pgop_api::PostgresClusterStatus) -> Option<(String, String, String)> {
    conditions::find_condition(&s.conditions, conditions::DATABASES_APPLIED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The extensions of the database `c` is connected to, as `name@schema`.
async fn extensions(c: &tokio_postgres::Client) -> Result<Vec<String>> {
    Ok(c.query(
        "select e.extname || '@' || n.nspname from pg_extension e \
         join pg_namespace n on n.oid = e.extnamespace where e.extname <> 'plpgsql' order by 1",
        &[],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect())
}

const REPORTING: &str = "reporting's password";

fn reporting() -> serde_json::Value {
    json!({"name": "reporting", "login": true, "passwordSecret": {"name": "reporting-password"}})
}

#[tokio::test]
async fn e2e_declared_databases_schemas_and_extensions_are_kept_as_declared() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("databases").await?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(env.client.clone(), env.n());
    secrets
        .create(
            &PostParams::default(),
            &secret("reporting-password", &[("password", REPORTING)]),
        )
        .await?;
    let name = "databases";
    env.create(
        name,
        json!({"replicas": 1, "storage": {"size": "1Gi"}, "roles": [reporting()],
        "databases": [
            {"name": "shop", "owner": "reporting", "encoding": "UTF8", "locale": "C",
             "connectionLimit": 10, "schemas": [{"name": "sales"}, {"name": "scratch"}],
             "extensions": [{"name": "pgcrypto", "schema": "sales"}, {"name": "hstore"}]},
            {"name": "app", "owner": "app", "extensions": [{"name": "pg_trgm"}]},
            {"name": "broken", "owner": "reporting",
             "extensions": [{"name": "no_such_extension"}]}
        ]}),
    )
    .await?;
    env.wait_ready(name, 1).await?;

    // The missing extension is reported for its database alone, quoting PostgreSQL.
    let failed = env
        .wait_cluster(name, "the missing extension reported", TIMEOUT, |s| {
            databases_applied(s).is_some_and(|(status, reason, _)| {
                status == conditions::FALSE && reason == "DatabaseFailed"
            })
        })
        .await?;
    let status = failed.status.as_ref().ok_or("no status")?;
    let (_, _, message) = databases_applied(status).ok_or("no condition")?;
    assert!(
        message.starts_with("broken: ") && message.contains("no_such_extension"),
        "{message}"
    );
    let applied: Vec<(&str, bool)> = status
        .databases
        .iter()
        .map(|d| (d.name.as_str(), d.applied))
        .collect();
    assert_eq!(applied, [("shop", true), ("app", true), ("broken", false)]);
    let event = env.wait_event("DatabaseFailed").await?;
    assert!(
        event.contains("spec.databases") && event.contains("no_such_extension"),
        "{event}"
    );
    env.wait_ready(name, 1).await?;

    // As declared: owner, encoding, locale, limit, schemas, extensions.
    let primary = env.current_primary(name).await?;
    let ip = env.pod_ip(&primary).await?;
    let shop = connect_to(&ip, "shop", "reporting", REPORTING, FIVE_SECONDS).await?;
    let row = shop
        .query_one(
            "select pg_get_userbyid(datdba)::text, pg_encoding_to_char(encoding)::text, \
             datcollate::text, datctype::text, datconnlimit from pg_database \
             where datname = 'shop'",
            &[],
        )
        .await?;
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, String>(2),
            row.get::<_, String>(3),
            row.get::<_, i32>(4)
        ),
        (
            "reporting".into(),
            "UTF8".into(),
            "C".into(),
            "C".into(),
            10
        )
    );
    let schemas: Vec<String> = shop
        .query(
            "select nspname || ':' || pg_get_userbyid(nspowner) from pg_namespace \
             where nspname in ('sales', 'scratch') order by 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(schemas, ["sales:reporting", "scratch:reporting"]);
    assert_eq!(
        extensions(&shop).await?,
        ["hstore@public", "pgcrypto@sales"]
    );
    // The owner uses what was declared: a table in its schema, pgcrypto from `sales`.
    shop.batch_execute(
        "create table scratch.notes (body text); \
         insert into scratch.notes values (encode(sales.digest('kept', 'sha256'), 'hex'))",
    )
    .await?;
    let password = env.password(name).await?;
    let app = connect(&ip, &password).await?;
    assert_eq!(extensions(&app).await?, ["pg_trgm@public"]);

    // A new limit, an extension and a database dropped on request.
    env.patch(
        name,
        json!({"spec": {"databases": [
            {"name": "shop", "owner": "reporting", "encoding": "UTF8", "locale": "C",
             "connectionLimit": 20, "schemas": [{"name": "sales"}, {"name": "scratch"}],
             "extensions": [{"name": "pgcrypto", "schema": "sales"},
                            {"name": "hstore", "ensure": "absent"}]},
            {"name": "app", "owner": "app", "extensions": [{"name": "pg_trgm"}]},
            {"name": "broken", "owner": "reporting", "ensure": "absent"}
        ]}}),
    )
    .await?;
    eventually(
        "the limit, hstore and broken as declared",
        TIMEOUT,
        || async {
            let row = app
                .query_one(
                    "select (select datconnlimit from pg_database where datname = 'shop'), \
                 (select count(*) from pg_database where datname = 'broken')",
                    &[],
                )
                .await
                .ok()?;
            let done = row.get::<_, i32>(0) == 20 && row.get::<_, i64>(1) == 0;
            (done && extensions(&shop).await.ok()? == ["pgcrypto@sales"]).then_some(())
        },
    )
    .await;
    env.wait_cluster(name, "every database applied", TIMEOUT, |s| {
        databases_applied(s).is_some_and(|(status, _, _)| status == conditions::TRUE)
            && s.databases.len() == 3
            && s.databases.iter().all(|d| d.applied)
    })
    .await?;

    // A schema holding a table is not dropped: reported, the table kept. The application
    // database's entry, removed from the spec, is kept with its extension.
    env.patch(
        name,
        json!({"spec": {"databases": [
            {"name": "shop", "owner": "reporting", "connectionLimit": 20,
             "schemas": [{"name": "scratch", "ensure": "absent"}]}
        ]}}),
    )
    .await?;
    let refused = env
        .wait_cluster(
            name,
            "the drop of a schema with a table refused",
            TIMEOUT,
            |s| {
                databases_applied(s).is_some_and(|(status, _, message)| {
                    status == conditions::FALSE && message.contains("scratch")
                })
            },
        )
        .await?;
    let (_, reason, message) = refused
        .status
        .as_ref()
        .and_then(databases_applied)
        .ok_or("no condition")?;
    assert_eq!(reason, "DatabaseFailed");
    assert!(
        message.starts_with("shop: schema \"scratch\": ") && message.contains("depend"),
        "{message}"
    );
    let kept: i64 = shop
        .query_one("select count(*) from scratch.notes", &[])
        .await?
        .get(0);
    assert_eq!(kept, 1, "the table in the schema is kept");
    assert_eq!(extensions(&app).await?, ["pg_trgm@public"]);
    env.wait_ready(name, 1).await?;
    env.stop().await
}
