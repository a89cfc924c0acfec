//! The metrics pgop's alert rules and dashboard (`deploy/monitoring/`) query are metrics pgop
//! serves: a real API server, the operator in-process (with its metrics and its webhooks'
//! own certificate), the local node running `pgop instance run`, real PostgreSQL and a real
//! S3 server. The cluster is brought through what makes the conditional series appear: a
//! WAL volume, WAL archived, a completed base backup, a standby replaying under writes, a failover. Every
//! sample name scraped meanwhile from the operator and the instance managers is collected,
//! and every pgop metric name in the rules' and the dashboard's queries must be among them.

use crate::common;
use crate::monitoring;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use pgop_api::backup::{BackupPhase, PostgresBackup};
use pgop_api::conditions;
use pgop_operator::webhook::{Config, cert};
use pgop_testenv::s3::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

/// `GET /metrics` of `host`; its body.
async fn scrape(host: &str) -> Result<String> {
    let (code, body) = pgop_operator::cluster::probe::request(host, "GET", "/metrics", None)
        .await
        .map_err(|e| format!("GET http://{host}/metrics: {e}"))?;
    let text = String::from_utf8_lossy(&body).into_owned();
    if code != 200 {
        return Err(format!("GET http://{host}/metrics: {code}: {text}").into());
    }
    Ok(text)
}

/// Every sample name scraped so far, and from where.
#[derive(Default)]
struct Served {
    names: BTreeSet<String>,
    scrapes: usize,
}

impl Served {
    /// Scrapes `host` and keeps its sample names; the exposition.
    async fn scrape(&mut self, host: &str) -> Result<String> {
        let text = scrape(host).await?;
        self.names.extend(monitoring::sample_names(&text));
        self.scrapes += 1;
        Ok(text)
    }

    /// Scrapes the operator and every instance manager of `cluster`.
    async fn scrape_all(&mut self, env: &Env, operator: &str, cluster: &str) -> Result {
        self.scrape(operator).await?;
        for (_, ip) in env.pod_ips(cluster).await? {
            let manager = format!("{ip}:{}", pgop_api::constants::MANAGER_PORT);
            self.scrape(&manager).await?;
        }
        Ok(())
    }
}

