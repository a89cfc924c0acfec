//! Operator upgrades on real nodes (issue 13, "gray upgrades"): `helm upgrade` from one pgop
//! version to the next and `helm rollback`, two releases side by side as a canary, and
//! operators with instance managers of the other version. The two versions are the images
//! of `hack/build-images.sh --next-version`: the same sources, the second compiled to
//! report the next version (docs/images.md). Needs root.
//!
//! Three workload nodes and an infrastructure node (operator, CoreDNS, clients); pgop
//! installed by its chart. What each rollout did is read from the API server while it
//! happens: every Pod (uid, image) of the cluster, its current primary, and the managers'
//! versions as they report them (`status.instances[].managerVersion`).

use crate::real;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use pgop_api::PostgresCluster;
use pgop_api::constants::ANNOTATION_SWITCHOVER_TO;
use real::{RealEnv, Result, SERIAL, Writer, eventually};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The version the ordinary image's binary reports.
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The environment with the next pgop image in every node too: (its version, its image
/// name).
async fn env_with_both_images() -> Result<(RealEnv, String, String)> {
    let env = RealEnv::start_with(3, true, true).await?;
    let (version, image) = env.images.next()?;
    let (version, next) = (version.to_string(), image.name.clone());
    assert_ne!(version, VERSION, "the two images report different versions");
    Ok((env, version, next))
}

/// What one cluster's Pods and primary did, sampled every 250 ms.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// Per instance, every Pod seen under its name: (uid, image, when first seen).
    pods: BTreeMap<String, Vec<(String, String, f64)>>,
    /// The current primary, and when each change was seen.
    primaries: Vec<(f64, String)>,
    /// Per Pod uid, its container's highest restart count.
    restarts: BTreeMap<String, i32>,
}

