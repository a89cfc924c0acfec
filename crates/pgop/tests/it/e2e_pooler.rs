//! PgBouncer poolers end to end (`spec.poolers`): a real API server, the operator and the
//! local node running the instances' `pgop instance run` and the poolers' `pgop pooler
//! run` (Debian's PgBouncer) beside real PostgreSQL. pgbench and the test's own clients
//! reach the cluster only through the poolers' Services, before, during and after a
//! failover.

use crate::common;

use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

const PGBENCH: &str = "/usr/lib/postgresql/15/bin/pgbench";
/// Server connections per user and database of the `rw` pooler.
const POOL_SIZE: usize = 3;
/// Client connections held open through it at once.
const CLIENTS: usize = 12;
/// The declared role's password, with what PgBouncer's look-up must carry.
const REPORTING_PASSWORD: &str = "rep 'or\" ting";

fn pgbench_binary() -> Result<&'static str> {
    if std::path::Path::new(PGBENCH).exists() {
        Ok(PGBENCH)
    } else {
        Err(format!("{PGBENCH} is missing; run: hack/install-packages.sh test").into())
    }
}

/// The address the pooler Service `<cluster>-pooler-<pooler>` resolves to (one of its ready
/// Pods), once it has one.
async fn pooler_address(env: &Env, cluster: &str, pooler: &str) -> Result<String> {
    let host = format!("{cluster}-pooler-{pooler}.{}.svc", env.n());
    let found = pgop_testenv::wait::until(&format!("{host} resolves"), TIMEOUT, || async {
        pgop_testenv::node::resolve_host(env.node.hosts_file(), &host)
            .ok_or_else(|| "no ready Pod".to_string())
    })
    .await?;
    Ok(found)
}

/// pgbench through `host` (PgBouncer over TLS) with `args`; its output.
async fn pgbench(host: &str, password: &str, args: &[&str]) -> Result<std::process::Output> {
    let out = tokio::process::Command::new(pgbench_binary()?)
        .args(["-h", host, "-p", "5432", "-U", "app", "--no-vacuum"])
        .args(args)
        .arg("app")
        .env("PGPASSWORD", password)
        .env("PGSSLMODE", "require")
        .env("PGCONNECT_TIMEOUT", "5")
        .kill_on_drop(true)
        .output()
        .await?;
    Ok(out)
}

/// "number of transactions actually processed: N" of a pgbench run.
fn processed(out: &std::process::Output) -> Option<u64> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|rest| rest.split(['/', ' ']).next())
        .and_then(|n| n.trim().parse().ok())
}

fn show(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Sessions of user `app` on the instance at `ip` other than the one asking: while the test
/// holds its clients through the rw pooler and nothing else connects as `app` to the
/// primary, the pooler's server connections. (Their client address says nothing here: on
/// the loopback the kernel picks 127.0.0.1 as the source of every connection.)
async fn app_sessions(ip: &str, password: &str) -> Result<i64> {
    let c = connect(ip, password).await?;
    let n: i64 = c
        .query_one(
            "select count(*) from pg_stat_activity \
             where usename = 'app' and backend_type = 'client backend' and pid <> pg_backend_pid()",
            &[],
        )
        .await?
        .get(0);
    Ok(n)
}

/// One sample of `/metrics` of a pooler Pod: the sum of the series `name` whose labels
/// include each of `labels` (`key="value"`).
async fn metric(ip: &str, name: &str, labels: &[&str]) -> Result<f64> {
    let host = format!("{ip}:8000");
    let (code, body) = pgop_operator::cluster::probe::request(&host, "GET", "/metrics", None)
        .await
        .map_err(|e| format!("GET http://{host}/metrics: {e}"))?;
    let body = String::from_utf8_lossy(&body).into_owned();
    if code != 200 {
        return Err(format!("GET http://{host}/metrics: {code}: {body}").into());
    }
    let mut sum = 0.0;
    let mut found = false;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        if let Some((series, value)) = line.rsplit_once(' ')
            && (series == name || series.starts_with(&format!("{name}{{")))
            && labels.iter().all(|l| series.contains(l))
        {
            sum += value.parse::<f64>()?;
            found = true;
        }
    }
    if found {
        Ok(sum)
    } else {
        Err(format!("no series {name} {labels:?} in:\n{body}").into())
    }
}

