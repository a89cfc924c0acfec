//! Safe rollouts end to end (a real API server, the operator, the local node running
//! `pgop instance run`, real PostgreSQL, a writer through `-rw`): the restart annotation
//! restarts one instance at a time; a restart-only value PostgreSQL cannot start with stops
//! the rollout at the first instance while the primary keeps serving, the instance named
//! with the parameter and PostgreSQL's words (status, conditions, an Event, `kubectl pgop
//! status`), and fixing the spec heals it; a primary that cannot start hands over to a
//! standby. Each test has its own
//! control plane; they run one at a time.

use crate::common;

use common::*;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use pgop_api::PostgresClusterStatus;
use pgop_api::conditions::{ROLLOUT_BLOCKED, find_condition};
use pgop_api::constants::ANNOTATION_RESTART;
use serde_json::json;
use std::time::Duration;

/// The longest time without an acknowledged commit allowed while the primary is never
/// touched. The primary's own postmaster start time is the exact check that it was never
/// restarted; this bound catches a primary that stopped serving, with room for a loaded
/// 2-core machine (where one commit can stall a second or two). Measured gaps are printed;
/// on an idle machine they stay well under 2 s (docs/ha.md).
const MAX_GAP: Duration = Duration::from_secs(5);

/// A file that exists but is no library: PostgreSQL's dry run (`postgres -C`, the library
/// exists) accepts it, and the postmaster then refuses to start ("invalid ELF header").
const NOT_A_LIBRARY: &str = "/etc/passwd";

/// What [`DownWatch`] saw: the most instances down at once, the samples with more than
/// one down, and how many samples had any instance down.
type Downs = (usize, Vec<Vec<String>>, usize);

/// Samples every instance every 100 ms: which ones refuse connections (stopped, starting,
/// shutting down). A connection that only times out says nothing and is not counted, so a
/// slow answer on a loaded machine is never taken for an instance being down.
struct DownWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Downs>,
}

impl DownWatch {
    fn start(instances: Vec<(String, String)>, password: &str) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let password = password.to_string();
        let task = tokio::spawn(async move {
            let mut most = 0;
            let mut together = Vec::new();
            let mut any = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let mut down = Vec::new();
                let probes: Vec<_> = instances
                    .iter()
                    .map(|(name, ip)| {
                        let (name, ip, password) = (name.clone(), ip.clone(), password.clone());
                        tokio::spawn(async move {
                            let answer = tokio::time::timeout(
                                Duration::from_secs(3),
                                connect_within(&ip, &password, Duration::from_secs(2)),
                            )
                            .await;
                            match answer {
                                Ok(Ok(c)) => match c.simple_query("select 1").await {
                                    Ok(_) => None,
                                    Err(_) => Some(name),
                                },
                                Ok(Err(e)) if e.to_string().contains("timed out") => None,
                                Ok(Err(_)) => Some(name),
                                Err(_elapsed) => None,
                            }
                        })
                    })
                    .collect();
                for probe in probes {
                    if let Ok(Some(name)) = probe.await {
                        down.push(name);
                    }
                }
                most = most.max(down.len());
                any += usize::from(!down.is_empty());
                if down.len() > 1 {
                    together.push(down);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (most, together, any)
        });
        Self { stop, task }
    }

    async fn stop(self) -> Result<Downs> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(self.task.await?)
    }
}

/// (reason, note) of the cluster's Events.
async fn events(env: &Env, cluster: &str) -> Result<Vec<(String, String)>> {
    let api: Api<Event> = Api::namespaced(env.client.clone(), env.n());
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(cluster))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}

fn blocked_with(s: &PostgresClusterStatus, reason: &str, words: &str) -> bool {
    find_condition(&s.conditions, ROLLOUT_BLOCKED)
        .is_some_and(|c| c.status == "True" && c.reason == reason && c.message.contains(words))
}

fn not_blocked(s: &PostgresClusterStatus) -> bool {
    find_condition(&s.conditions, ROLLOUT_BLOCKED).is_some_and(|c| c.status == "False")
}

async fn create_with_writer(
    env: &Env,
    name: &str,
    spec: serde_json::Value,
    replicas: i32,
) -> Result<(String, String)> {
    env.create(name, spec).await?;
    let ready = env.wait_ready(name, replicas).await?;
    let primary = ready
        .status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?;
    let password = env.password(name).await?;
    write_through_rw(
        env,
        name,
        &password,
        "create table acked(id bigint primary key)",
    )
    .await?;
    Ok((primary, password))
}

