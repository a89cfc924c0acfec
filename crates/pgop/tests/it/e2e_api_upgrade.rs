//! The upgrade to `v1beta1` end to end, as docs/api.md ("Upgrading to v1beta1") tells a
//! user to do it, with a running cluster on the local node and real PostgreSQL: from the
//! CRD of before (`v1alpha1` alone), the operator first, then the CRD, then
//! `pgop migrate-storage`, then `v1alpha1` no longer served, and the cluster still
//! reconciled, its data intact, and deleted with every child.

use crate::common;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use pgop_api::PostgresBackup;
use pgop_testenv::wait;
use std::collections::BTreeSet;
use std::time::Duration;

const V1ALPHA1: &str = "database.example.com/v1alpha1";
const V1BETA1: &str = "database.example.com/v1beta1";

/// Every kind that holds something a cluster owns.
fn kinds() -> Vec<ApiResource> {
    vec![
        ApiResource::erase::<Pod>(&()),
        ApiResource::erase::<PersistentVolumeClaim>(&()),
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<Secret>(&()),
        ApiResource::erase::<ServiceAccount>(&()),
        ApiResource::erase::<Role>(&()),
        ApiResource::erase::<RoleBinding>(&()),
        ApiResource::erase::<PodDisruptionBudget>(&()),
        ApiResource::erase::<NetworkPolicy>(&()),
        ApiResource::erase::<Lease>(&()),
        ApiResource::erase::<PostgresBackup>(&()),
    ]
}

/// Every object in `ns` that references the owner `uid`, as `Kind/name`, with the
/// apiVersion its reference names.
async fn owned(client: &kube::Client, ns: &str, uid: &str) -> Result<Vec<(String, String)>> {
    let mut found = Vec::new();
    for kind in kinds() {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kind);
        for object in api.list(&ListParams::default()).await?.items {
            for owner in object.owner_references().iter().filter(|o| o.uid == uid) {
                found.push((
                    format!("{}/{}", kind.kind, object.name_any()),
                    owner.api_version.clone(),
                ));
            }
        }
    }
    Ok(found)
}

/// Waits until the references to the owner `uid` in the test's namespace ([`owned`])
/// satisfy `done`; the error names `what` and the last ones seen.
async fn wait_owned(
    env: &Env,
    uid: &str,
    what: &str,
    done: impl Fn(&[(String, String)]) -> bool,
) -> Result {
    let done = &done;
    wait::until(what, TIMEOUT, || async move {
        let refs = owned(&env.client, env.n(), uid)
            .await
            .map_err(|e| e.to_string())?;
        if done(&refs) {
            Ok(())
        } else {
            Err(format!("{refs:?}"))
        }
    })
    .await?;
    Ok(())
}

/// Rewrites every reference to the owner `uid` in `ns` to name `api_version`: the children
/// as a pgop before `v1beta1` made them. Returns the kinds rewritten.
async fn name_owner_as(
    client: &kube::Client,
    ns: &str,
    uid: &str,
    api_version: &str,
) -> Result<BTreeSet<String>> {
    let mut kinds_done = BTreeSet::new();
    for kind in kinds() {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kind);
        for object in api.list(&ListParams::default()).await?.items {
            let refs: Vec<OwnerReference> = object.owner_references().to_vec();
            if !refs.iter().any(|o| o.uid == uid) {
                continue;
            }
            let refs: Vec<OwnerReference> = refs
                .into_iter()
                .map(|mut o| {
                    if o.uid == uid {
                        o.api_version = api_version.to_string();
                    }
                    o
                })
                .collect();
            api.patch(
                &object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"ownerReferences": refs}})),
            )
            .await?;
            kinds_done.insert(kind.kind.clone());
        }
    }
    Ok(kinds_done)
}

/// `pgop args`: its standard output.
fn pgop(env: &Env, args: &[&str]) -> Result<String> {
    Ok(run(env!("CARGO_BIN_EXE_pgop"), env, args)?.0)
}

