//! A reconcile that finds everything in place sends no write request: proven by counting
//! the requests a real reconcile makes through the client.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::client::ClientBuilder;
use pgop_api::cluster::ClusterPhase;
use pgop_api::v1beta1::PostgresCluster;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Default)]
struct Requests(Arc<Mutex<Vec<String>>>);

impl Requests {
    fn writes(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|v| {
                v.iter()
                    .filter(|r| !r.starts_with("GET "))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
    fn all(&self) -> usize {
        self.0.lock().map(|v| v.len()).unwrap_or_default()
    }
}

/// A client that records the method and path of every request it sends.
fn counting_client(
    plane: &pgop_testenv::ControlPlane,
    requests: &Requests,
) -> Result<kube::Client> {
    let log = requests.0.clone();
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        if let Ok(mut v) = log.lock() {
            v.push(format!("{} {}", req.method(), req.uri().path()));
        }
        req
    });
    Ok(ClientBuilder::try_from(plane.config().clone())?
        .with_layer(&layer)
        .build())
}

/// The steady state without an instance manager: the operator finds the primary
/// unavailable and, with no standby answering either, records that it cannot fail over.
fn steady(c: &PostgresCluster) -> bool {
    phase(c) == Some(ClusterPhase::Ready)
        && c.status.as_ref().is_some_and(|s| {
            pgop_api::conditions::find_condition(
                &s.conditions,
                pgop_api::conditions::PRIMARY_AVAILABLE,
            )
            .is_some_and(|p| p.message.contains("no standby may replace it"))
        })
}

/// The two-instance cluster `calm`, brought to its steady state by a running operator,
/// which is then stopped: the tests' reconciles are the only ones.
async fn calm_cluster(client: &kube::Client, n: &str) -> Result {
    let op = Operator::start(client, n);
    create(client, n, &cluster("calm", 2)).await?;
    wait_names::<Pod>(client, n, "calm", &["calm-1", "calm-2"]).await?;
    for pod in ["calm-1", "calm-2"] {
        make_ready(client, n, pod, true).await?;
    }
    // No instance manager runs here, so the operator finds the primary unavailable and,
    // with no standby answering either, records that it cannot fail over: the steady state.
    wait_cluster(client, n, "calm", "phase Ready, failover blocked", steady).await?;
    op.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_reconcile_that_finds_everything_in_place_writes_nothing() -> Result {
    let (plane, client, ns) = setup("noop").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    calm_cluster(&client, n).await?;

    let requests = Requests::default();
    let ctx = Arc::new(pgop_operator::Context::new(
        counting_client(plane, &requests)?,
        pgop_operator::Settings::default(),
    ));
    let cluster = get(&client, n, "calm").await?;
    pgop_operator::cluster::reconcile(Arc::new(cluster), ctx.clone()).await?;
    assert!(
        requests.all() > 0,
        "the reconcile read the cluster's children"
    );
    assert_eq!(
        requests.writes(),
        Vec::<String>::new(),
        "a no-op reconcile must not write"
    );

    // The counter does see writes: a deleted Service makes the next reconcile write.
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), n);
    services.delete("calm-ro", &Default::default()).await?;
    let cluster = get(&client, n, "calm").await?;
    pgop_operator::cluster::reconcile(Arc::new(cluster), ctx).await?;
    let writes = requests.writes();
    assert!(
        writes
            .iter()
            .any(|w| w.starts_with("PATCH ") && w.ends_with("/services/calm-ro")),
        "{writes:?}"
    );
    ns.delete().await?;
    Ok(())
}

