//! Helpers shared by the operator's integration tests.
#![allow(dead_code)]

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use pgop_api::PostgresCluster;
use pgop_testenv::{ControlPlane, TestNamespace, wait};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The shared control plane with pgop's CRDs installed, and a fresh namespace.
pub async fn setup(prefix: &str) -> Result<(&'static ControlPlane, Client, TestNamespace)> {
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    install_crds(&client).await?;
    let ns = TestNamespace::create(plane.config(), prefix).await?;
    Ok((plane, client, ns))
}

/// pgop's CRDs as deploy/ has them, converting between `v1alpha1` and `v1beta1` through
/// this process's callback endpoint (pgop's conversion, [`pgop_api::v1beta1::review_json`]),
/// since the CRD's own Service does not exist here.
pub async fn install_crds(client: &Client) -> Result {
    pgop_testenv::crds::install_converting(
        client,
        pgop_api::crds(),
        pgop_api::v1beta1::review_json,
        pgop_api::CONVERT_PATH,
    )
    .await?;
    Ok(())
}

/// A running operator watching one namespace; stops when dropped or on [`Operator::stop`].
pub struct Operator {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Operator {
    pub fn start(client: &Client, namespace: &str) -> Self {
        Self::start_with(
            client,
            pgop_operator::Options {
                namespaces: vec![namespace.to_string()],
                ..pgop_operator::Options::default()
            },
        )
    }

    /// Starts the operator with these options; it must not fail (no metrics address).
    pub fn start_with(client: &Client, options: pgop_operator::Options) -> Self {
        let (tx, rx) = oneshot::channel::<()>();
        let client = client.clone();
        let task = tokio::spawn(async move {
            let run = pgop_operator::run(client, options, async move {
                let _ = rx.await;
            });
            // Without a metrics address (the default), starting cannot fail, and nobody
            // else takes the Lease.
            if let Err(e) = run.await {
                panic!("the operator failed: {}", pgop_operator::error_chain(&e));
            }
        });
        Self {
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Graceful stop: reconciles in flight finish.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Crash: the task is dropped wherever it is, mid-reconcile or not.
    pub async fn kill(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

pub fn cluster(name: &str, replicas: i32) -> PostgresCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "storage": {"size": "1Gi"}}
    }))
    .expect("a valid cluster")
}

pub async fn create(client: &Client, ns: &str, c: &PostgresCluster) -> Result<PostgresCluster> {
    Ok(Api::<PostgresCluster>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), c)
        .await?)
}

/// The cluster as the operator reads it, in `v1beta1`.
pub async fn get(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<pgop_api::v1beta1::PostgresCluster> {
    Ok(
        Api::<pgop_api::v1beta1::PostgresCluster>::namespaced(client.clone(), ns)
            .get(name)
            .await?,
    )
}

/// Names of the objects of kind `K` labelled with the cluster, sorted.
pub async fn names<K>(client: &Client, ns: &str, cluster: &str) -> Result<Vec<String>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let list = api
        .list(&ListParams::default().labels(&format!("database.example.com/cluster={cluster}")))
        .await?;
    let mut names: Vec<String> = list.items.iter().map(|o| o.name_any()).collect();
    names.sort();
    Ok(names)
}

/// Waits until `names::<K>` equals `expected`.
pub async fn wait_names<K>(client: &Client, ns: &str, cluster: &str, expected: &[&str]) -> Result
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let mut expected: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    expected.sort();
    let what = format!(
        "{}s {expected:?}",
        std::any::type_name::<K>()
            .rsplit("::")
            .next()
            .unwrap_or("object")
    );
    wait::until(&what, TIMEOUT, || {
        let expected = expected.clone();
        async move {
            match names::<K>(client, ns, cluster).await {
                Ok(n) if n == expected => Ok(()),
                Ok(n) => Err(format!("{n:?}")),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await?;
    Ok(())
}

/// Waits until the cluster's status satisfies `check`; returns the cluster.
pub async fn wait_cluster(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&pgop_api::v1beta1::PostgresCluster) -> bool,
) -> Result<pgop_api::v1beta1::PostgresCluster> {
    let check = &check;
    Ok(wait::until(what, TIMEOUT, || async move {
        match get(client, ns, name).await {
            Ok(c) if check(&c) => Ok(c),
            Ok(c) => Err(format!("{:?}", c.status)),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?)
}

/// Plays kubelet for the test: marks the pod Running and Ready (there is no node yet).
pub async fn make_ready(client: &Client, ns: &str, pod: &str, ready: bool) -> Result {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = if ready { "True" } else { "False" };
    let patch = serde_json::json!({
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": status, "lastTransitionTime": now},
                {"type": "ContainersReady", "status": status, "lastTransitionTime": now}
            ]
        }
    });
    api.patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

pub fn phase(c: &pgop_api::v1beta1::PostgresCluster) -> Option<pgop_api::cluster::ClusterPhase> {
    c.status.as_ref().and_then(|s| s.phase)
}

pub fn condition<'a>(
    c: &'a pgop_api::v1beta1::PostgresCluster,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    c.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|x| x.type_ == type_))
}

/// A ValidatingWebhookConfiguration of pgop's two validating webhooks, served at
/// `https://127.0.0.1:<port>`, for the objects of namespace `ns` only (the control plane
/// may be shared), in every version of the CRDs.
pub fn validating_configuration(
    name: &str,
    ns: &str,
    port: u16,
) -> Result<ValidatingWebhookConfiguration> {
    let hook = |hook: &str, resource: &str, path: &str| {
        serde_json::json!({
            "name": format!("{hook}.database.example.com"),
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}")},
            "rules": [{
                "apiGroups": ["database.example.com"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"],
                "resources": [resource],
                "scope": "Namespaced"
            }],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"]
        })
    };
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            hook("postgresclusters", "postgresclusters", pgop_operator::webhook::VALIDATE_CLUSTERS),
            hook("postgresbackups", "postgresbackups", pgop_operator::webhook::VALIDATE_BACKUPS),
        ]
    }))?)
}

/// The defaulting webhook's configuration, of the same name (another kind).
pub fn mutating_configuration(
    name: &str,
    ns: &str,
    port: u16,
) -> Result<MutatingWebhookConfiguration> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "defaults.postgresclusters.database.example.com",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{}", pgop_operator::webhook::MUTATE_CLUSTERS)},
            "rules": [{
                "apiGroups": ["database.example.com"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["postgresclusters"],
                "scope": "Namespaced"
            }],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "reinvocationPolicy": "Never",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"]
        }]
    }))?)
}

/// `kubectl` against `plane` (the testenv binary): its standard output, or its error.
pub async fn kubectl(plane: &ControlPlane, args: &[&str]) -> Result<String> {
    let bin = pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Kubectl)?;
    let out = tokio::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(plane.kubeconfig())
        .args(args)
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
