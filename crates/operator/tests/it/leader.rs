//! Leader election against a real API server (testenv): two operators contend for one Lease;
//! only the leader reconciles, a standby is healthy and ready, a graceful stop hands the
//! Lease over at once, and a leader whose Lease is taken stops with `LostLeadership`.

use crate::common;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::PostParams;
use pgop_lease::Fence;
use pgop_operator::cluster::probe;
use pgop_operator::leader::LEASE_DURATION;
use pgop_operator::{Error, LeaderElection};
use pgop_testenv::wait;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const LEASE: &str = "pgop-operator";

/// One operator replica with leader election, metrics on a free loopback port.
struct Replica {
    identity: String,
    host: String,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Error>>,
}

impl Replica {
    async fn start(client: &kube::Client, ns: &str, identity: &str) -> Result<Self> {
        let options = pgop_operator::Options {
            namespaces: vec![ns.to_string()],
            metrics_bind_address: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            leader_election: Some(LeaderElection::new(ns, identity)),
            ..pgop_operator::Options::default()
        };
        let operator = pgop_operator::Operator::bind(client.clone(), options).await?;
        let host = operator
            .metrics_address()
            .ok_or("no metrics address")?
            .to_string();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(operator.run(async move {
            let _ = stopped.await;
        }));
        Ok(Self {
            identity: identity.to_string(),
            host,
            stop: Some(stop),
            task,
        })
    }

    async fn get(&self, path: &str) -> Result<(u16, String), String> {
        let (code, body) = probe::request(&self.host, "GET", path, None).await?;
        Ok((code, String::from_utf8_lossy(&body).into_owned()))
    }

    /// The value of the sample `series` on `/metrics`.
    async fn sample(&self, series: &str) -> Result<f64, String> {
        let (code, text) = self.get("/metrics").await?;
        if code != 200 {
            return Err(format!("/metrics: {code}: {text}"));
        }
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .ok_or_else(|| format!("no {series} in\n{text}"))
    }

    async fn leader(&self) -> Result<f64, String> {
        self.sample("pgop_operator_leader").await
    }

    /// Cluster reconciles finished, successful or not.
    async fn reconciles(&self) -> Result<f64, String> {
        let mut sum = 0.0;
        for result in ["ok", "error"] {
            sum += self
                .sample(&format!(
                    r#"pgop_operator_reconciles_total{{controller="cluster",result="{result}"}}"#
                ))
                .await?;
        }
        Ok(sum)
    }

    /// Graceful stop: waits for `run` to return.
    async fn stop(mut self) -> Result<Result<(), Error>> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        Ok(tokio::time::timeout(pgop_operator::SHUTDOWN_GRACE * 2, self.task).await??)
    }
}

