//! The primary Lease against a real API server (testenv): one holder at a time, a release
//! hands it over at once, a silent holder is taken over only after the Lease duration, and
//! a renewing holder that loses the Lease, or cannot reach the API server, fences itself
//! before anyone else may take over.

use crate::common;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;
use pgop_api::PostgresCluster;
use pgop_instance::lease::{self, Fence, PrimaryLease, Renewal, Timings};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// Short timings so the tests take seconds, in the same proportions as pgop's.
const TIMINGS: Timings = Timings {
    duration: Duration::from_secs(3),
    renew: Duration::from_millis(500),
    fence_after: Duration::from_secs(2),
};

async fn setup(prefix: &str) -> Result<(kube::Client, pgop_testenv::TestNamespace)> {
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    common::install_crds(&client).await?;
    let ns = pgop_testenv::TestNamespace::create(plane.config(), prefix).await?;
    Ok((client, ns))
}

fn contender(client: &kube::Client, ns: &str, name: &str) -> PrimaryLease {
    PrimaryLease::new(client.clone(), ns, "demo", name, TIMINGS)
}

/// A fence callback that reports when and why it was called.
fn fence_probe() -> (
    impl FnOnce(Fence) -> std::future::Ready<()> + Send + 'static,
    oneshot::Receiver<(Instant, Fence)>,
) {
    let (tx, rx) = oneshot::channel();
    let fence = move |reason| {
        let _ = tx.send((Instant::now(), reason));
        std::future::ready(())
    };
    (fence, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_at_a_time_and_a_release_hands_the_lease_over_at_once() -> Result {
    let (client, ns) = setup("lease-contenders").await?;
    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), ns.name());
    let cluster: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": "demo"},
        "spec": {"replicas": 2, "storage": {"size": "1Gi"}},
    }))?;
    let cluster = clusters.create(&PostParams::default(), &cluster).await?;
    let uid = cluster.metadata.uid.clone().ok_or("no uid")?;
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "database.example.com/v1alpha1".into(),
        kind: "PostgresCluster".into(),
        name: "demo".into(),
        uid: uid.clone(),
        ..Default::default()
    };

    let a = contender(&client, ns.name(), "demo-1");
    let b = contender(&client, ns.name(), "demo-2");
    a.set_owner(owner.clone());
    b.set_owner(owner);
    // Both race for an absent Lease: exactly one creates it.
    let (won_a, won_b) = tokio::join!(a.try_acquire(), b.try_acquire());
    let (won_a, won_b) = (won_a?, won_b?);
    assert!(
        won_a != won_b,
        "exactly one contender wins: {won_a} {won_b}"
    );
    let (holder, other) = if won_a { (&a, &b) } else { (&b, &a) };
    assert_eq!(holder.holder().await?.as_deref(), Some(holder.identity()));
    assert!(holder.try_acquire().await?, "the holder keeps it");
    assert!(!other.try_acquire().await?, "the other cannot take it");

    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    let written = leases.get("demo").await?;
    let refs = written
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert_eq!(refs.len(), 1, "{refs:?}");
    assert_eq!(refs[0].uid, uid);
    assert_ne!(refs[0].controller, Some(true), "owner, not controller");
    let spec = written.spec.clone().ok_or("no spec")?;
    assert_eq!(spec.lease_duration_seconds, Some(3));
    assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());

    // Released: the other takes it on its very next try, without waiting for expiry.
    assert!(!other.release().await?, "only the holder releases");
    assert!(holder.release().await?);
    assert_eq!(holder.holder().await?, None);
    let asked = Instant::now();
    assert!(other.try_acquire().await?);
    assert!(asked.elapsed() < Duration::from_secs(1));
    assert_eq!(other.holder().await?.as_deref(), Some(other.identity()));
    let spec = leases.get("demo").await?.spec.ok_or("no spec")?;
    assert_eq!(spec.lease_transitions, Some(1));
    assert!(!holder.try_acquire().await?);
    ns.delete().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_stops_renewing_is_taken_over_only_after_the_lease_duration() -> Result {
    let (client, ns) = setup("lease-expiry").await?;
    let a = Arc::new(contender(&client, ns.name(), "demo-1"));
    let b = contender(&client, ns.name(), "demo-2");
    let acquired = Instant::now();
    assert!(a.try_acquire().await?);
    let (fence, mut fenced) = fence_probe();
    let keeper = lease::keep(a.clone(), acquired, fence);

    // Renewed every 500 ms: never taken over, however long the other tries.
    let until = Instant::now() + TIMINGS.duration * 2;
    while Instant::now() < until {
        assert!(!b.try_acquire().await?, "taken over from a renewing holder");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        fenced.try_recv().is_err(),
        "a renewing holder fenced itself"
    );

    // The holder vanishes without releasing: taken over once seen unchanged for 3 s.
    keeper.stop().await;
    let stopped = Instant::now();
    let taken = loop {
        if b.try_acquire().await? {
            break stopped.elapsed();
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The last renewal was at most one interval before the stop.
    assert!(
        taken >= TIMINGS.duration - TIMINGS.renew,
        "taken over after {taken:?}"
    );
    assert!(
        taken < TIMINGS.duration + Duration::from_secs(2),
        "{taken:?}"
    );
    assert_eq!(b.holder().await?.as_deref(), Some("demo-2"));
    ns.delete().await?;
    Ok(())
}

/// A contender that saw each version as it was written (the instance manager watches the
/// Lease) takes an abandoned Lease over the duration after the version it saw, not the
/// duration after it first looked; a version it has not seen still restarts the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_that_watched_the_renewals_takes_over_from_the_last_one_it_saw() -> Result {
    let (client, ns) = setup("lease-observe").await?;
    let a = contender(&client, ns.name(), "demo-1");
    let b = contender(&client, ns.name(), "demo-2");
    let c = contender(&client, ns.name(), "demo-3");
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    assert!(a.try_acquire().await?);
    b.observe(&leases.get("demo").await?);
    // The holder renews once more after b saw it: b has not seen that version.
    assert!(a.try_acquire().await?);
    tokio::time::sleep(TIMINGS.duration + Duration::from_millis(300)).await;
    assert!(
        !b.try_acquire().await?,
        "taken over on a version it had not seen"
    );
    // Now b sees the last renewal, and it stays the last one for the Lease's duration.
    b.observe(&leases.get("demo").await?);
    tokio::time::sleep(TIMINGS.duration + Duration::from_millis(300)).await;
    // c looks for the first time: its clock starts now.
    assert!(!c.try_acquire().await?, "c took over on its first look");
    // b saw this very version the whole duration ago: it takes over at once.
    assert!(b.try_acquire().await?, "b did not take over");
    assert_eq!(b.holder().await?.as_deref(), Some("demo-2"));
    // Its own Lease, or a released one, is not an observation of someone else's.
    b.observe(&leases.get("demo").await?);
    assert!(b.try_acquire().await?);
    ns.delete().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewing_holder_that_finds_another_holder_fences_itself_at_once() -> Result {
    let (client, ns) = setup("lease-lost").await?;
    let a = Arc::new(contender(&client, ns.name(), "demo-1"));
    let acquired = Instant::now();
    assert!(a.try_acquire().await?);
    let (fence, fenced) = fence_probe();
    let keeper = lease::keep(a.clone(), acquired, fence);
    tokio::time::sleep(TIMINGS.renew * 3).await;

    // Someone else writes itself in (a split brain in the making). The holder renews every
    // `renew`, so the write may meet a newer resourceVersion: read and write again then.
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    loop {
        let mut lease = leases.get("demo").await?;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some("intruder".into());
        }
        match leases.replace("demo", &PostParams::default(), &lease).await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(other) => return Err(other.into()),
        }
    }
    let written = Instant::now();
    let (at, reason) = tokio::time::timeout(Duration::from_secs(5), fenced).await??;
    assert_eq!(
        reason,
        Fence::Lost {
            holder: Some("intruder".into())
        }
    );
    // At its next renewal, well before the Lease could have expired for anyone else (the
    // margin is for a loaded machine; the renewal period is 500 ms).
    let took = at.duration_since(written);
    assert!(took < TIMINGS.duration, "{took:?}");
    assert!(keeper.fenced().is_some());
    // It never writes the Lease back, nor releases someone else's.
    tokio::time::sleep(TIMINGS.renew * 2).await;
    assert!(!a.release().await?);
    assert_eq!(a.holder().await?.as_deref(), Some("intruder"));
    ns.delete().await?;
    Ok(())
}