#[tokio::test]
async fn e2e_the_restart_annotation_restarts_one_instance_at_a_time_with_one_switchover() -> Result
{
    let _serial = SERIAL.lock().await;
    let env = start("e2e-restart").await?;
    let (primary, password) = create_with_writer(
        &env,
        "rs",
        json!({"replicas": 3, "storage": {"size": "1Gi"}}),
        3,
    )
    .await?;
    let before = start_times(&env, "rs", &password).await?;
    let writer = Writer::start(&env, "rs", &password);
    let watch = DownWatch::start(env.pod_ips("rs").await?, &password);

    env.clusters()
        .patch(
            "rs",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {ANNOTATION_RESTART: "1"}}}),
            ),
        )
        .await?;
    let after = pgop_testenv::wait::until("every postmaster restarted", TIMEOUT, || async {
        let now = start_times(&env, "rs", &password)
            .await
            .map_err(|e| e.to_string())?;
        let all = before
            .iter()
            .all(|(n, t)| now.get(n).is_some_and(|u| u > t));
        if all {
            Ok(now)
        } else {
            Err(format!("{before:?} -> {now:?}"))
        }
    })
    .await?;
    let ready = env.wait_ready("rs", 3).await?;
    let (acked, gap) = writer.stop_timed().await?;
    assert!(!acked.is_empty());
    let gap = gap.ok_or("no commit acknowledged")?;
    let (most_down, seen_down, samples_down) = watch.stop().await?;
    assert!(samples_down > 0, "the watch saw no instance down at all");

    // One at a time: never two instances down together (sampled every 100 ms), the
    // standbys first, the old primary last.
    assert!(
        most_down <= 1,
        "at most one instance down at a time; seen down together: {seen_down:?}"
    );
    let mut order: Vec<(f64, String)> = after.iter().map(|(n, t)| (*t, n.clone())).collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    // The Events say what moved the primary when the order is not the expected one (a
    // failover on a loaded machine restarts the old primary out of turn).
    assert_eq!(
        order[2].1,
        primary,
        "the old primary restarts last: {order:?}; events: {:?}",
        events(&env, "rs").await?
    );
    let status = ready.status.ok_or("no status")?;
    assert_ne!(status.current_primary.as_deref(), Some(primary.as_str()));
    let switchovers = events(&env, "rs")
        .await?
        .iter()
        .filter(|(r, _)| r == "SwitchoverStarted")
        .count();
    assert_eq!(switchovers, 1);
    println!("longest write gap during the rolling restart: {gap:?}");

    // Done once: nothing restarts again for the same annotation value.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(start_times(&env, "rs", &password).await?, after);
    env.stop().await
}

#[tokio::test]
async fn e2e_a_value_the_dry_run_refuses_blocks_the_rollout_before_any_restart() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("e2e-dryrun").await?;
    let (primary, password) = create_with_writer(
        &env,
        "dry",
        json!({"replicas": 2, "storage": {"size": "1Gi"}}),
        2,
    )
    .await?;
    let before = start_times(&env, "dry", &password).await?;
    let writer = Writer::start(&env, "dry", &password);
    env.patch(
        "dry",
        json!({"spec": {"postgresql": {"parameters": {"shared_preload_libraries": "pgop_no_such_library"}}}}),
    )
    .await?;
    env.wait_cluster(
        "dry",
        "RolloutBlocked (RestartRefused) naming the library",
        TIMEOUT,
        |s| blocked_with(s, "RestartRefused", "pgop_no_such_library"),
    )
    .await?;
    // The Event follows the status write (published after it, in the same pass).
    pgop_testenv::wait::until(
        "a RolloutBlocked Event naming the library",
        TIMEOUT,
        || async {
            let seen = events(&env, "dry").await.map_err(|e| e.to_string())?;
            if seen
                .iter()
                .any(|(r, n)| r == "RolloutBlocked" && n.contains("pgop_no_such_library"))
            {
                Ok(())
            } else {
                Err(format!("events so far: {seen:?}"))
            }
        },
    )
    .await?;
    assert_eq!(
        start_times(&env, "dry", &password).await?,
        before,
        "nothing was restarted"
    );
    env.patch(
        "dry",
        json!({"spec": {"postgresql": {"parameters": {"shared_preload_libraries": null}}}}),
    )
    .await?;
    env.wait_cluster("dry", "RolloutBlocked False", TIMEOUT, not_blocked)
        .await?;
    let (_, gap) = writer.stop_timed().await?;
    let gap = gap.ok_or("no commit acknowledged")?;
    println!("longest write gap while the rollout was refused: {gap:?}");
    assert!(gap < MAX_GAP, "longest write gap {gap:?}");
    assert_eq!(env.current_primary("dry").await?, primary);
    env.stop().await
}