async fn holder(client: &kube::Client, ns: &str) -> Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get(LEASE)
        .await?;
    Ok(lease
        .spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// Waits until exactly `leader` reports `pgop_operator_leader 1` and `standby` 0.
async fn wait_leader(leader: &Replica, standby: Option<&Replica>, within: Duration) -> Result {
    wait::until(&format!("{} leading", leader.identity), within, || async {
        let l = leader.leader().await?;
        let s = match standby {
            Some(s) => s.leader().await?,
            None => 0.0,
        };
        if (l, s) == (1.0, 0.0) {
            Ok(())
        } else {
            Err(format!("leader gauges {l} and {s}"))
        }
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_reconciles_a_stop_hands_over_at_once_and_a_taken_lease_stops_the_leader()
-> Result {
    let (_plane, client, ns) = setup("op-leader").await?;
    let n = ns.name().to_string();

    // Two replicas race for the Lease: exactly one leads.
    let a = Replica::start(&client, &n, "operator-a").await?;
    let b = Replica::start(&client, &n, "operator-b").await?;
    let first = wait::until("one leader", TIMEOUT, || async {
        let (ga, gb) = (a.leader().await?, b.leader().await?);
        match (ga, gb) {
            (1.0, 0.0) => Ok(true),
            (0.0, 1.0) => Ok(false),
            _ => Err(format!("leader gauges {ga} and {gb}")),
        }
    })
    .await?;
    let (leader, standby) = if first { (a, b) } else { (b, a) };
    assert_eq!(
        holder(&client, &n).await?.as_deref(),
        Some(leader.identity.as_str())
    );
    // The standby is healthy and ready (it must not block a rolling update), and does not
    // become leader while the leader renews.
    assert_eq!(standby.get("/healthz").await?.0, 200);
    let (code, body) = standby.get("/readyz").await?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("standby"), "{body}");
    wait::until("the leader ready", TIMEOUT, || async {
        match leader.get("/readyz").await? {
            (200, body) if !body.contains("standby") => Ok(()),
            (code, body) => Err(format!("{code}: {body}")),
        }
    })
    .await?;

    // The leader reconciles; the standby does not.
    create(&client, &n, &cluster("first", 2)).await?;
    wait_names::<Pod>(&client, &n, "first", &["first-1", "first-2"]).await?;
    wait_names::<Service>(&client, &n, "first", &["first-r", "first-ro", "first-rw"]).await?;
    wait::until("the leader's reconciles counted", TIMEOUT, || async {
        match leader.reconciles().await? {
            r if r > 0.0 => Ok(()),
            r => Err(format!("{r} reconciles")),
        }
    })
    .await?;
    assert_eq!(standby.reconciles().await?, 0.0, "the standby reconciled");
    assert_eq!(standby.leader().await?, 0.0);

    // A graceful stop releases the Lease: the standby leads at once, not after the Lease
    // duration. Judged on the Lease's own times (both written by this machine's clock),
    // not on the test's: the standby acquired it before the leader's last renewal would
    // have expired, which only a released Lease allows.
    let old = leader.identity.clone();
    let stopped = Instant::now();
    let result = leader.stop().await?;
    assert!(result.is_ok(), "{result:?}");
    let released = Api::<Lease>::namespaced(client.clone(), &n)
        .get(LEASE)
        .await?
        .spec
        .unwrap_or_default();
    assert_ne!(
        released
            .holder_identity
            .as_deref()
            .filter(|h| !h.is_empty()),
        Some(old.as_str()),
        "the Lease was not released"
    );
    let last_renewal = released
        .renew_time
        .ok_or("the released Lease keeps no renewTime")?
        .0;
    wait_leader(&standby, None, TIMEOUT).await?;
    eprintln!(
        "leader: the standby leads {:?} after the leader was told to stop",
        stopped.elapsed()
    );
    let taken = Api::<Lease>::namespaced(client.clone(), &n)
        .get(LEASE)
        .await?
        .spec
        .unwrap_or_default();
    assert_eq!(
        taken.holder_identity.as_deref(),
        Some(standby.identity.as_str())
    );
    let acquired = taken
        .acquire_time
        .ok_or("the taken Lease has no acquireTime")?
        .0;
    let expiry =
        last_renewal + jiff::SignedDuration::try_from(LEASE_DURATION).map_err(|e| e.to_string())?;
    assert!(
        acquired < expiry,
        "acquired at {acquired}, the released Lease would have expired at {expiry}"
    );

    // The new leader reconciles.
    create(&client, &n, &cluster("second", 1)).await?;
    wait_names::<Pod>(&client, &n, "second", &["second-1"]).await?;
    wait::until("the new leader's reconciles counted", TIMEOUT, || async {
        match standby.reconciles().await? {
            r if r > 0.0 => Ok(()),
            r => Err(format!("{r} reconciles")),
        }
    })
    .await?;

    // Someone else takes the Lease (compare-and-swap, as another contender would): the
    // leader stops at its next renewal and `run` fails with LostLeadership.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &n);
    let taken = wait::until("the Lease taken", TIMEOUT, || async {
        let mut lease = leases.get(LEASE).await.map_err(|e| e.to_string())?;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some("intruder".into());
        }
        // A conflict (the leader renewed in between) is retried with a fresh read.
        leases
            .replace(LEASE, &PostParams::default(), &lease)
            .await
            .map(|_| Instant::now())
            .map_err(|e| e.to_string())
    })
    .await?;
    let Replica { task, .. } = standby;
    // It stops at its next renewal; bounded by the Lease duration, the time after which
    // a contender would take the Lease anyway (a loaded machine can delay the renewal).
    let within = LEASE_DURATION;
    let result = tokio::time::timeout(within, task)
        .await
        .map_err(|_| format!("still running {within:?} after the Lease was taken"))??;
    let lost = taken.elapsed();
    eprintln!("leader: run returned {lost:?} after the Lease was taken: {result:?}");
    match result {
        Err(Error::LostLeadership { lease, reason }) => {
            assert_eq!(lease, format!("{n}/{LEASE}"));
            assert_eq!(
                reason,
                Fence::Lost {
                    holder: Some("intruder".into())
                }
            );
        }
        other => return Err(format!("expected LostLeadership, got {other:?}").into()),
    }
    // It did not write the Lease back.
    assert_eq!(holder(&client, &n).await?.as_deref(), Some("intruder"));
    Ok(())
}