/// Scrapes `host` until its exposition has a sample `name`; the exposition.
async fn until_served(served: &mut Served, host: &str, name: &str) -> Result<String> {
    let started = std::time::Instant::now();
    loop {
        let text = served.scrape(host).await?;
        if monitoring::sample_names(&text).contains(name) {
            return Ok(text);
        }
        if started.elapsed() > TIMEOUT {
            return Err(
                format!("no {name} on http://{host}/metrics within {TIMEOUT:?}:\n{text}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn e2e_every_metric_the_alert_rules_and_the_dashboard_query_is_served() -> Result {
    let _serial = SERIAL.lock().await;
    let used = monitoring::used_metric_names()?;
    assert!(used.len() >= 30, "{} names: {used:?}", used.len());

    let mut env = start_without_operator("e2e-mon").await?;
    let n = env.n().to_string();
    let mut options = env.operator_options();
    options.metrics_bind_address = Some("127.0.0.1:0".parse()?);
    // The webhooks with pgop's own certificate (for its expiry metric); no webhook
    // configuration names them, so the API server never calls them.
    options.webhook = Some(Config {
        listen: "127.0.0.1:0".parse()?,
        certificate: cert::Source::Managed(cert::Managed {
            namespace: n.clone(),
            secret: "pgop-webhook-tls".into(),
            names: vec!["127.0.0.1".into()],
            configurations: Vec::new(),
            conversion_crds: Vec::new(),
            conversion_client: None,
            validity_days: 90,
            renew_before_days: 30,
            check_every: Duration::from_secs(60),
        }),
    });
    let operator = env
        .start_operator_with(options)
        .await?
        .ok_or("the operator serves no metrics")?
        .to_string();

    let s3 = S3Server::start(&env.plane.dir().join("s3-monitoring"))?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    }))?;
    Api::<Secret>::namespaced(env.client.clone(), &n)
        .create(&PostParams::default(), &secret)
        .await?;
    env.create(
        "mon",
        // archive_timeout 5s: WAL reaches the store within seconds of a commit.
        // walStorage: the WAL volume's series exist only with one.
        json!({"replicas": 2, "storage": {"size": "1Gi"}, "walStorage": {"size": "512Mi"},
               "postgresql": {"parameters": {"archive_timeout": "5s"}},
               "backup": {"store": {"s3": {
                   "bucket": BUCKET, "endpoint": s3.endpoint(), "region": "us-east-1",
                   "path": "monitoring", "credentialsSecret": {"name": "s3"}}}}}),
    )
    .await?;
    env.wait_ready("mon", 2).await?;
    let password = env.password("mon").await?;
    write_through_rw(
        &env,
        "mon",
        &password,
        "create table acked(id bigint primary key)",
    )
    .await?;
    env.wait_cluster("mon", "WAL archived", TIMEOUT, |s| {
        conditions::is_true(&s.conditions, conditions::CONTINUOUS_ARCHIVING)
    })
    .await?;

    // A base backup on request, to completion.
    let backup: PostgresBackup = serde_json::from_value(json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresBackup",
        "metadata": {"name": "mon-now"},
        "spec": {"cluster": {"name": "mon"}}
    }))?;
    let backups: Api<PostgresBackup> = Api::namespaced(env.client.clone(), &n);
    backups.create(&PostParams::default(), &backup).await?;
    pgop_testenv::wait::until("the backup completed", TIMEOUT, || async {
        let b = backups.get("mon-now").await.map_err(|e| e.to_string())?;
        match b.status.as_ref().and_then(|s| s.phase) {
            Some(BackupPhase::Completed) => Ok(()),
            Some(BackupPhase::Failed) => Err(format!("failed: {:?}", b.status)),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    env.wait_cluster("mon", "lastBackupTime", TIMEOUT, |s| {
        s.last_backup_time.is_some()
    })
    .await?;

    // Under writes, the primary reports its standby's replay lag in seconds.
    let mut served = Served::default();
    let primary = env.current_primary("mon").await?;
    let primary_manager = format!(
        "{}:{}",
        env.pod_ip(&primary).await?,
        pgop_api::constants::MANAGER_PORT
    );
    let writer = Writer::start(&env, "mon", &password);
    until_served(&mut served, &primary_manager, "pgop_replay_lag_seconds").await?;
    until_served(
        &mut served,
        &primary_manager,
        "pgop_wal_last_archived_timestamp_seconds",
    )
    .await?;
    served.scrape_all(&env, &operator, "mon").await?;

    // A failover: the primary's postmaster killed; a standby takes over.
    env.kill_postmaster(&primary, &password).await?;
    wait_new_primary(&env, "mon", &primary).await?;
    let acked = writer.stop().await?;
    assert!(!acked.is_empty(), "no write was acknowledged");
    until_served(
        &mut served,
        &operator,
        "pgop_cluster_last_failover_timestamp_seconds",
    )
    .await?;
    env.wait_ready("mon", 2).await?;
    served.scrape_all(&env, &operator, "mon").await?;

    let missing: Vec<(&String, &Vec<String>)> = used
        .iter()
        .filter(|(name, _)| !served.names.contains(*name))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics the rules or the dashboard query and no scrape served ({} scrapes):\n{missing:#?}\nserved: {:#?}",
        served.scrapes,
        served.names
    );
    eprintln!(
        "{} pgop metric names used by the rules and the dashboard, all among the {} sample names of {} scrapes",
        used.len(),
        served.names.len(),
        served.scrapes
    );
    drop(s3);
    env.stop().await
}