/// A restart-only value PostgreSQL accepts at parse time (so the dry run lets it pass) but
/// refuses at start on this machine: `huge_pages: on` where no huge pages are reserved,
/// else a `shared_buffers` twice the machine's memory and swap.
fn refused_at_start() -> Result<(&'static str, String)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let kib = |field: &str| -> u64 {
        meminfo
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    if kib("HugePages_Total:") == 0 {
        return Ok(("huge_pages", "on".into()));
    }
    let too_much = (kib("MemTotal:") + kib("SwapTotal:")) * 2 / 1024;
    Ok(("shared_buffers", format!("{too_much}MB")))
}

/// What the cluster says of `instance` being down: its reason and message in status.
fn down_in_status(s: &PostgresClusterStatus, instance: &str) -> (Option<String>, String) {
    s.instances
        .iter()
        .find(|i| i.name == instance)
        .map(|i| (i.reason.clone(), i.message.clone().unwrap_or_default()))
        .unwrap_or_default()
}

/// Waits until `standby` is shown down in status, conditions, an Event and `kubectl pgop
/// status`, for `parameter` with PostgreSQL's `words`.
async fn wait_named_down(
    env: &Env,
    cluster: &str,
    standby: &str,
    parameter: &str,
    words: &str,
) -> Result {
    let s = env
        .wait_cluster(
            cluster,
            &format!("{standby} StartFailed after the restart for {parameter}, the rollout blocked at once"),
            TIMEOUT,
            |s| {
                let (reason, message) = down_in_status(s, standby);
                reason.as_deref() == Some("StartFailed")
                    && message.contains(parameter)
                    && message.contains(words)
                    && blocked_with(s, "InstanceCannotStart", words)
            },
        )
        .await?
        .status
        .ok_or("no status")?;
    let (_, message) = down_in_status(&s, standby);
    println!("{standby} is down: {message}");
    let condition = |t: &str| {
        find_condition(&s.conditions, t)
            .cloned()
            .ok_or(format!("no {t}"))
    };
    let blocked = condition(ROLLOUT_BLOCKED)?;
    assert!(
        blocked.message.contains(standby) && blocked.message.contains(parameter),
        "{}",
        blocked.message
    );
    let applied = condition(pgop_api::conditions::CONFIGURATION_APPLIED)?;
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        ("False", "InstanceCannotStart"),
        "{}",
        applied.message
    );
    let ready = condition(pgop_api::conditions::READY)?;
    assert!(
        ready
            .message
            .contains(&format!("not ready: {standby} (StartFailed)")),
        "{}",
        ready.message
    );
    pgop_testenv::wait::until(
        &format!("an InstanceDown Event naming {standby} and {parameter}"),
        TIMEOUT,
        || async {
            let seen = events(env, cluster).await.map_err(|e| e.to_string())?;
            if seen.iter().any(|(r, n)| {
                r == "InstanceDown"
                    && n.contains(standby)
                    && n.contains(parameter)
                    && n.contains(words)
            }) {
                Ok(())
            } else {
                Err(format!("events so far: {seen:?}"))
            }
        },
    )
    .await?;
    let shown = kubectl_pgop_status(env, cluster).await?;
    for part in [
        format!("{standby} is down since "),
        "StartFailed".into(),
        parameter.into(),
        words.into(),
    ] {
        assert!(shown.contains(&part), "{part:?} in\n{shown}");
    }
    Ok(())
}