/// A holder renews by updating the version it last wrote, without reading the Lease first;
/// a Lease deleted or written by someone else since is read (and created again, or found
/// lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_renews_without_reading_the_lease_until_someone_else_writes_it() -> Result {
    let (client, ns) = setup("lease-renew").await?;
    let plane = pgop_testenv::shared().await?;
    let requests = common::Requests::default();
    let counted = common::counting_client(plane.config(), &requests)?;
    let a = contender(&counted, ns.name(), "demo-1");
    assert!(a.try_acquire().await?);
    let mark = requests.len();
    for _ in 0..3 {
        assert_eq!(a.renew().await?, Renewal::Renewed);
    }
    let sent = requests.since(mark);
    assert_eq!(sent.len(), 3, "one update per renewal: {sent:?}");
    assert!(sent.iter().all(|r| r.starts_with("PUT ")), "{sent:?}");

    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    leases.delete("demo", &Default::default()).await?;
    assert_eq!(a.renew().await?, Renewal::Renewed);
    assert_eq!(a.holder().await?.as_deref(), Some("demo-1"));

    let mut lease = leases.get("demo").await?;
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = Some("intruder".into());
    }
    leases
        .replace("demo", &PostParams::default(), &lease)
        .await?;
    assert_eq!(
        a.renew().await?,
        Renewal::Lost {
            holder: Some("intruder".into())
        }
    );
    ns.delete().await?;
    Ok(())
}

