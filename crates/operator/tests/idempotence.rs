//! A reconcile that finds everything in place sends no write request: proven by counting
//! the requests a real reconcile makes through the client.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::client::ClientBuilder;
use pgop_api::cluster::ClusterPhase;
use std::sync::Arc;
use std::sync::Mutex;

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

#[tokio::test]
async fn a_reconcile_that_finds_everything_in_place_writes_nothing() -> Result {
    let (plane, client, ns) = setup("noop").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    let op = Operator::start(&client, n);
    create(&client, n, &cluster("calm", 2)).await?;
    wait_names::<Pod>(&client, n, "calm", &["calm-1", "calm-2"]).await?;
    for pod in ["calm-1", "calm-2"] {
        make_ready(&client, n, pod, true).await?;
    }
    // No instance manager runs here, so the operator finds the primary unavailable and,
    // with no standby answering either, records that it cannot fail over: the steady state.
    wait_cluster(&client, n, "calm", "phase Ready, failover blocked", |c| {
        phase(c) == Some(ClusterPhase::Ready)
            && c.status.as_ref().is_some_and(|s| {
                pgop_api::conditions::find_condition(
                    &s.conditions,
                    pgop_api::conditions::PRIMARY_AVAILABLE,
                )
                .is_some_and(|p| p.message.contains("no standby may replace it"))
            })
    })
    .await?;
    op.stop().await;

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