/// With the watch caches, a reconcile that finds everything in place sends no request at
/// all, not even a read. A child the reconcile then writes is expected: until the caches
/// show it, a pass reads from the API server, and never writes it a second time.
#[tokio::test]
async fn a_reconcile_from_the_caches_sends_no_request_at_all() -> Result {
    let (plane, client, ns) = setup("cached").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    calm_cluster(&client, n).await?;

    // The caches watch through a client of their own: only the reconcile's requests count.
    let (caches, feeds) = pgop_operator::cluster::cache::Caches::watch(&client, Some(n));
    let watching = tokio::spawn(feeds.run());
    let requests = Requests::default();
    let mut ctx = pgop_operator::Context::new(
        counting_client(plane, &requests)?,
        pgop_operator::Settings::default(),
    );
    ctx.caches = Some(caches.clone());
    let ctx = Arc::new(ctx);
    let filled = || {
        let caches = caches.clone();
        async move { caches.ready() && caches.services.of_cluster(n, "calm").len() == 3 }
    };
    assert!(
        within(Duration::from_secs(30), filled).await,
        "the caches never filled"
    );

    let cluster = get(&client, n, "calm").await?;
    pgop_operator::cluster::reconcile(Arc::new(cluster), ctx.clone()).await?;
    assert_eq!(
        requests.0.lock().map(|v| v.clone()).unwrap_or_default(),
        Vec::<String>::new(),
        "a reconcile from the caches must send nothing"
    );

    // A Service deleted behind the operator's back: once the cache shows it gone, the
    // next pass recreates it (one write), and the pass right after does not write again,
    // whether or not the cache shows the new Service yet.
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), n);
    services.delete("calm-ro", &Default::default()).await?;
    let gone = || {
        let caches = caches.clone();
        async move {
            !caches
                .services
                .of_cluster(n, "calm")
                .iter()
                .any(|s| s.metadata.name.as_deref() == Some("calm-ro"))
        }
    };
    assert!(
        within(Duration::from_secs(30), gone).await,
        "the cache never saw the deletion"
    );
    let cluster = get(&client, n, "calm").await?;
    pgop_operator::cluster::reconcile(Arc::new(cluster.clone()), ctx.clone()).await?;
    let writes = requests.writes();
    assert_eq!(
        writes,
        vec![format!("PATCH /api/v1/namespaces/{n}/services/calm-ro")],
        "one write: the Service"
    );
    pgop_operator::cluster::reconcile(Arc::new(cluster.clone()), ctx.clone()).await?;
    assert_eq!(requests.writes(), writes, "no second write of the Service");

    // Once the cache shows the new Service, passes send nothing again.
    let back = || {
        let caches = caches.clone();
        async move { caches.services.of_cluster(n, "calm").len() == 3 }
    };
    assert!(
        within(Duration::from_secs(30), back).await,
        "the cache never saw the new Service"
    );
    let before = requests.all();
    pgop_operator::cluster::reconcile(Arc::new(cluster), ctx.clone()).await?;
    assert_eq!(requests.all(), before, "a pass once the cache caught up");
    watching.abort();
    ns.delete().await?;
    Ok(())
}

