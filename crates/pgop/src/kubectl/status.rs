//! `kubectl pgop status`: one screen about a cluster, or the same as JSON.

use super::Error;
use jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use pgop_api::PostgresBackup;
use pgop_api::cluster::InstanceRole;
use pgop_api::instance_status::{MAX_DOWN_MESSAGE, printable};
use pgop_api::v1beta1::PostgresCluster;
use std::io::Write;

/// The cluster's PostgresBackups.
pub async fn backups_of(
    client: &Client,
    ns: &str,
    cluster: &str,
) -> Result<Vec<PostgresBackup>, Error> {
    Ok(Api::<PostgresBackup>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|b| b.spec.cluster.name == cluster)
        .collect())
}

/// What `status` shows of `c` now: the cluster, its PostgresBackups and its certificates.
pub async fn read(client: &Client, ns: &str, c: &PostgresCluster) -> Result<View, Error> {
    let name = c.name_any();
    let backups = backups_of(client, ns, &name).await?;
    let mut view = view(c, &backups, Timestamp::now());
    match certificates(client, ns, &name, Timestamp::now()).await {
        Ok(certs) => view.certificates = certs,
        Err(e) => view.certificates_error = Some(e),
    }
    Ok(view)
}

/// What `status` shows, as `-o json` prints it.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    cluster: String,
    namespace: String,
    phase: Option<String>,
    postgres_version: Option<i32>,
    instances_wanted: i32,
    instances_ready: i32,
    primary: Option<String>,
    primary_since: Option<String>,
    primary_for_seconds: Option<i64>,
    instances: Vec<InstanceView>,
    /// A replica cluster (`spec.replica`), or one promoted from it: what it follows and how.
    #[serde(skip_serializing_if = "Option::is_none")]
    replica: Option<ReplicaView>,
    /// The PgBouncer poolers (`spec.poolers`): none when the cluster has none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    poolers: Vec<PoolerView>,
    backups: BackupsView,
    /// The cluster's certificates (from their Secrets' `database.example.com/not-after`).
    certificates: Vec<CertificateView>,
    /// Why they could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    certificates_error: Option<String>,
    conditions: Vec<ConditionView>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct CertificateView {
    secret: String,
    not_after: String,
    expires_in_days: i64,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct InstanceView {
    name: String,
    role: String,
    ready: bool,
    fenced: bool,
    timeline: Option<i64>,
    /// Primary: the current WAL LSN; standby: the last received.
    lsn: Option<String>,
    replayed_lsn: Option<String>,
    /// Standby: bytes of WAL the primary has written that it has not replayed.
    lag_bytes: Option<u64>,
    postgres_version: Option<String>,
    /// Why it is not ready (`status.instances[].reason`), its words and since when.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    down_since: Option<String>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ReplicaView {
    /// The entry of `spec.externalClusters` followed, and its `host:port`.
    source: String,
    source_address: Option<String>,
    /// `following`, `not following`, `promoting` or `promoted`.
    state: String,
    /// ReplicaFollowing's (or, once asked, ReplicaPromoted's) reason and message.
    reason: Option<String>,
    message: Option<String>,
    lag_seconds: Option<i64>,
    lag_bytes: Option<i64>,
    last_message_at: Option<String>,
    /// Once promoted: whether it was forced (not streaming), and when it completed.
    forced: Option<bool>,
    promoted_at: Option<String>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PoolerView {
    name: String,
    /// Its Service (the address clients use).
    service: String,
    #[serde(rename = "type")]
    type_: String,
    pool_mode: String,
    instances_wanted: i32,
    instances_ready: i32,
}

#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BackupsView {
    last_base_backup: Option<String>,
    last_logical_backup: Option<String>,
    /// The earliest time the cluster can be restored to (the oldest base backup kept).
    recoverable_from: Option<String>,
    next_base_backup: Option<String>,
    next_logical_backup: Option<String>,
    /// The cluster's PostgresBackups by phase.
    by_phase: std::collections::BTreeMap<String, usize>,
    running: Vec<String>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ConditionView {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: String,
    message: String,
}

pub fn view(c: &PostgresCluster, backups: &[PostgresBackup], now: Timestamp) -> View {
    let status = c.status.clone().unwrap_or_default();
    let lsn = |s: &Option<String>| s.as_deref().and_then(pgop_api::instance_status::parse_lsn);
    let primary_lsn = status
        .instances
        .iter()
        .find(|i| i.role == Some(InstanceRole::Primary))
        .and_then(|i| lsn(&i.received_lsn));
    let instances = status
        .instances
        .iter()
        .map(|i| InstanceView {
            name: i.name.clone(),
            role: match i.role {
                Some(InstanceRole::Primary) => "primary",
                Some(InstanceRole::Replica) => "standby",
                None => "unknown",
            }
            .to_string(),
            ready: i.ready,
            fenced: i.fenced,
            timeline: i.timeline,
            lsn: i.received_lsn.clone(),
            replayed_lsn: i.replayed_lsn.clone(),
            lag_bytes: match (i.role, primary_lsn, lsn(&i.replayed_lsn)) {
                (Some(InstanceRole::Replica), Some(p), Some(r)) => Some(p.saturating_sub(r)),
                _ => None,
            },
            postgres_version: i.postgres_version.clone(),
            reason: i.reason.clone(),
            message: i.message.clone(),
            down_since: i.down_since.clone(),
        })
        .collect();
    let since = status.target_primary_since.as_ref().map(|t| t.0);
    let next = |schedule: Option<&String>| {
        let schedule = schedule?;
        let timezone = c.spec.backup.as_ref().and_then(|b| b.timezone.as_deref());
        pgop_operator::backup::schedule::Schedule::parse(schedule, timezone)
            .ok()?
            .next_after(now)
            .map(|t| t.to_string())
    };
    let mut by_phase = std::collections::BTreeMap::new();
    let mut running = Vec::new();
    for b in backups {
        let phase = b
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map_or_else(|| "New".to_string(), |p| format!("{p:?}"));
        if phase == "Running" {
            running.push(b.name_any());
        }
        *by_phase.entry(phase).or_insert(0) += 1;
    }
    View {
        cluster: c.name_any(),
        namespace: c.namespace().unwrap_or_default(),
        phase: status.phase.map(|p| format!("{p:?}")),
        postgres_version: status.postgres_version,
        instances_wanted: c.spec.instances,
        instances_ready: status.ready_replicas,
        primary: status.current_primary.clone(),
        primary_since: since.map(|t| t.to_string()),
        primary_for_seconds: since.map(|t| (now - t).get_seconds()).map(|s| s.max(0)),
        instances,
        replica: replica_view(c, &status),
        poolers: c
            .spec
            .poolers
            .iter()
            .map(|p| {
                let seen = status.poolers.iter().find(|s| s.name == p.name);
                PoolerView {
                    name: p.name.clone(),
                    service: pgop_api::pooler::pooler_name(&c.name_any(), &p.name),
                    type_: match p.type_ {
                        pgop_api::pooler::PoolerType::Rw => "rw",
                        pgop_api::pooler::PoolerType::Ro => "ro",
                    }
                    .to_string(),
                    pool_mode: p.pool_mode.as_str().to_string(),
                    instances_wanted: p.instances,
                    instances_ready: seen.map_or(0, |s| s.ready_instances),
                }
            })
            .collect(),
        backups: BackupsView {
            last_base_backup: status.last_backup_time.as_ref().map(|t| t.0.to_string()),
            last_logical_backup: status
                .last_logical_backup_time
                .as_ref()
                .map(|t| t.0.to_string()),
            recoverable_from: status
                .first_recoverability_point
                .as_ref()
                .map(|t| t.0.to_string()),
            next_base_backup: next(
                c.spec
                    .backup
                    .as_ref()
                    .and_then(|b| b.base.schedule.as_ref()),
            ),
            next_logical_backup: next(
                c.spec
                    .backup
                    .as_ref()
                    .and_then(|b| b.logical.schedule.as_ref()),
            ),
            by_phase,
            running,
        },
        certificates: Vec::new(),
        certificates_error: None,
        conditions: status
            .conditions
            .iter()
            .map(|k| ConditionView {
                type_: k.type_.clone(),
                status: k.status.clone(),
                reason: k.reason.clone(),
                message: k.message.clone(),
            })
            .collect(),
    }
}

/// What a replica cluster follows and how (`None` for a cluster that never was one).
fn replica_view(
    c: &PostgresCluster,
    status: &pgop_api::PostgresClusterStatus,
) -> Option<ReplicaView> {
    let spec = c.spec.replica.as_ref()?;
    let report = status.replica.as_ref();
    if !spec.enabled && report.is_none() {
        return None;
    }
    let condition = |t: &str| pgop_api::conditions::find_condition(&status.conditions, t);
    let promotion = report.and_then(|r| r.promotion.as_ref());
    let (state, shown) = match promotion {
        Some(p) if p.completed_at.is_some() => (
            "promoted",
            condition(pgop_api::conditions::REPLICA_PROMOTED),
        ),
        Some(_) => (
            "promoting",
            condition(pgop_api::conditions::REPLICA_PROMOTED),
        ),
        None => {
            let following = condition(pgop_api::conditions::REPLICA_FOLLOWING);
            let state = if following.is_some_and(|f| f.status == pgop_api::conditions::TRUE) {
                "following"
            } else {
                "not following"
            };
            // A promotion asked for and refused says so first.
            let refused = condition(pgop_api::conditions::REPLICA_PROMOTED);
            (state, refused.or(following))
        }
    };
    // The server's address, or for an entry with a store alone, where that store is.
    let entry = c
        .spec
        .external_clusters
        .iter()
        .find(|e| e.name == spec.source);
    let address = entry.and_then(|e| match (&e.connection, &e.store) {
        (Some(k), _) => Some(format!("{}:{}", k.host, k.port)),
        (None, Some(store)) => store.s3.as_ref().map(|s3| match s3.path.as_deref() {
            Some(path) => format!("its store s3://{}/{path}/{}", s3.bucket, store.cluster),
            None => format!("its store s3://{}/{}", s3.bucket, store.cluster),
        }),
        (None, None) => None,
    });
    Some(ReplicaView {
        source: spec.source.clone(),
        source_address: address,
        state: state.to_string(),
        reason: shown.map(|k| k.reason.clone()),
        message: shown.map(|k| k.message.clone()),
        lag_seconds: report.and_then(|r| r.lag_seconds),
        lag_bytes: report.and_then(|r| r.lag_bytes),
        last_message_at: report.and_then(|r| r.last_message_at.clone()),
        forced: promotion.map(|p| p.forced),
        promoted_at: promotion
            .and_then(|p| p.completed_at.as_ref())
            .map(|t| t.0.to_string()),
    })
}

/// When each certificate of the cluster expires: the `database.example.com/not-after`
/// annotation of its Secrets (read as metadata only: no value leaves the API server).
async fn certificates(
    client: &Client,
    ns: &str,
    cluster: &str,
    now: Timestamp,
) -> Result<Vec<CertificateView>, String> {
    let selector =
        ListParams::default().labels(&format!("{}={cluster}", pgop_api::labels::CLUSTER));
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .list_metadata(&selector)
        .await
        .map_err(|e| format!("the Secrets could not be listed: {e}"))?;
    let mut out: Vec<CertificateView> = secrets
        .items
        .iter()
        .filter_map(|s| {
            let at: Timestamp = s
                .annotations()
                .get(pgop_api::constants::ANNOTATION_NOT_AFTER)?
                .parse()
                .ok()?;
            Some(CertificateView {
                secret: s.name_any(),
                not_after: at.to_string(),
                expires_in_days: (at - now).get_seconds().div_euclid(86_400),
            })
        })
        .collect();
    out.sort_by(|a, b| a.secret.cmp(&b.secret));
    Ok(out)
}

/// `3m12s`, `2h05m`, `4d3h`.
fn human(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

fn bytes(b: u64) -> String {
    match b {
        0..1024 => format!("{b} B"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        _ => format!("{:.1} MiB", b as f64 / 1_048_576.0),
    }
}

/// ANSI colours, only when writing to a terminal.
fn paint(text: &str, code: &str, colour: bool) -> String {
    if colour {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

const GREEN: &str = "32";
const YELLOW: &str = "33";
const RED: &str = "31";
const BOLD: &str = "1";

pub fn render(v: &View, out: &mut impl Write, colour: bool) -> std::io::Result<()> {
    let phase = v.phase.as_deref().unwrap_or("Unknown");
    let phase_colour = match phase {
        "Ready" => GREEN,
        "Degraded" | "Invalid" => RED,
        _ => YELLOW,
    };
    writeln!(
        out,
        "{} {} (namespace {})  phase {}  PostgreSQL {}  {}/{} instances ready",
        paint("Cluster", BOLD, colour),
        v.cluster,
        v.namespace,
        paint(phase, phase_colour, colour),
        v.postgres_version
            .map_or("?".to_string(), |m| m.to_string()),
        v.instances_ready,
        v.instances_wanted,
    )?;
    match (&v.primary, &v.primary_since, v.primary_for_seconds) {
        (Some(p), Some(since), Some(s)) => writeln!(
            out,
            "{} {p}, for {} (since {since})",
            paint("Primary", BOLD, colour),
            human(s)
        )?,
        (Some(p), _, _) => writeln!(out, "{} {p}", paint("Primary", BOLD, colour))?,
        _ => writeln!(out, "{} none", paint("Primary", BOLD, colour))?,
    }
    if let Some(r) = &v.replica {
        // The status is anybody's to write: every word escaped before the terminal.
        let state_colour = match r.state.as_str() {
            "following" | "promoted" => GREEN,
            "promoting" => YELLOW,
            _ => RED,
        };
        let address = r
            .source_address
            .as_deref()
            .map(|a| format!(" ({})", printable(a, 270)))
            .unwrap_or_default();
        let lag = match (r.lag_seconds, r.lag_bytes) {
            (Some(s), Some(b)) => format!(", lag {} ({})", human(s), bytes(b.max(0) as u64)),
            (Some(s), None) => format!(", lag {}", human(s)),
            _ => String::new(),
        };
        writeln!(
            out,
            "{} {}{address}: {}{lag}",
            paint("Replica of", BOLD, colour),
            printable(&r.source, 80),
            paint(&r.state, state_colour, colour),
        )?;
        if let (Some(reason), Some(message)) = (&r.reason, &r.message)
            && r.state != "following"
        {
            writeln!(
                out,
                "  {}: {}",
                printable(reason, 40),
                printable(message, MAX_DOWN_MESSAGE)
            )?;
        }
    }
    writeln!(out)?;
    writeln!(out, "{}", paint("Instances", BOLD, colour))?;
    let mut rows = vec![[
        "NAME".to_string(),
        "ROLE".to_string(),
        "READY".to_string(),
        "TIMELINE".to_string(),
        "LSN".to_string(),
        "REPLAYED".to_string(),
        "LAG".to_string(),
    ]];
    for i in &v.instances {
        // A fenced instance's PostgreSQL is stopped: no role to report.
        let role = match (i.fenced, i.role.as_str()) {
            (true, "unknown") => "fenced".to_string(),
            (true, role) => format!("{role} (fenced)"),
            (false, role) => role.to_string(),
        };
        let ready = match (i.ready, &i.reason) {
            (true, _) => "yes".to_string(),
            (false, Some(reason)) => format!("no ({})", printable(reason, 40)),
            (false, None) => "no".to_string(),
        };
        rows.push([
            i.name.clone(),
            role,
            ready,
            i.timeline.map_or("-".into(), |t| t.to_string()),
            i.lsn.clone().unwrap_or_else(|| "-".into()),
            i.replayed_lsn.clone().unwrap_or_else(|| "-".into()),
            i.lag_bytes.map_or("-".into(), bytes),
        ]);
    }
    table(&rows, out)?;
    // Why an instance is down, in PostgreSQL's (or its manager's) words; the status is
    // anybody's to write, so every word is escaped again before it reaches the terminal.
    for i in v.instances.iter().filter(|i| !i.ready) {
        let Some(reason) = &i.reason else { continue };
        let since = i
            .down_since
            .as_deref()
            .map(|s| format!(" since {}", printable(s, 40)))
            .unwrap_or_default();
        writeln!(
            out,
            "{} is down{since}: {}",
            printable(&i.name, 80),
            paint(&printable(reason, 40), RED, colour)
        )?;
        if let Some(message) = &i.message {
            writeln!(out, "  {}", printable(message, MAX_DOWN_MESSAGE))?;
        }
    }
    if !v.poolers.is_empty() {
        writeln!(out)?;
        writeln!(out, "{}", paint("Poolers", BOLD, colour))?;
        let mut rows = vec![[
            "NAME".to_string(),
            "SERVICE".to_string(),
            "TYPE".to_string(),
            "MODE".to_string(),
            "READY".to_string(),
        ]];
        for p in &v.poolers {
            rows.push([
                p.name.clone(),
                p.service.clone(),
                p.type_.clone(),
                p.pool_mode.clone(),
                format!("{}/{}", p.instances_ready, p.instances_wanted),
            ]);
        }
        table(&rows, out)?;
    }
    writeln!(out)?;
    writeln!(out, "{}", paint("Backups", BOLD, colour))?;
    let b = &v.backups;
    let or_none = |s: &Option<String>| s.clone().unwrap_or_else(|| "none".into());
    writeln!(
        out,
        "  last base backup:     {}",
        or_none(&b.last_base_backup)
    )?;
    writeln!(
        out,
        "  recoverable from:     {}",
        or_none(&b.recoverable_from)
    )?;
    writeln!(
        out,
        "  next base backup:     {}",
        b.next_base_backup
            .clone()
            .unwrap_or_else(|| "not scheduled".into())
    )?;
    writeln!(
        out,
        "  last logical backup:  {}",
        or_none(&b.last_logical_backup)
    )?;
    writeln!(
        out,
        "  next logical backup:  {}",
        b.next_logical_backup
            .clone()
            .unwrap_or_else(|| "not scheduled".into())
    )?;
    let counts: Vec<String> = b.by_phase.iter().map(|(p, n)| format!("{n} {p}")).collect();
    writeln!(
        out,
        "  PostgresBackups:      {}",
        if counts.is_empty() {
            "none".to_string()
        } else {
            counts.join(", ")
        }
    )?;
    writeln!(out)?;
    writeln!(out, "{}", paint("Certificates", BOLD, colour))?;
    match (&v.certificates_error, v.certificates.as_slice()) {
        (Some(why), _) => writeln!(out, "  {why}")?,
        (None, []) => writeln!(out, "  none found")?,
        (None, certs) => {
            for c in certs {
                let days = c.expires_in_days;
                let left = format!("in {days} days");
                let left = match days {
                    ..0 => paint("expired", RED, colour),
                    0..30 => paint(&left, YELLOW, colour),
                    _ => left,
                };
                writeln!(out, "  {}: expires {} ({left})", c.secret, c.not_after)?;
            }
        }
    }
    writeln!(out)?;
    writeln!(out, "{}", paint("Conditions", BOLD, colour))?;
    let mut rows = vec![[
        "TYPE".to_string(),
        "STATUS".to_string(),
        "REASON".to_string(),
        "MESSAGE".to_string(),
    ]];
    // Messages quote PostgreSQL and outside servers (a replica cluster's source): escaped
    // like every other word of the status.
    for k in &v.conditions {
        rows.push([
            printable(&k.type_, 80),
            printable(&k.status, 20),
            printable(&k.reason, 80),
            printable(&k.message, MAX_DOWN_MESSAGE),
        ]);
    }
    table(&rows, out)
}

/// Left-aligned columns two spaces apart, indented by two; the last column unpadded.
fn table<const N: usize>(rows: &[[String; N]], out: &mut impl Write) -> std::io::Result<()> {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in rows {
        let mut line = String::from(" ");
        for (k, (cell, w)) in row.iter().zip(widths).enumerate() {
            line.push(' ');
            if k + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$} "));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_instance_that_is_down_is_shown_with_its_reason_and_words_escaped() {
        let c: PostgresCluster = serde_json::from_value(json!({
            "apiVersion": "database.example.com/v1beta1", "kind": "PostgresCluster",
            "metadata": {"name": "shop", "namespace": "prod"},
            "spec": {"instances": 2, "storage": {"size": "1Gi"}},
            "status": {"phase": "Degraded", "currentPrimary": "shop-1", "readyReplicas": 1,
                "instances": [
                    {"name": "shop-1", "serial": 1, "role": "primary", "ready": true},
                    {"name": "shop-2", "serial": 2, "ready": false, "reason": "StartFailed",
                     "downSince": "2026-12-06T02:00:00Z",
                     "message": "after the restart for huge_pages: FATAL:  could not map anonymous shared memory\u{1b}[2J"}]}
        }))
        .expect("cluster");
        let now: Timestamp = "2026-12-06T02:03:00Z".parse().expect("time");
        let v = view(&c, &[], now);
        let mut out = Vec::new();
        render(&v, &mut out, false).expect("render");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(!text.contains('\x1b'), "{text}");
        for part in [
            "shop-2  unknown  no (StartFailed)",
            "shop-2 is down since 2026-12-06T02:00:00Z: StartFailed",
            "  after the restart for huge_pages: FATAL:  could not map anonymous shared memory\\u{1b}[2J",
        ] {
            assert!(text.contains(part), "{part:?} in\n{text}");
        }
    }

    #[test]
    fn the_status_screen_shows_roles_lag_backups_and_conditions_without_colour() {
        let c: PostgresCluster = serde_json::from_value(json!({
            "apiVersion": "database.example.com/v1beta1", "kind": "PostgresCluster",
            "metadata": {"name": "shop", "namespace": "prod"},
            "spec": {"instances": 2, "storage": {"size": "1Gi"},
                "backup": {"base": {"schedule": "0 3 * * *"}},
                "poolers": [{"name": "rw", "instances": 2}, {"name": "reports", "type": "ro", "poolMode": "session"}]},
            "status": {"phase": "Ready", "currentPrimary": "shop-1", "readyReplicas": 2,
                "postgresVersion": 15, "targetPrimarySince": "2026-12-04T10:00:00Z",
                "lastBackupTime": "2026-12-04T03:00:05Z",
                "poolers": [{"name": "rw", "service": "shop-pooler-rw", "instances": 2, "readyInstances": 1}],
                "instances": [
                    {"name": "shop-1", "serial": 1, "role": "primary", "ready": true,
                     "timeline": 1, "receivedLsn": "0/3000200"},
                    {"name": "shop-2", "serial": 2, "role": "replica", "ready": true,
                     "timeline": 1, "receivedLsn": "0/3000200", "replayedLsn": "0/3000000",
                     "fenced": true}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "AllInstancesReady",
                    "message": "2 of 2 instances are ready",
                    "lastTransitionTime": "2026-12-04T10:00:00Z"}]}
        }))
        .expect("cluster");
        let now: Timestamp = "2026-12-04T10:03:12Z".parse().expect("time");
        let mut v = view(&c, &[], now);
        v.certificates = vec![
            CertificateView {
                secret: "shop-server-tls".into(),
                not_after: "2027-03-01T00:00:00Z".into(),
                expires_in_days: 86,
            },
            CertificateView {
                secret: "shop-replication-tls".into(),
                not_after: "2026-12-20T00:00:00Z".into(),
                expires_in_days: 15,
            },
        ];
        assert_eq!(v.primary_for_seconds, Some(192));
        assert_eq!(v.instances[1].lag_bytes, Some(0x200));
        assert_eq!(
            v.backups.next_base_backup.as_deref(),
            Some("2026-12-05T03:00:00Z")
        );
        let mut out = Vec::new();
        render(&v, &mut out, false).expect("render");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(!text.contains('\x1b'), "no colour off a terminal");
        for part in [
            "Cluster shop (namespace prod)  phase Ready  PostgreSQL 15  2/2 instances ready",
            "Primary shop-1, for 3m12s (since 2026-12-04T10:00:00Z)",
            "shop-2  standby (fenced)  yes    1         0/3000200  0/3000000  512 B",
            "next base backup:     2026-12-05T03:00:00Z",
            "Ready  True    AllInstancesReady  2 of 2 instances are ready",
            "shop-server-tls: expires 2027-03-01T00:00:00Z (in 86 days)",
            "rw       shop-pooler-rw       rw    transaction  1/2",
            "reports  shop-pooler-reports  ro    session      0/1",
        ] {
            assert!(text.contains(part), "{part:?} in\n{text}");
        }
        let mut coloured = Vec::new();
        render(&v, &mut coloured, true).expect("render");
        let coloured = String::from_utf8_lossy(&coloured).into_owned();
        assert!(coloured.contains("\x1b[32mReady\x1b[0m"));
        assert!(
            coloured.contains("(\x1b[33min 15 days\x1b[0m)"),
            "{coloured}"
        );
    }

    #[test]
    fn a_replica_cluster_shows_what_it_follows_and_why_not() {
        let cluster = |status: serde_json::Value| -> PostgresCluster {
            serde_json::from_value(json!({
                "apiVersion": "database.example.com/v1beta1", "kind": "PostgresCluster",
                "metadata": {"name": "shop", "namespace": "dr"},
                "spec": {"instances": 2, "storage": {"size": "1Gi"},
                    "externalClusters": [{"name": "site-a", "connection":
                        {"host": "db-rw.site-a.example.com", "user": "streaming_replica",
                         "sslMode": "require"}}],
                    "replica": {"source": "site-a"}},
                "status": status,
            }))
            .expect("cluster")
        };
        let now: Timestamp = "2026-12-07T10:00:00Z".parse().expect("time");
        let text = |c: &PostgresCluster| {
            let mut out = Vec::new();
            render(&view(c, &[], now), &mut out, false).expect("render");
            String::from_utf8(out).expect("utf-8")
        };
        let following = cluster(json!({"currentPrimary": "shop-1",
            "replica": {"source": "site-a", "designatedPrimary": "shop-1", "streaming": true,
                        "lagSeconds": 2, "lagBytes": 2048},
            "conditions": [{"type": "ReplicaFollowing", "status": "True", "reason": "Streaming",
                "message": "shop-1 streams from site-a", "lastTransitionTime": "2026-12-07T09:00:00Z"}]}));
        let shown = text(&following);
        assert!(
            shown.contains(
                "Replica of site-a (db-rw.site-a.example.com:5432): following, lag 2s (2.0 KiB)"
            ),
            "{shown}"
        );
        let refused = cluster(json!({"currentPrimary": "shop-1",
            "replica": {"source": "site-a", "designatedPrimary": "shop-1",
                        "refusalReason": "SourceAuthenticationFailed"},
            "conditions": [{"type": "ReplicaFollowing", "status": "False",
                "reason": "SourceAuthenticationFailed",
                "message": "site-a refuses shop-1: FATAL: certificate \u{1b}[2J required",
                "lastTransitionTime": "2026-12-07T09:00:00Z"}]}));
        let shown = text(&refused);
        assert!(
            shown.contains("Replica of site-a (db-rw.site-a.example.com:5432): not following"),
            "{shown}"
        );
        assert!(
            shown.contains("  SourceAuthenticationFailed: site-a refuses shop-1"),
            "{shown}"
        );
        assert!(!shown.contains('\x1b'), "{shown}");
        // Following a store alone: where the store is.
        let mut archive = following.clone();
        archive.spec.external_clusters = serde_json::from_value(json!([{"name": "site-a",
            "store": {"cluster": "shop", "s3": {"bucket": "backups", "path": "site-a",
                "credentialsSecret": {"name": "s3"}}}}]))
        .expect("entry");
        let shown = text(&archive);
        assert!(
            shown.contains("Replica of site-a (its store s3://backups/site-a/shop): following"),
            "{shown}"
        );
        // An ordinary cluster has no such line.
        let mut plain = following.clone();
        plain.spec.replica = None;
        assert!(!text(&plain).contains("Replica of"));
    }
}