/// `kubectl args`: its standard output and standard error.
fn kubectl(env: &Env, args: &[&str]) -> Result<(String, String)> {
    let kubectl = pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Kubectl)?;
    run(&kubectl.to_string_lossy(), env, args)
}

fn run(program: &str, env: &Env, args: &[&str]) -> Result<(String, String)> {
    let out = std::process::Command::new(program)
        .args(args)
        .env("KUBECONFIG", env.plane.kubeconfig())
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The API server's count of requests in `v1alpha1` of PostgresClusters, which the CRD
/// marks deprecated (`apiserver_requested_deprecated_apis`, 1 once any was made).
async fn deprecated_requests(client: &kube::Client) -> Result<Option<String>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let metrics = client.request_text(request).await?;
    Ok(metrics
        .lines()
        .find(|l| {
            l.starts_with("apiserver_requested_deprecated_apis{")
                && l.contains(r#"group="database.example.com""#)
                && l.contains(r#"resource="postgresclusters""#)
                && l.contains(r#"version="v1alpha1""#)
        })
        .map(str::to_string))
}

#[tokio::test]
async fn e2e_a_running_cluster_moves_to_v1beta1_and_v1alpha1_is_retired() -> Result {
    let _serial = SERIAL.lock().await;
    let mut env = start_with_crds("e2e-apiup", Crds::BeforeV1beta1).await?;
    let n = env.n().to_string();

    // Before: the CRD serves and stores v1alpha1 alone, and the cluster is stored so.
    env.create(
        "db",
        serde_json::json!({"replicas": 2, "storage": {"size": "1Gi"}}),
    )
    .await?;

    // 1. The operator first. It watches v1beta1, which this CRD does not serve: it makes
    // nothing (its watch retries), and starting does not fail.
    env.start_operator();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pods = env.pods().list(&ListParams::default()).await?.items;
    assert!(pods.is_empty(), "no Pod before the CRD serves v1beta1");

    // 2. The CRD: both versions served, v1beta1 stored. The operator resumes.
    install_crds(&env.client).await?;
    let ready = env.wait_ready("db", 2).await?;
    let uid = ready.metadata.uid.clone().ok_or("no uid")?;
    let password = env.password("db").await?;
    let rw = env.rw("db").ok_or("db-rw does not resolve")?;
    connect(&rw, &password)
        .await?
        .batch_execute(
            "create table t(id int primary key, v text); \
             insert into t select g, 'row ' || g from generate_series(1, 1000) g",
        )
        .await?;

    // v1alpha1 is deprecated: each use is answered with a warning, and counted.
    let (_, warned) = kubectl(
        &env,
        &[
            "get",
            "postgresclusters.v1alpha1.database.example.com",
            "db",
            "-n",
            &n,
        ],
    )?;
    assert!(
        warned.contains(pgop_api::V1ALPHA1_DEPRECATION),
        "kubectl warns: {warned}"
    );
    let counted = deprecated_requests(&env.client).await?;
    assert!(
        counted.as_deref().is_some_and(|l| l.ends_with(" 1")),
        "{counted:?}"
    );

    // The children as a pgop before v1beta1 made them, the operator stopped as in an
    // upgrade: every reference to the cluster names v1alpha1, a scheduled backup's too.
    env.kill_operator().await;
    let old_backup: PostgresBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": V1ALPHA1, "kind": "PostgresBackup",
        "metadata": {"name": "db-base-old", "ownerReferences": [{
            "apiVersion": V1ALPHA1, "kind": "PostgresCluster", "name": "db", "uid": uid,
            "controller": false}]},
        "spec": {"cluster": {"name": "db"}}
    }))?;
    Api::<PostgresBackup>::namespaced(env.client.clone(), &n)
        .create(&PostParams::default(), &old_backup)
        .await?;
    let renamed = name_owner_as(&env.client, &n, &uid, V1ALPHA1).await?;
    for kind in [
        "Pod",
        "PersistentVolumeClaim",
        "Service",
        "Secret",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "PodDisruptionBudget",
        "Lease",
        "PostgresBackup",
    ] {
        assert!(
            renamed.contains(kind),
            "no {kind} owned by the cluster: {renamed:?}"
        );
    }

    // The operator of this release renames every one of them (the instance managers
    // their Lease).
    env.start_operator();
    wait_owned(
        &env,
        &uid,
        "every reference to the cluster to name v1beta1",
        |refs| refs.iter().all(|(_, v)| v == V1BETA1),
    )
    .await?;

    // 3. The migration: every object stored in v1beta1, no reference left to v1alpha1.
    let migrated = pgop(&env, &["migrate-storage"])?;
    assert!(
        migrated.contains(
            "postgresclusters.database.example.com: 1 objects written in v1beta1, 0 changed by others meanwhile; storedVersions [v1alpha1, v1beta1] -> [v1beta1]"
        ) || migrated.contains(
            "postgresclusters.database.example.com: 0 objects written in v1beta1, 1 changed by others meanwhile; storedVersions [v1alpha1, v1beta1] -> [v1beta1]"
        ),
        "{migrated}"
    );
    assert!(
        migrated.contains(&format!(
            "ownerReferences naming PostgresCluster in another version than {V1BETA1}: 0"
        )),
        "{migrated}"
    );

    // 4. v1alpha1 retired, with the command docs/api.md gives.
    kubectl(
        &env,
        &[
            "patch",
            "crd",
            "postgresclusters.database.example.com",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/spec/versions/0/name","value":"v1alpha1"},{"op":"replace","path":"/spec/versions/0/served","value":false}]"#,
        ],
    )?;
    let alpha = env.clusters();
    let alpha = &alpha;
    wait::until("v1alpha1 to be no longer served", TIMEOUT, || async move {
        match alpha.get("db").await {
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            other => Err(format!("{:?}", other.map(|c| c.metadata.resource_version))),
        }
    })
    .await?;

    // The cluster is still reconciled: a standby's Pod deleted comes back and catches up.
    let primary = env.current_primary("db").await?;
    let (standby, _) = env
        .pod_ips("db")
        .await?
        .into_iter()
        .find(|(name, _)| *name != primary)
        .ok_or("no standby")?;
    let old_uid = env.pods().get(&standby).await?.uid().ok_or("no uid")?;
    env.delete_pod(&standby).await?;
    let pods = env.pods();
    let (pods, standby_ref, old_uid) = (&pods, &standby, &old_uid);
    wait::until(
        "the standby's Pod to be made again",
        TIMEOUT,
        || async move {
            match pods.get_opt(standby_ref).await {
                Ok(Some(p)) if p.uid().as_ref() != Some(old_uid) => Ok(()),
                other => Err(format!("{:?}", other.map(|p| p.map(|p| p.uid())))),
            }
        },
    )
    .await?;
    env.wait_ready("db", 2).await?;
    connect(&rw, &password)
        .await?
        .batch_execute("insert into t values (1001, 'after v1alpha1')")
        .await?;
    for (name, ip) in env.pod_ips("db").await? {
        wait_rows(&name, &ip, &password, "t", 1001).await?;
    }

    // Deleted: every child goes with it, the garbage collector finding the owner through
    // v1beta1. (A reference still naming v1alpha1 has no such outcome: the collector
    // either never resolves it or, with discovery cached from before the retirement,
    // reads v1alpha1's 404 as the owner gone; a run in CI saw the latter.)
    let children = owned(&env.client, &n, &uid).await?;
    env.clusters_v1beta1()
        .delete("db", &DeleteParams::default())
        .await?;
    wait_owned(
        &env,
        &uid,
        "every child of the cluster to be gone",
        |refs| refs.is_empty(),
    )
    .await?;
    assert!(children.len() >= 10, "{children:?}");
    let clusters = env.clusters_v1beta1();
    assert!(
        clusters.get_opt("db").await?.is_none(),
        "the cluster is gone"
    );
    env.stop().await
}
