//! The credentials a user brings (`spec.credentials`), end to end on the local node: the
//! application owner's password from the user's own Secret (copied, rotated, a bad one
//! refused with an Event), and the superuser, refused over the network unless
//! `superuserAccess`, then with the user's or a generated password, and refused again
//! when access is turned off.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgop_testenv::wait;

/// A TLS connection (no verification: the TLS tests check names) as `user` to `dbname`.
async fn login(
    host: &str,
    (user, password, dbname): (&str, &str, &str),
) -> std::result::Result<tokio_postgres::Client, String> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(host)
        .port(5432)
        .user(user)
        .password(password)
        .dbname(dbname)
        .connect_timeout(std::time::Duration::from_secs(5));
    let tls = pgop_tls::postgres::PostgresTls::without_verification().map_err(|e| e.to_string())?;
    pgop_tls::postgres::connect(&mut config, Some(tls))
        .await
        .map_err(|e| format!("{e:?}"))
}

/// Waits until `user` logs in with `password` at `host`.
async fn wait_login(host: &str, who: (&str, &str, &str)) -> Result<tokio_postgres::Client> {
    let what = format!("{} logs in with the expected password", who.0);
    Ok(wait::until(&what, TIMEOUT, || async { login(host, who).await }).await?)
}

/// Waits until `user`'s login with `password` at `host` is refused with a message
/// containing `because`.
async fn wait_refused(host: &str, who: (&str, &str, &str), because: &str) -> Result<String> {
    let what = format!("{}'s login refused ({because})", who.0);
    Ok(wait::until(&what, TIMEOUT, || async {
        match login(host, who).await {
            Err(e) if e.contains(because) => Ok(e),
            Err(e) => Err(e),
            Ok(_) => Err("logged in".to_string()),
        }
    })
    .await?)
}

fn key(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
}