#[tokio::test]
async fn e2e_an_instance_that_cannot_start_is_named_with_postgresqls_words_and_heals_when_the_spec_is_fixed()
-> Result {
    let _serial = SERIAL.lock().await;
    let env = start("e2e-block").await?;
    // The bound for an instance not back is far off: the block below comes at once.
    let (primary, password) = create_with_writer(
        &env,
        "blk",
        json!({"replicas": 2, "storage": {"size": "1Gi"}, "switchoverTimeout": 600}),
        2,
    )
    .await?;
    let before = start_times(&env, "blk", &password).await?;
    let writer = Writer::start(&env, "blk", &password);
    let standby = before
        .keys()
        .find(|n| **n != primary)
        .ok_or("no standby")?
        .clone();

    // A value PostgreSQL refuses only at start: the standby restarts first and stays
    // down, named with the parameter and PostgreSQL's words everywhere a user looks.
    let (parameter, value) = refused_at_start()?;
    env.patch(
        "blk",
        json!({"spec": {"postgresql": {"parameters": {parameter: value}}}}),
    )
    .await?;
    wait_named_down(&env, "blk", &standby, parameter, "FATAL").await?;

    // A file that is no library (the dry run only sees that it exists).
    env.patch(
        "blk",
        json!({"spec": {"postgresql": {"parameters": {parameter: null, "shared_preload_libraries": NOT_A_LIBRARY}}}}),
    )
    .await?;
    wait_named_down(
        &env,
        "blk",
        &standby,
        "shared_preload_libraries",
        NOT_A_LIBRARY,
    )
    .await?;

    // The primary was never touched and kept serving.
    let primary_ip = env.pod_ip(&primary).await?;
    let started = postmaster_started(&connect(&primary_ip, &password).await?).await?;
    assert_eq!(Some(&started), before.get(&primary));
    assert_eq!(env.current_primary("blk").await?, primary);

    // Fixing the spec heals the standby, with no Pod deleted by hand, and clears it all.
    env.patch(
        "blk",
        json!({"spec": {"postgresql": {"parameters": {"shared_preload_libraries": null}}}}),
    )
    .await?;
    env.wait_ready("blk", 2).await?;
    let healed = env
        .wait_cluster(
            "blk",
            "RolloutBlocked False, no reason left",
            TIMEOUT,
            |s| {
                not_blocked(s)
                    && s.instances
                        .iter()
                        .all(|i| i.reason.is_none() && i.message.is_none())
            },
        )
        .await?
        .status
        .ok_or("no status")?;
    let applied = find_condition(
        &healed.conditions,
        pgop_api::conditions::CONFIGURATION_APPLIED,
    )
    .ok_or("no ConfigurationApplied")?;
    assert_eq!(applied.status, "True", "{}", applied.message);
    pgop_testenv::wait::until("an InstanceBack Event", TIMEOUT, || async {
        let seen = events(&env, "blk").await.map_err(|e| e.to_string())?;
        if seen
            .iter()
            .any(|(r, n)| r == "InstanceBack" && n.contains(&standby))
        {
            Ok(())
        } else {
            Err(format!("events so far: {seen:?}"))
        }
    })
    .await?;
    let shown = kubectl_pgop_status(&env, "blk").await?;
    assert!(!shown.contains(" is down"), "{shown}");
    let (acked, gap) = writer.stop_timed().await?;
    let gap = gap.ok_or("no commit acknowledged")?;
    println!("longest write gap while a standby could not start: {gap:?}");
    assert!(gap < MAX_GAP, "longest write gap {gap:?}");
    rows_on_standby(&env, "blk", &standby, &password, acked.len()).await?;
    env.stop().await
}

/// The standby holds at least `rows` rows of `acked` (it streams again).
async fn rows_on_standby(
    env: &Env,
    cluster: &str,
    standby: &str,
    password: &str,
    rows: usize,
) -> Result {
    let ip = env.pod_ip(standby).await?;
    let rows = i64::try_from(rows)?;
    pgop_testenv::wait::until("the healed standby to catch up", TIMEOUT, || async {
        match count_on(&ip, password, "acked").await {
            Ok(n) if n >= rows => Ok(()),
            other => Err(format!("{cluster}/{standby}: {other:?}")),
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn e2e_a_primary_that_cannot_start_hands_over_to_a_standby() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("e2e-nostart").await?;
    let (primary, password) = create_with_writer(
        &env,
        "ns",
        json!({"replicas": 2, "storage": {"size": "1Gi"},
               "postgresql": {"parameters": {"max_connections": "150"}}}),
        2,
    )
    .await?;
    let writer = Writer::start(&env, "ns", &password);
    // Lowering max_connections restarts the primary first, in place; the library makes
    // that start fail.
    env.patch(
        "ns",
        json!({"spec": {"postgresql": {"parameters": {"max_connections": "120", "shared_preload_libraries": NOT_A_LIBRARY}}}}),
    )
    .await?;
    let new_primary = env
        .wait_cluster("ns", "a new primary", TIMEOUT, |s| {
            s.current_primary.as_deref().is_some_and(|p| p != primary)
                && s.target_primary == s.current_primary
        })
        .await?
        .status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?;
    env.patch(
        "ns",
        json!({"spec": {"postgresql": {"parameters": {"shared_preload_libraries": null}}}}),
    )
    .await?;
    env.wait_ready("ns", 2).await?;
    let (acked, gap) = writer.stop_timed().await?;
    let gap = gap.ok_or("no commit acknowledged")?;
    println!("longest write gap with a primary that cannot start: {gap:?}");
    assert!(
        gap < Duration::from_secs(10),
        "the standby took over within 10 s: longest write gap {gap:?}"
    );
    assert_eq!(env.current_primary("ns").await?, new_primary);
    write_through_rw(&env, "ns", &password, "select 1").await?;
    rows_on_standby(&env, "ns", &primary, &password, acked.len()).await?;
    env.stop().await
}