/// Samples one cluster until dropped.
struct Observer {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Observer {
    fn start(env: &RealEnv, ns: &str, cluster: &str) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let pods: Api<Pod> = env.pods(ns);
        let clusters = env.clusters(ns);
        let (name, selector) = (
            cluster.to_string(),
            pgop_api::labels::instance_selector(cluster),
        );
        let record = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let listed = pods.list(&ListParams::default().labels(&selector)).await;
                let primary = clusters
                    .get(&name)
                    .await
                    .ok()
                    .and_then(|c| c.status)
                    .and_then(|s| s.current_primary);
                let t = now();
                if let Ok(mut seen) = record.lock() {
                    for pod in listed.map(|l| l.items).unwrap_or_default() {
                        let (pod_name, uid) = (pod.name_any(), pod.uid().unwrap_or_default());
                        let image = pod
                            .spec
                            .as_ref()
                            .and_then(|s| s.containers.first())
                            .and_then(|c| c.image.clone())
                            .unwrap_or_default();
                        let restarts = pod
                            .status
                            .as_ref()
                            .and_then(|s| s.container_statuses.as_ref())
                            .and_then(|c| c.first())
                            .map_or(0, |c| c.restart_count);
                        let history = seen.pods.entry(pod_name).or_default();
                        if history.last().map(|(u, _, _)| u) != Some(&uid) {
                            history.push((uid.clone(), image, t));
                        }
                        let max = seen.restarts.entry(uid).or_default();
                        *max = (*max).max(restarts);
                    }
                    if let Some(p) = primary
                        && seen.primaries.last().map(|(_, q)| q) != Some(&p)
                    {
                        seen.primaries.push((t, p));
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Self { seen, task }
    }

    fn snapshot(&self) -> Seen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Waits until every instance of the cluster runs `image`, its manager reports `version`
/// and the cluster is Ready with `replicas` instances.
async fn wait_rolled(
    env: &RealEnv,
    ns: &str,
    cluster: &str,
    replicas: i32,
    image: &str,
    version: &str,
) -> PostgresCluster {
    let pods = env.pods(ns);
    let selector = pgop_api::labels::instance_selector(cluster);
    eventually(
        &format!("{ns}/{cluster} runs {image}"),
        Duration::from_secs(400),
        || async {
            let listed = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?;
            let images: Vec<String> = listed
                .items
                .iter()
                .filter_map(|p| p.spec.as_ref()?.containers.first()?.image.clone())
                .collect();
            let c = env
                .clusters(ns)
                .get(cluster)
                .await
                .map_err(|e| e.to_string())?;
            if images.len() != replicas as usize || images.iter().any(|i| i != image) {
                return Err(format!(
                    "pods {}; cluster {}",
                    describe_pods(&listed.items),
                    describe_cluster(&c)
                ));
            }
            let versions: Vec<Option<String>> = c
                .status
                .iter()
                .flat_map(|s| s.instances.iter().map(|i| i.manager_version.clone()))
                .collect();
            if versions.len() != replicas as usize
                || versions.iter().any(|v| v.as_deref() != Some(version))
            {
                return Err(format!("manager versions {versions:?}"));
            }
            Ok(())
        },
    )
    .await;
    env.wait_ready(ns, cluster, replicas, Duration::from_secs(300))
        .await
}

/// Each Pod's name, image, phase, readiness and waiting reason: for failure messages.
fn describe_pods(pods: &[Pod]) -> String {
    let list: Vec<String> = pods
        .iter()
        .map(|p| {
            let status = p.status.as_ref();
            let container = status
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first());
            format!(
                "{} {} {:?} ready={:?} waiting={:?} restarts={:?} deleting={}",
                p.name_any(),
                p.spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .and_then(|c| c.image.clone())
                    .unwrap_or_default(),
                status.and_then(|s| s.phase.clone()),
                container.map(|c| c.ready),
                container
                    .and_then(|c| c.state.as_ref())
                    .and_then(|s| s.waiting.as_ref())
                    .map(|w| (w.reason.clone(), w.message.clone())),
                container.map(|c| c.restart_count),
                p.metadata.deletion_timestamp.is_some(),
            )
        })
        .collect();
    list.join("; ")
}

/// The cluster's phase, primary, conditions and instances: for failure messages.
fn describe_cluster(c: &PostgresCluster) -> String {
    let Some(s) = c.status.as_ref() else {
        return "no status".into();
    };
    let conditions: Vec<String> = s
        .conditions
        .iter()
        .map(|c| format!("{}={} {} {}", c.type_, c.status, c.reason, c.message))
        .collect();
    let instances: Vec<String> = s
        .instances
        .iter()
        .map(|i| {
            format!(
                "{} {:?} ready={} version={:?}",
                i.name, i.role, i.ready, i.manager_version
            )
        })
        .collect();
    format!(
        "phase {:?}, primary {:?} -> {:?}, restartInstance {:?}, conditions {conditions:?}, \
         instances {instances:?}",
        s.phase, s.current_primary, s.target_primary, s.restart_instance
    )
}

/// How many Events of `reason` the cluster got.
async fn events(env: &RealEnv, ns: &str, cluster: &str, reason: &str) -> Result<usize> {
    let api: Api<Event> = Api::namespaced(env.client.clone(), ns);
    let listed = api
        .list(
            &ListParams::default()
                .fields(&format!("involvedObject.name={cluster},reason={reason}")),
        )
        .await?;
    Ok(listed
        .items
        .iter()
        .map(|e| e.count.unwrap_or(1).max(1) as usize)
        .sum())
}

/// What a rollout of the cluster's Pods to `image` did, from `from` (seconds since the
/// epoch) on; checked: every Pod replaced exactly once and never restarted in place, the
/// standbys before the old primary, exactly one change of primary, and it happened between
/// them. Returns the new primary.
fn check_rollout(seen: &Seen, image: &str, old_primary: &str, from: f64) -> Result<String> {
    let mut replaced: Vec<(f64, &str)> = Vec::new();
    for (instance, history) in &seen.pods {
        let after: Vec<_> = history.iter().filter(|(_, _, t)| *t >= from).collect();
        assert_eq!(
            after.len(),
            1,
            "{instance}: replaced exactly once: {history:?}"
        );
        assert_eq!(after[0].1, image, "{instance}: the new Pod's image");
        replaced.push((after[0].2, instance.as_str()));
        for (uid, _, _) in history {
            assert_eq!(
                seen.restarts.get(uid).copied().unwrap_or(0),
                0,
                "{instance} ({uid}): no container restart"
            );
        }
    }
    replaced.sort_by(|a, b| a.0.total_cmp(&b.0));
    let changes: Vec<&(f64, String)> = seen.primaries.iter().filter(|(t, _)| *t >= from).collect();
    println!(
        "    replaced in order: {:?}; primary changes: {:?}",
        replaced
            .iter()
            .map(|(t, i)| format!("{i} at +{:.1} s", t - from))
            .collect::<Vec<_>>(),
        changes
            .iter()
            .map(|(t, p)| format!("{p} at +{:.1} s", t - from))
            .collect::<Vec<_>>()
    );
    assert_eq!(changes.len(), 1, "exactly one switchover: {changes:?}");
    let (switched, new_primary) = changes[0].clone();
    assert_ne!(new_primary, old_primary);
    let last = replaced.last().ok_or("no Pod replaced")?;
    assert_eq!(last.1, old_primary, "the old primary is replaced last");
    for (t, standby) in &replaced[..replaced.len() - 1] {
        assert!(
            *t < switched,
            "standby {standby} replaced before the switchover"
        );
    }
    assert!(last.0 > switched, "the old primary replaced after it");
    Ok(new_primary)
}

/// The writer's attempts that started in `[from, to]`: (acknowledged, failed, the longest
/// time without an acknowledged write in seconds).
fn writes_between(writer: &Writer, env: &RealEnv, from: f64, to: f64) -> (usize, usize, f64) {
    let attempts: Vec<_> = writer
        .read(&env.nodes)
        .into_iter()
        .filter(|a| a.start >= from && a.start <= to)
        .collect();
    let ok: Vec<f64> = attempts.iter().filter(|a| a.ok).map(|a| a.end).collect();
    let mut gap: f64 = 0.0;
    let mut last = from;
    for t in ok.iter().copied().chain(std::iter::once(to)) {
        gap = gap.max(t - last);
        last = t;
    }
    (ok.len(), attempts.len() - ok.len(), gap)
}

fn primary_of(c: &PostgresCluster) -> Result<String> {
    Ok(c.status
        .as_ref()
        .and_then(|s| s.current_primary.clone())
        .ok_or("no primary")?)
}

/// `helm upgrade` (or `rollback`) of release `pgop` to `image`: the operator's own Pod
/// rolls, then every instance Pod, one at a time, standbys first, with one switchover.
/// Prints what it cost the writer.
async fn upgrade_and_check(
    env: &RealEnv,
    ns: &str,
    writer: &Writer,
    what: &str,
    helm: &[&str],
    image: &str,
    version: &str,
) -> Result {
    let before = env.clusters(ns).get("db").await?;
    let old_primary = primary_of(&before)?;
    let observer = Observer::start(env, ns, "db");
    eventually("the first sample", Duration::from_secs(30), || async {
        let seen = observer.snapshot();
        if seen.pods.len() == 3 && !seen.primaries.is_empty() {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    let start = now();
    env.helm(helm)?;
    let helm_done = now() - start;
    env.release_leader("pgop", image).await?;
    let leading = now() - start;
    wait_rolled(env, ns, "db", 3, image, version).await;
    let end = now();
    // Let the writer show the cluster serving afterwards.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = observer.snapshot();
    drop(observer);
    let new_primary = check_rollout(&seen, image, &old_primary, start)?;
    let (ok, failed, gap) = writes_between(writer, env, start, end);
    let failures: Vec<String> = writer
        .read(&env.nodes)
        .iter()
        .filter(|a| !a.ok && a.start >= start && a.start <= end)
        .map(|a| format!("+{:.1} s", a.start - start))
        .collect();
    let switched = seen
        .primaries
        .iter()
        .filter(|(t, _)| *t >= start)
        .map(|(t, _)| format!("+{:.1} s", t - start))
        .collect::<Vec<_>>();
    println!("    failed attempts began at {failures:?}; the new primary was seen at {switched:?}");
    println!(
        "{what}: helm returned after {helm_done:.1} s, the new operator led after \
         {leading:.1} s, every instance ran {version} after {:.1} s; primary \
         {old_primary} -> {new_primary}; writes during it: {ok} acknowledged, {failed} \
         failed, longest time without an acknowledged write {gap:.1} s",
        end - start
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_upgrade_rolls_every_instance_once_standbys_first_with_one_switchover_and_rolls_back()
-> Result {
    let _serial = SERIAL.lock().await;
    let (env, next_version, next) = env_with_both_images().await?;
    let old = env.images.pgop.name.clone();
    let ns = "upgrade";
    let infra = RealEnv::on_infra();
    let extra: Vec<&str> = infra.iter().map(String::as_str).collect();
    env.install_release("pgop", &old, &extra).await?;
    env.restricted_namespace(ns).await?;
    env.create_cluster(ns, "db", real::synchronous_spec())
        .await?;
    wait_rolled(&env, ns, "db", 3, &old, VERSION).await;
    println!("cluster Ready at {:.1?}", env.started.elapsed());
    let writer = real::start_writer(&env, ns, "db", "u").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let chart = real::repo().join("charts/pgop").display().to_string();
    let tag = format!(
        "image.tag={}",
        next.rsplit_once(':').map(|(_, t)| t).unwrap_or_default()
    );
    upgrade_and_check(
        &env,
        ns,
        &writer,
        &format!("helm upgrade {VERSION} -> {next_version}"),
        &[
            "upgrade",
            "pgop",
            &chart,
            "--namespace",
            "pgop-system",
            "--reuse-values",
            "--set",
            &tag,
            "--wait",
            "--timeout",
            "180s",
        ],
        &next,
        &next_version,
    )
    .await?;
    upgrade_and_check(
        &env,
        ns,
        &writer,
        &format!("helm rollback {next_version} -> {VERSION}"),
        &[
            "rollback",
            "pgop",
            "1",
            "--namespace",
            "pgop-system",
            "--wait",
            "--timeout",
            "180s",
        ],
        &old,
        VERSION,
    )
    .await?;
    let history = env.helm(&["history", "pgop", "--namespace", "pgop-system"])?;
    println!("{history}");
    assert_eq!(
        events(&env, ns, "db", "FailoverStarted").await?,
        0,
        "no failover"
    );
    assert_eq!(
        events(&env, ns, "db", "SwitchoverStarted").await?,
        2,
        "one switchover each way"
    );
    real::assert_no_acknowledged_write_lost(&env, ns, &writer).await?;
    println!("done at {:.1?}", env.started.elapsed());
    Ok(())
}

/// Asks for a switchover to the cluster's other instance and waits until it is the
/// primary and the cluster Ready; returns the time it took.
async fn switchover(env: &RealEnv, ns: &str, cluster: &str) -> Result<f64> {
    let c = env.clusters(ns).get(cluster).await?;
    let primary = primary_of(&c)?;
    let to = c
        .status
        .iter()
        .flat_map(|s| s.instances.iter())
        .map(|i| i.name.clone())
        .find(|n| *n != primary)
        .ok_or("no standby")?;
    let start = now();
    env.clusters(ns)
        .patch(
            cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_SWITCHOVER_TO: to}}})),
        )
        .await?;
    eventually(
        &format!("{ns}/{cluster}: {to} is the primary"),
        Duration::from_secs(120),
        || async {
            let c = env
                .clusters(ns)
                .get(cluster)
                .await
                .map_err(|e| e.to_string())?;
            match c.status.as_ref().and_then(|s| s.current_primary.clone()) {
                Some(p) if p == to => Ok(()),
                other => Err(format!("primary {other:?}")),
            }
        },
    )
    .await;
    env.wait_ready(ns, cluster, 2, Duration::from_secs(180))
        .await;
    Ok(now() - start)
}

/// The uid of every Pod of the cluster, by name.
async fn pod_uids(env: &RealEnv, ns: &str, cluster: &str) -> Result<BTreeMap<String, String>> {
    let listed = env
        .pods(ns)
        .list(&ListParams::default().labels(&pgop_api::labels::instance_selector(cluster)))
        .await?;
    Ok(listed
        .items
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect())
}

/// The label the two releases' `clusterSelector`s split the clusters by.
const CHANNEL: &str = "pgop.example.com/channel";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_canary_release_upgrades_its_labelled_clusters_and_mixed_versions_switch_over() -> Result
{
    let _serial = SERIAL.lock().await;
    let (env, next_version, next) = env_with_both_images().await?;
    let old = env.images.pgop.name.clone();
    let ns = "apps";
    let infra = RealEnv::on_infra();
    env.restricted_namespace(ns).await?;
    // Two releases of the old version, both watching every namespace: pgop-a the clusters
    // labelled for the canary, pgop-b the rest (complementary selectors). pgop-a converts
    // PostgresClusters for both (a CRD names one conversion webhook).
    for (release, selector, conversion) in [
        (
            "pgop-a",
            format!("clusterSelector={CHANNEL}=canary"),
            "true",
        ),
        (
            "pgop-b",
            format!("clusterSelector={CHANNEL}!=canary"),
            "false",
        ),
    ] {
        let conversion = format!("webhook.conversion={conversion}");
        let mut extra: Vec<&str> = infra.iter().map(String::as_str).collect();
        extra.extend_from_slice(&["--set-string", &selector, "--set", &conversion]);
        env.install_release(release, &old, &extra).await?;
    }
    // Canary: `db` follows its operator's image, `pinned` pins the old one. The rest:
    // `rest` follows its operator's image, `next` pins the next one under the old operator.
    for (name, canary, replicas, image) in [
        ("db", true, 2, None),
        ("pinned", true, 2, Some(&old)),
        ("rest", false, 1, None),
        ("next", false, 2, Some(&next)),
    ] {
        let mut spec = json!({"replicas": replicas, "storage": {"size": "1Gi"}});
        if let Some(image) = image {
            spec["image"] = json!(image);
        }
        let labels = if canary {
            json!({CHANNEL: "canary"})
        } else {
            json!({})
        };
        let cluster = serde_json::from_value::<PostgresCluster>(json!({
            "apiVersion": "database.example.com/v1alpha1",
            "kind": "PostgresCluster",
            "metadata": {"name": name, "labels": labels},
            "spec": spec
        }))?;
        env.clusters(ns)
            .create(&PostParams::default(), &cluster)
            .await?;
    }
    wait_rolled(&env, ns, "db", 2, &old, VERSION).await;
    wait_rolled(&env, ns, "pinned", 2, &old, VERSION).await;
    wait_rolled(&env, ns, "rest", 1, &old, VERSION).await;
    wait_rolled(&env, ns, "next", 2, &next, &next_version).await;
    println!("four clusters Ready at {:.1?}", env.started.elapsed());

    // An old operator with new instance managers: a switchover.
    let took = switchover(&env, ns, "next").await?;
    println!("operator {VERSION}, managers {next_version}: switchover in {took:.1} s");

    // The canary: release pgop-a moves to the next version; only its clusters follow.
    let untouched = || async {
        let mut uids = BTreeMap::new();
        for cluster in ["pinned", "rest", "next"] {
            uids.insert(cluster, pod_uids(&env, ns, cluster).await?);
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(uids)
    };
    let before = untouched().await?;
    let chart = real::repo().join("charts/pgop").display().to_string();
    let tag = format!(
        "image.tag={}",
        next.rsplit_once(':').map(|(_, t)| t).unwrap_or_default()
    );
    let start = now();
    env.helm(&[
        "upgrade",
        "pgop-a",
        &chart,
        "--namespace",
        "pgop-system",
        "--reuse-values",
        "--set",
        &tag,
        "--wait",
        "--timeout",
        "180s",
    ])?;
    env.release_leader("pgop-a", &next).await?;
    wait_rolled(&env, ns, "db", 2, &next, &next_version).await;
    println!(
        "canary: pgop-a at {next_version}, db rolled in {:.1} s",
        now() - start
    );
    // pgop-b still runs the old version and leads.
    env.release_leader("pgop-b", &old).await?;
    assert_eq!(
        untouched().await?,
        before,
        "the pinned canary cluster and the stable release's clusters are not touched"
    );

    // A new operator with old instance managers: a switchover.
    let took = switchover(&env, ns, "pinned").await?;
    println!("operator {next_version}, managers {VERSION}: switchover in {took:.1} s");

    // The staged rollout goes on: `rest` is relabelled into the canary, whose operator
    // adopts it and rolls it onto its image; pgop-b lets go of it.
    let start = now();
    env.clusters(ns)
        .patch(
            "rest",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {CHANNEL: "canary"}}})),
        )
        .await?;
    wait_rolled(&env, ns, "rest", 1, &next, &next_version).await;
    println!(
        "rest relabelled into the canary and rolled in {:.1} s",
        now() - start
    );

    // Roll the canary back: its clusters, `rest` now among them, return to the old version.
    let pinned = pod_uids(&env, ns, "pinned").await?;
    let stable = pod_uids(&env, ns, "next").await?;
    let start = now();
    env.helm(&[
        "rollback",
        "pgop-a",
        "1",
        "--namespace",
        "pgop-system",
        "--wait",
        "--timeout",
        "180s",
    ])?;
    env.release_leader("pgop-a", &old).await?;
    wait_rolled(&env, ns, "db", 2, &old, VERSION).await;
    wait_rolled(&env, ns, "rest", 1, &old, VERSION).await;
    println!(
        "helm rollback pgop-a: db and rest back on {VERSION} in {:.1} s",
        now() - start
    );
    assert_eq!(
        (
            pod_uids(&env, ns, "pinned").await?,
            pod_uids(&env, ns, "next").await?
        ),
        (pinned, stable),
        "neither the pinned canary cluster nor the stable release's cluster was touched"
    );
    for cluster in ["db", "pinned", "rest", "next"] {
        assert_eq!(
            events(&env, ns, cluster, "FailoverStarted").await?,
            0,
            "{ns}/{cluster}: no failover"
        );
    }
    println!("done at {:.1?}", env.started.elapsed());
    Ok(())
}