#[tokio::test]
async fn e2e_pgbench_through_the_poolers_before_during_and_after_a_failover() -> Result {
    let pgbench_path = pgbench_binary()?;
    let env = start("pooler").await?;
    kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(env.client.clone(), env.n())
        .create(
            &kube::api::PostParams::default(),
            &secret("reporting-password", &[("password", REPORTING_PASSWORD)]),
        )
        .await?;
    env.create(
        "pool",
        json!({
            "replicas": 3,
            "storage": {"size": "1Gi"},
            "roles": [{"name": "reporting", "login": true,
                       "passwordSecret": {"name": "reporting-password"}}],
            "poolers": [
                {"name": "rw", "defaultPoolSize": POOL_SIZE, "maxClientConnections": 100},
                {"name": "reports", "type": "ro", "poolMode": "session"},
            ],
        }),
    )
    .await?;
    env.wait_ready("pool", 3).await?;
    env.wait_cluster("pool", "both poolers ready", TIMEOUT, |s| {
        s.poolers.len() == 2 && s.poolers.iter().all(|p| p.ready_instances == 1)
    })
    .await?;
    let password = env.password("pool").await?;
    let rw = pooler_address(&env, "pool", "rw").await?;
    let ro = pooler_address(&env, "pool", "reports").await?;
    println!("pgbench: {pgbench_path}; rw pooler {rw}, ro pooler {ro}");

    // The rw pooler reaches the primary, the ro pooler a standby.
    let c = connect(&rw, &password).await?;
    let recovery: bool = c.query_one("select pg_is_in_recovery()", &[]).await?.get(0);
    assert!(!recovery, "the rw pooler reaches the primary");
    let r = connect(&ro, &password).await?;
    let recovery: bool = r.query_one("select pg_is_in_recovery()", &[]).await?.get(0);
    assert!(recovery, "the ro pooler reaches a standby");
    drop((c, r));

    // A declared role logs in through both poolers too: PgBouncer looks its password up
    // on the server as pgop_pooler.
    env.wait_cluster("pool", "the declared role applied", TIMEOUT, |s| {
        s.roles.iter().any(|r| r.name == "reporting" && r.applied)
    })
    .await?;
    for (pooler, host) in [("rw", &rw), ("reports", &ro)] {
        let c = pgop_testenv::wait::until(
            &format!("reporting logged in through the {pooler} pooler"),
            TIMEOUT,
            || async {
                connect_to(
                    host,
                    "app",
                    "reporting",
                    REPORTING_PASSWORD,
                    Duration::from_secs(5),
                )
                .await
                .map_err(|e| e.to_string())
            },
        )
        .await?;
        let user: String = c.query_one("select current_user::text", &[]).await?.get(0);
        assert_eq!(user, "reporting", "through the {pooler} pooler");
    }

    // Pooling: CLIENTS client connections, each running a 2 s query at the same time,
    // share POOL_SIZE server connections on the primary; the others wait in PgBouncer.
    let primary = env.current_primary("pool").await?;
    let primary_ip = env.pod_ip(&primary).await?;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(connect(&rw, &password).await?);
    }
    let busy = tokio::spawn(async move {
        let queries = clients.iter().map(|c| c.simple_query("select pg_sleep(2)"));
        futures::future::try_join_all(queries).await.map(|_| ())
    });
    let pool = "database=\"app\"".to_string();
    let (servers, waiting) =
        pgop_testenv::wait::until("the pool full and clients waiting", TIMEOUT, || async {
            let servers = app_sessions(&primary_ip, &password)
                .await
                .map_err(|e| e.to_string())?;
            let waiting = metric(
                &rw,
                "pgop_pgbouncer_client_connections",
                &[&pool, "state=\"waiting\""],
            )
            .await
            .map_err(|e| e.to_string())?;
            if servers > POOL_SIZE as i64 {
                return Ok((servers, waiting));
            }
            if servers == POOL_SIZE as i64 && waiting >= 1.0 {
                Ok((servers, waiting))
            } else {
                Err(format!(
                    "{servers} server connections, {waiting} clients waiting"
                ))
            }
        })
        .await?;
    let active = metric(
        &rw,
        "pgop_pgbouncer_server_connections",
        &[&pool, "state=\"active\""],
    )
    .await?;
    println!(
        "{CLIENTS} clients querying through the rw pooler at once: {servers} server \
         connections on the primary ({active} active in the pooler), {waiting} clients waiting"
    );
    assert_eq!(
        servers, POOL_SIZE as i64,
        "server connections for {CLIENTS} clients (pool size {POOL_SIZE})"
    );
    busy.await??;

    // Before: pgbench through the rw pooler.
    let init = pgbench(&rw, &password, &["-i", "-s", "1"]).await?;
    assert!(init.status.success(), "pgbench -i: {}", show(&init));
    let before = pgbench(&rw, &password, &["-c", "4", "-j", "2", "-T", "3"]).await?;
    assert!(before.status.success(), "pgbench before: {}", show(&before));
    assert!(
        processed(&before).is_some_and(|n| n > 0),
        "{}",
        show(&before)
    );

    // During: pgbench runs, one short run after the other, all through the same pooler
    // address, while the primary's postmaster is killed; a client keeps its connection to
    // the pooler across the failover. A pgbench client whose transaction the kill cuts is
    // aborted (pgbench does not retry), and on a slow machine all of a run's clients may
    // be: the next run's clients connect through the pooler again, as an application
    // would.
    let held = connect(&rw, &password).await?;
    // Each run: when it started, and its output.
    type Runs = std::sync::Arc<std::sync::Mutex<Vec<(Instant, std::process::Output)>>>;
    let runs: Runs = Default::default();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let during = tokio::spawn({
        let rw = rw.clone();
        let password = password.clone();
        let stop = stop.clone();
        let runs = runs.clone();
        async move {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let started = Instant::now();
                let out = pgbench(&rw, &password, &["-c", "4", "-j", "2", "-T", "2"]).await?;
                runs.lock().map_err(|_| "poisoned")?.push((started, out));
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }
    });
    let history = |ip: String| {
        let password = password.clone();
        async move {
            let c = connect(&ip, &password).await?;
            let n: i64 = c
                .query_one("select count(*) from pgbench_history", &[])
                .await?
                .get(0);
            Ok::<i64, Box<dyn std::error::Error + Send + Sync>>(n)
        }
    };
    let at_start = history(primary_ip.clone()).await?;
    pgop_testenv::wait::until("pgbench writes through the pooler", TIMEOUT, || async {
        match history(primary_ip.clone()).await {
            Ok(n) if n > at_start + 50 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    let killed = Instant::now();
    env.kill_postmaster(&primary, &password).await?;
    let next = wait_new_primary(&env, "pool", &primary).await?;
    let next_ip = env.pod_ip(&next).await?;
    println!("failover {primary} -> {next} in {:?}", killed.elapsed());
    let confirmed = Instant::now();
    // pgbench's writes reach the new primary through the same pooler address.
    let promoted = history(next_ip.clone()).await?;
    pgop_testenv::wait::until(
        "pgbench writes on the new primary through the pooler",
        TIMEOUT,
        || async {
            match history(next_ip.clone()).await {
                Ok(n) if n > promoted + 20 => Ok(()),
                other => Err(format!("{other:?} (at the promotion: {promoted})")),
            }
        },
    )
    .await?;
    // And a run that started once the new primary was confirmed runs whole: every client
    // to its end.
    pgop_testenv::wait::until(
        "a whole pgbench run after the failover",
        TIMEOUT,
        || async {
            let runs = runs.lock().map_err(|_| "poisoned".to_string())?;
            let after: Vec<&(Instant, std::process::Output)> =
                runs.iter().filter(|(at, _)| *at > confirmed).collect();
            if after.iter().any(|(_, out)| out.status.success()) {
                Ok(())
            } else {
                Err(format!(
                    "{} runs since the failover, none whole: {:?}",
                    after.len(),
                    after.iter().map(|(_, out)| show(out)).collect::<Vec<_>>()
                ))
            }
        },
    )
    .await?;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    during.await??;
    let runs: Vec<std::process::Output> =
        std::mem::take(&mut *runs.lock().map_err(|_| "poisoned")?)
            .into_iter()
            .map(|(_, out)| out)
            .collect();
    let whole = runs.iter().filter(|r| r.status.success()).count();
    let total: u64 = runs.iter().filter_map(processed).sum();
    let cut: Vec<String> = runs
        .iter()
        .filter(|r| !r.status.success())
        .map(|r| String::from_utf8_lossy(&r.stderr).into_owned())
        .collect();
    println!(
        "pgbench across the failover: {} runs of 2 s, {whole} whole, {total} transactions; \
         the runs the kill cut:\n{}",
        runs.len(),
        cut.join("")
    );
    assert!(total > 0, "pgbench processed transactions");
    // The held connection was never closed by the pooler: its next transaction runs on
    // the new primary.
    let row = held
        .query_one("select pg_is_in_recovery(), host(inet_server_addr())", &[])
        .await?;
    let (recovery, server): (bool, String) = (row.get(0), row.get(1));
    assert!(!recovery, "the held connection reaches a primary");
    assert_eq!(
        server, next_ip,
        "the held connection reaches the new primary"
    );

    // After: pgbench through the same pooler, every client to the end.
    let after = pgbench(&rw, &password, &["-c", "4", "-j", "2", "-T", "3"]).await?;
    assert!(after.status.success(), "pgbench after: {}", show(&after));
    assert!(processed(&after).is_some_and(|n| n > 0), "{}", show(&after));

    // The ro pooler follows too: once the old primary is back as a standby, it reaches a
    // standby, never the new primary.
    env.wait_ready("pool", 3).await?;
    let r = connect(&ro, &password).await?;
    let recovery: bool = r.query_one("select pg_is_in_recovery()", &[]).await?.get(0);
    assert!(
        recovery,
        "the ro pooler reaches a standby after the failover"
    );

    // Each pooler has a budget: a drain evicts one of its Pods at a time.
    let budgets: kube::Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        kube::Api::namespaced(env.client.clone(), env.n());
    for name in ["pool-pooler-rw", "pool-pooler-reports"] {
        let budget = budgets.get(name).await?;
        let spec = budget.spec.unwrap_or_default();
        assert_eq!(
            spec.max_unavailable,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)),
            "{name}"
        );
        assert_eq!(
            spec.selector
                .and_then(|s| s.match_labels)
                .and_then(|l| l.get("database.example.com/pooler").cloned())
                .as_deref(),
            Some(name)
        );
    }

    // Removing a pooler removes its Deployment, Service and budget; the other keeps
    // serving.
    let api = env.clusters_v1beta1();
    api.patch(
        "pool",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"poolers": [
            {"name": "rw", "defaultPoolSize": POOL_SIZE, "maxClientConnections": 100},
        ]}})),
    )
    .await?;
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(env.client.clone(), env.n());
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(env.client.clone(), env.n());
    pgop_testenv::wait::until("the reports pooler is gone", TIMEOUT, || async {
        let d = deployments.get_opt("pool-pooler-reports").await;
        let s = services.get_opt("pool-pooler-reports").await;
        let b = budgets.get_opt("pool-pooler-reports").await;
        match (d, s, b) {
            (Ok(None), Ok(None), Ok(None)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    env.wait_cluster("pool", "one pooler in the status", TIMEOUT, |s| {
        s.poolers.len() == 1
    })
    .await?;
    let c = connect(&rw, &password).await?;
    c.simple_query("select 1").await?;
    env.stop().await
}