#[tokio::test]
async fn e2e_users_bring_their_passwords_and_the_superuser_logs_in_only_when_asked() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("e2e-cred").await?;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), env.n());
    let first = "Shop's first \"password\" $(id) #1";
    let dba = "dba:password/with@signs";
    for s in [
        secret("shop-login", &[("username", "app"), ("password", first)]),
        secret("dba-login", &[("password", dba)]),
    ] {
        secrets.create(&PostParams::default(), &s).await?;
    }
    env.create(
        "cred",
        serde_json::json!({
            "replicas": 1,
            "storage": {"size": "1Gi"},
            "credentials": {"appSecret": "shop-login"},
        }),
    )
    .await?;
    env.wait_ready("cred", 1).await?;
    let ip = env.pod_ip(&env.current_primary("cred").await?).await?;

    // 1. The app owner's password is the user's, copied into cred-app with its URI.
    let app = secrets.get("cred-app").await?;
    assert_eq!(key(&app, "password").as_deref(), Some(first));
    assert!(
        key(&app, "uri").is_some_and(|u| u.contains("Shop%27s%20first")),
        "the uri follows the user's password"
    );
    wait_login(&ip, ("app", first, "app")).await?;

    // 2. The superuser never logs in over the network by default, with any password, and
    //    no Secret holds one.
    let refused = wait_refused(&ip, ("postgres", dba, "postgres"), "pg_hba.conf rejects").await?;
    println!("superuser refused by default: {refused}");
    assert!(secrets.get_opt("cred-superuser").await?.is_none());

    // 3. Rotation in the user's Secret: the new password works, the old one is refused,
    //    cred-app follows.
    let second = "second-password";
    let rotate = |password: &str| serde_json::json!({"stringData": {"password": password}});
    secrets
        .patch(
            "shop-login",
            &PatchParams::default(),
            &Patch::Merge(rotate(second)),
        )
        .await?;
    wait_login(&ip, ("app", second, "app")).await?;
    wait_refused(&ip, ("app", first, "app"), "password authentication failed").await?;
    assert_eq!(
        key(&secrets.get("cred-app").await?, "password").as_deref(),
        Some(second)
    );

    // 4. A Secret naming another role is refused with an Event naming the field; the
    //    password in force stays.
    let wrong = serde_json::json!({"stringData": {"username": "shop", "password": "third"}});
    secrets
        .patch("shop-login", &PatchParams::default(), &Patch::Merge(wrong))
        .await?;
    let note = env.wait_event("CredentialsSecretRefused").await?;
    assert!(
        note.contains("spec.credentials.appSecret") && note.contains("shop-login"),
        "{note}"
    );
    assert!(
        !note.contains("third"),
        "the password is never quoted: {note}"
    );
    login(&ip, ("app", second, "app")).await?;
    assert_eq!(
        key(&secrets.get("cred-app").await?, "password").as_deref(),
        Some(second),
        "a refused Secret changed the password"
    );

    // 5. Superuser access with the user's password: over TLS, to any database.
    env.patch(
        "cred",
        serde_json::json!({"spec": {"credentials": {
            "superuserAccess": true, "superuserSecret": "dba-login"
        }}}),
    )
    .await?;
    let su = wait_login(&ip, ("postgres", dba, "postgres")).await?;
    let is_superuser: bool = su
        .query_one(
            "select rolsuper from pg_roles where rolname = current_user",
            &[],
        )
        .await?
        .get(0);
    assert!(is_superuser);
    // The password reached PostgreSQL as a SCRAM verifier only.
    let stored: String = su
        .query_one(
            "select rolpassword from pg_authid where rolname = 'postgres'",
            &[],
        )
        .await?
        .get(0);
    assert!(stored.starts_with("SCRAM-SHA-256$"), "{stored}");
    let superuser = secrets.get("cred-superuser").await?;
    assert_eq!(key(&superuser, "password").as_deref(), Some(dba));
    assert_eq!(key(&superuser, "username").as_deref(), Some("postgres"));

    // 6. Without a Secret of the user's, the password last copied stays; deleting
    //    cred-superuser then gives a generated one, which PostgreSQL takes.
    env.patch(
        "cred",
        serde_json::json!({"spec": {"credentials": {"superuserSecret": null}}}),
    )
    .await?;
    let generation = env.clusters().get("cred").await?.metadata.generation;
    env.wait_cluster(
        "cred",
        "the spec without superuserSecret observed",
        TIMEOUT,
        |s| s.observed_generation >= generation,
    )
    .await?;
    login(&ip, ("postgres", dba, "postgres")).await?;
    secrets
        .delete("cred-superuser", &Default::default())
        .await?;
    let generated = wait::until("a generated superuser password", TIMEOUT, || async {
        let s = secrets
            .get("cred-superuser")
            .await
            .map_err(|e| e.to_string())?;
        match key(&s, "password") {
            Some(p) if p != dba => Ok(p),
            other => Err(format!("still the user's: {}", other.is_some())),
        }
    })
    .await?;
    wait_login(&ip, ("postgres", &generated, "postgres")).await?;
    wait_refused(
        &ip,
        ("postgres", dba, "postgres"),
        "password authentication failed",
    )
    .await?;

    // 7. Access off again: refused before any password is checked (the manager also sets
    //    the superuser's password to NULL), and no Secret holds one.
    env.patch(
        "cred",
        serde_json::json!({"spec": {"credentials": {"superuserAccess": false}}}),
    )
    .await?;
    wait_refused(
        &ip,
        ("postgres", &generated, "postgres"),
        "pg_hba.conf rejects",
    )
    .await?;
    wait::until("cred-superuser deleted", TIMEOUT, || async {
        match secrets.get_opt("cred-superuser").await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|s| s.is_some()))),
        }
    })
    .await?;
    login(&ip, ("app", second, "app")).await?;

    // No password appears in any Event or in the cluster's status.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.client.clone(), env.n());
    let events = serde_json::to_string(&events.list(&Default::default()).await?.items)?;
    let status = serde_json::to_string(&env.clusters().get("cred").await?.status)?;
    for password in [first, second, dba, generated.as_str()] {
        assert!(!events.contains(password), "a password in an Event");
        assert!(!status.contains(password), "a password in the status");
    }
    env.stop().await
}