/// A Lease naming this identity but taken by an earlier process of it (a container of the
/// same Pod that died while holding it) is taken anew, with a fresh `acquireTime`: the
/// operator releases a dead holder's Lease only when it was acquired before its container
/// finished, so the restarted container's own Lease must not look that old. A holder's own
/// acquisitions keep their `acquireTime`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_of_the_holder_takes_the_lease_anew() -> Result {
    let (client, ns) = setup("lease-anew").await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    let spec = |lease: Lease| lease.spec.unwrap_or_default();
    let first = contender(&client, ns.name(), "demo-1");
    assert!(first.try_acquire().await?);
    let taken = spec(leases.get("demo").await?);
    assert!(first.try_acquire().await?);
    assert_eq!(first.renew().await?, Renewal::Renewed);
    let kept = spec(leases.get("demo").await?);
    assert_eq!(
        kept.acquire_time, taken.acquire_time,
        "its own Lease is renewed"
    );
    assert_eq!(kept.lease_transitions, taken.lease_transitions);

    // The container dies (no release); the next one, the same identity, takes it.
    drop(first);
    let second = contender(&client, ns.name(), "demo-1");
    assert!(second.try_acquire().await?);
    let anew = spec(leases.get("demo").await?);
    assert_eq!(anew.holder_identity.as_deref(), Some("demo-1"));
    let (before, after) = (
        taken.acquire_time.ok_or("no acquireTime")?.0,
        anew.acquire_time.clone().ok_or("no acquireTime")?.0,
    );
    assert!(after > before, "taken anew: {before} then {after}");
    assert_eq!(
        anew.lease_transitions,
        taken.lease_transitions.map(|t| t + 1)
    );
    assert!(second.try_acquire().await?);
    assert_eq!(
        spec(leases.get("demo").await?).acquire_time,
        anew.acquire_time
    );
    ns.delete().await?;
    Ok(())
}

/// A TCP proxy to the API server that can be cut: existing connections are dropped and new
/// ones accepted but never answered (a partition, not a refusal).
struct Proxy {
    addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
}

async fn proxy(upstream: String) -> Result<Proxy> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (cut, cut_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut inbound, _)) = listener.accept().await {
            if *cut_rx.borrow() {
                held.push(inbound);
                continue;
            }
            let upstream = upstream.clone();
            let mut cut_rx = cut_rx.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = cut_rx.wait_for(|cut| *cut) => {}
                }
            });
        }
    });
    Ok(Proxy { addr, cut })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_from_the_api_server_fences_itself_before_anyone_may_take_over() -> Result
{
    let (client, ns) = setup("lease-partition").await?;
    let plane = pgop_testenv::shared().await?;
    let authority = plane
        .server()
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string();
    let proxy = proxy(authority).await?;
    let mut config = plane.config().clone();
    config.cluster_url = format!("https://127.0.0.1:{}", proxy.addr.port()).parse()?;
    let through_proxy = kube::Client::try_from(config)?;

    let a = Arc::new(contender(&through_proxy, ns.name(), "demo-1"));
    let b = contender(&client, ns.name(), "demo-2");
    let acquired = Instant::now();
    assert!(a.try_acquire().await?);
    let (fence, mut fenced) = fence_probe();
    let _keeper = lease::keep(a.clone(), acquired, fence);
    tokio::time::sleep(TIMINGS.renew * 3).await;
    assert!(!b.try_acquire().await?);

    proxy.cut.send_replace(true);
    let cut = Instant::now();
    let taken = loop {
        if b.try_acquire().await? {
            break Instant::now();
        }
        assert!(cut.elapsed() < Duration::from_secs(15), "never taken over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (at, reason) = fenced
        .try_recv()
        .map_err(|_| "not fenced before the takeover")?;
    assert!(matches!(reason, Fence::NotRenewed(_)), "{reason:?}");
    assert!(
        at < taken,
        "fenced {:?} after the cut, taken over {:?} after it",
        at.duration_since(cut),
        taken.duration_since(cut)
    );
    assert!(
        at.duration_since(cut) <= TIMINGS.fence_after + Duration::from_millis(200),
        "fenced {:?} after the cut",
        at.duration_since(cut)
    );
    ns.delete().await?;
    Ok(())
}