/// Polls `check` every 100 ms until it holds or `deadline` passes.
async fn within<F, Fut>(deadline: Duration, check: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = std::time::Instant::now() + deadline;
    while std::time::Instant::now() < until {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check().await
}

/// The API server keeps quantities in canonical form: a PVC asked for `1.5Gi` holds
/// `1536Mi`, `2048Mi` becomes `2Gi`, `1000M` becomes `1G`. Compared by value, such a PVC
/// (and the Pods built from non-canonical `spec.resources`) is in place: a reconcile
/// writes nothing, and no pass ever repairs anything.
#[tokio::test]
async fn quantities_stored_in_canonical_form_are_not_drift() -> Result {
    let (plane, client, ns) = setup("quantity").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    // (cluster, spec.storage.size, what the API server stores)
    let sizes = [
        ("half", "1.5Gi", "1536Mi"),
        ("binary", "2048Mi", "2Gi"),
        ("decimal", "1000M", "1G"),
    ];
    let op = Operator::start(&client, n);
    for (name, size, _) in sizes {
        let mut c = cluster(name, 2);
        c.spec.storage.size = size.to_string();
        c.spec.resources = Some(serde_json::from_value(serde_json::json!({
            "requests": {"cpu": "0.5", "memory": size},
            "limits": {"memory": size}
        }))?);
        create(&client, n, &c).await?;
    }
    for (name, ..) in sizes {
        let pods = [format!("{name}-1"), format!("{name}-2")];
        wait_names::<Pod>(&client, n, name, &[&pods[0], &pods[1]]).await?;
        for pod in &pods {
            make_ready(&client, n, pod, true).await?;
        }
    }
    for (name, ..) in sizes {
        wait_cluster(&client, n, name, "phase Ready, failover blocked", steady).await?;
    }
    op.stop().await;

    // The API server did rewrite the sizes: a comparison by text would see drift.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), n);
    for (name, _, canonical) in sizes {
        for pvc in [format!("{name}-1"), format!("{name}-2")] {
            let stored = pvcs
                .get(&pvc)
                .await?
                .spec
                .and_then(|s| s.resources)
                .and_then(|r| r.requests)
                .and_then(|r| r.get("storage").map(|q| q.0.clone()));
            assert_eq!(stored.as_deref(), Some(canonical), "PVC {pvc}");
        }
    }

    let requests = Requests::default();
    let ctx = Arc::new(pgop_operator::Context::new(
        counting_client(plane, &requests)?,
        pgop_operator::Settings::default(),
    ));
    for (name, ..) in sizes {
        let cluster = get(&client, n, name).await?;
        pgop_operator::cluster::reconcile(Arc::new(cluster), ctx.clone()).await?;
    }
    assert!(requests.all() > 0, "the reconciles read the children");
    assert_eq!(
        requests.writes(),
        Vec::<String>::new(),
        "a no-op reconcile must not write"
    );
    // Neither did any pass of the running operator repair a PVC (or anything else).
    let repaired: Vec<String> = Api::<Event>::namespaced(client.clone(), n)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Repaired"))
        .map(|e| {
            format!(
                "{}: {}",
                e.involved_object.name.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(repaired, Vec::<String>::new(), "Repaired Events");
    ns.delete().await?;
    Ok(())
}

/// The canonical form computed by the operator is the API server's own, for every
/// notation: PVCs asking for these sizes hold exactly `quantity::canonical` of them.
/// Texts that merely look canonical, the API server keeps as written (a `+`, an `E`
/// exponent, leading zeros of a binary number): those hold the same value, and their
/// canonical form is the same.
#[tokio::test]
async fn the_canonical_form_is_the_api_servers() -> Result {
    use pgop_operator::cluster::build::quantity;
    let (_plane, client, ns) = setup("canonical").await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns.name());
    let rewritten = [
        "1.5Gi", "2048Mi", "1000M", "10Gi", "1024Ki", "1.5Ki", "0.5Ki", "1023Mi", "1.5G", "4000",
        "1500M", "1e3", "1000e0", "1.5e3", "15e-1", "0.5", "500m", "0.1m", "1.5Ti", "3072Gi",
        "2.5", "1000000k", "12345678", "+1.5Gi", "+2048Mi",
    ];
    let kept_as_written = ["+1G", "1E3", "+7Gi", "007Mi"];
    for (i, size) in rewritten.iter().chain(&kept_as_written).enumerate() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("size-{i}")},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": size}}
            }
        }))?;
        let stored = pvcs
            .create(&Default::default(), &pvc)
            .await?
            .spec
            .and_then(|s| s.resources)
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").map(|q| q.0.clone()))
            .ok_or("no storage request")?;
        if kept_as_written.contains(size) {
            assert_eq!(&stored, size);
        } else {
            assert_eq!(
                Some(stored.as_str()),
                quantity::canonical(size).as_deref(),
                "{size}"
            );
        }
        assert!(quantity::same_value(&stored, size), "{size}: {stored}");
        assert_eq!(
            quantity::canonical(&stored),
            quantity::canonical(size),
            "{size}"
        );
    }
    ns.delete().await?;
    Ok(())
}
