//! Declared roles (`spec.roles`) end to end on the local node with real PostgreSQL: the
//! primary's manager creates them with their attributes, memberships and the password of
//! their Secret; a new password in the Secret is set; a membership removed from the spec
//! is revoked; a role removed from the spec is kept; `ensure: absent` drops a role, and a
//! drop PostgreSQL refuses (the role owns a database) is a `RolesApplied=False` condition
//! quoting PostgreSQL, with a `RoleFailed` Event, while the cluster stays Ready.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgop_api::conditions;
use serde_json::json;

const FIVE_SECONDS: std::time::Duration = std::time::Duration::from_secs(5);

fn roles_applied(s: &pgop_api::PostgresClusterStatus) -> Option<(String, String, String)> {
    conditions::find_condition(&s.conditions, conditions::ROLES_APPLIED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn e2e_declared_roles_are_created_kept_in_step_and_dropped_on_request() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("roles").await?;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), env.n());
    secrets
        .create(
            &PostParams::default(),
            &secret("reporting-password", &[("password", "first 'pass\" word")]),
        )
        .await?;
    let name = "roles";
    env.create(
        name,
        json!({"replicas": 1, "storage": {"size": "1Gi"}, "roles": [
            {"name": "reporting", "login": true, "createdb": true, "connectionLimit": 5,
             "inRoles": ["pg_monitor", "readers"],
             "passwordSecret": {"name": "reporting-password"}},
            {"name": "readers"},
            {"name": "gone", "ensure": "absent"}
        ]}),
    )
    .await?;
    env.wait_ready(name, 1).await?;
    env.wait_cluster(name, "every role applied", TIMEOUT, |s| {
        roles_applied(s).is_some_and(|(status, _, _)| status == conditions::TRUE)
            && s.roles.len() == 3
            && s.roles.iter().all(|r| r.applied)
    })
    .await?;
    let primary = env.current_primary(name).await?;
    let ip = env.pod_ip(&primary).await?;

    // Created as declared, with the Secret's password (quotes and all).
    let c = connect_to(&ip, "app", "reporting", "first 'pass\" word", FIVE_SECONDS).await?;
    let row = c
        .query_one(
            "select rolcanlogin, rolcreatedb, rolsuper, rolconnlimit, \
             pg_has_role('reporting', 'pg_monitor', 'member'), \
             pg_has_role('reporting', 'readers', 'member') \
             from pg_roles where rolname = 'reporting'",
            &[],
        )
        .await?;
    assert_eq!(
        (
            row.get::<_, bool>(0),
            row.get::<_, bool>(1),
            row.get::<_, bool>(2),
            row.get::<_, i32>(3),
            row.get::<_, bool>(4),
            row.get::<_, bool>(5)
        ),
        (true, true, false, 5, true, true)
    );
    let readers: bool = c
        .query_one(
            "select not rolcanlogin from pg_roles where rolname = 'readers'",
            &[],
        )
        .await?
        .get(0);
    assert!(readers, "readers is a group role (NOLOGIN)");

    // A new password in the Secret is set; the old one stops working.
    secrets
        .patch(
            "reporting-password",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": "second"}})),
        )
        .await?;
    eventually("the new password", TIMEOUT, || async {
        connect_to(&ip, "app", "reporting", "second", FIVE_SECONDS)
            .await
            .ok()
    })
    .await;
    assert!(
        connect_to(&ip, "app", "reporting", "first 'pass\" word", FIVE_SECONDS)
            .await
            .is_err()
    );

    // A membership removed from the spec is revoked; a role removed from it is kept.
    env.patch(
        name,
        json!({"spec": {"roles": [
            {"name": "reporting", "login": true, "createdb": true, "connectionLimit": 5,
             "inRoles": ["pg_monitor"], "passwordSecret": {"name": "reporting-password"}}
        ]}}),
    )
    .await?;
    let c = connect_to(&ip, "app", "reporting", "second", FIVE_SECONDS).await?;
    eventually("the membership in readers revoked", TIMEOUT, || async {
        let row = c
            .query_one("select pg_has_role('reporting', 'readers', 'member')", &[])
            .await
            .ok()?;
        (!row.get::<_, bool>(0)).then_some(())
    })
    .await;
    let kept: i64 = c
        .query_one(
            "select count(*) from pg_roles where rolname = 'readers'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(kept, 1, "a role removed from the spec is retained");

    // The role owns a database: dropping it is refused by PostgreSQL, and said so.
    c.batch_execute("create database reports").await?;
    drop(c);
    env.patch(
        name,
        json!({"spec": {"roles": [
            {"name": "reporting", "ensure": "absent",
             "passwordSecret": {"name": "reporting-password"}}
        ]}}),
    )
    .await?;
    let failed = env
        .wait_cluster(name, "the drop refused", TIMEOUT, |s| {
            roles_applied(s).is_some_and(|(status, reason, _)| {
                status == conditions::FALSE && reason == "RoleFailed"
            })
        })
        .await?;
    let (_, _, message) = failed
        .status
        .as_ref()
        .and_then(roles_applied)
        .ok_or("no condition")?;
    assert!(
        message.contains("reporting") && message.contains("cannot be dropped"),
        "{message}"
    );
    let event = env.wait_event("RoleFailed").await?;
    assert!(event.contains("cannot be dropped"), "{event}");
    env.wait_ready(name, 1).await?;
    let password = env.password(name).await?;
    let app = connect(&ip, &password).await?;
    let still: i64 = app
        .query_one(
            "select count(*) from pg_roles where rolname = 'reporting'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(still, 1);
    env.stop().await
}
