//! The size of the volumes: `spec.storage.size`, raised by `spec.storage.autoGrow` when an
//! instance reports its data volume filling up, and whether every volume has grown to it
//! (the `VolumesResized` condition). Pure: the reconcile reads, this decides.
//!
//! Auto-grow grows the volumes of every instance together (a standby holds what the
//! primary holds), once the last growth is over: every claim asks for the size, its
//! capacity says the StorageClass's resizer gave it, and every instance's filesystem
//! reports at least [`SETTLED_PERCENT`] of it (what a filesystem keeps for itself). The
//! size it reached is kept in `status.autoGrow` and the volumes are never made smaller than
//! it, whatever `spec.storage.size` says later.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use pgop_api::cluster::{AutoGrowStatus, StorageSpec, WalStorageSpec};
use pgop_api::instance_status::VolumeUsage;
use pgop_api::quantity;

/// A filesystem whose size is at least this share of its claim's request has grown.
pub const SETTLED_PERCENT: u128 = 90;

const MIB: u128 = 1024 * 1024;

/// What the reconcile does about the volumes' size.
#[derive(Debug, Clone, PartialEq)]
pub struct Storage {
    /// The size every claim asks for: the largest of `spec.storage.size` and what
    /// auto-grow reached (now or before).
    pub size: String,
    /// The size every WAL claim asks for (`spec.walStorage.size`; auto-grow leaves the
    /// WAL volumes alone).
    pub wal_size: Option<String>,
    /// `status.autoGrow` to write.
    pub record: Option<AutoGrowStatus>,
    /// A Normal `VolumeAutoGrown` Event, when the volumes grow in this pass.
    pub grown: Option<String>,
    /// A Warning `VolumeAutoGrowLimit` Event, when an instance first passes the threshold
    /// at `maxSize`.
    pub at_limit: Option<String>,
}

/// Bytes of a quantity (`None` when it is not one).
fn bytes(q: &str) -> Option<u128> {
    quantity::millis(q).and_then(|m| u128::try_from(m / 1000).ok())
}

/// The larger of two quantities (the first when they are equal or either is no quantity).
pub fn larger(a: &str, b: &str) -> String {
    match (bytes(a), bytes(b)) {
        (Some(x), Some(y)) if y > x => b.to_string(),
        _ => a.to_string(),
    }
}

/// What a claim asks for and what it has, in bytes.
fn request_and_capacity(pvc: &PersistentVolumeClaim) -> (Option<u128>, Option<u128>) {
    let request = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| bytes(&q.0));
    let capacity = pvc
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| bytes(&q.0));
    (request, capacity)
}

/// The data claims among a cluster's claims (not `spec.walStorage`'s).
fn data_claims(pvcs: &[PersistentVolumeClaim]) -> impl Iterator<Item = &PersistentVolumeClaim> {
    pvcs.iter()
        .filter(|p| !crate::cluster::build::pvc::is_wal(p))
}

/// Decides the size of the volumes. `usage` is what each instance's manager reports of
/// its data volume now.
pub fn decide(
    spec: &StorageSpec,
    wal: Option<&WalStorageSpec>,
    recorded: Option<&AutoGrowStatus>,
    pvcs: &[PersistentVolumeClaim],
    usage: &[(&str, VolumeUsage)],
    now: &Time,
) -> Storage {
    let size = match recorded {
        Some(r) => larger(&spec.size, &r.size),
        None => spec.size.clone(),
    };
    let mut out = Storage {
        size: size.clone(),
        wal_size: wal.map(|w| w.size.clone()),
        record: recorded.cloned(),
        grown: None,
        at_limit: None,
    };
    let (Some(grow), Some(current)) = (&spec.auto_grow, bytes(&size)) else {
        return out;
    };
    let threshold = u64::try_from(grow.threshold_percent).unwrap_or(80);
    let fullest = usage
        .iter()
        .filter(|(_, u)| u.used_percent() >= threshold)
        .max_by_key(|(_, u)| u.used_percent());
    let Some((instance, fullest)) = fullest else {
        // Below the threshold again: a limit reported before is lifted.
        if let Some(r) = out.record.as_mut() {
            r.at_limit = false;
        }
        return out;
    };
    let settled = data_claims(pvcs).all(|pvc| match request_and_capacity(pvc) {
        (Some(request), Some(capacity)) => request >= current && capacity >= request,
        _ => false,
    }) && usage
        .iter()
        .all(|(_, u)| u128::from(u.capacity_bytes) * 100 >= current * SETTLED_PERCENT);
    if !settled {
        return out;
    }
    let max = bytes(&grow.max_size).unwrap_or(current);
    let increase = u128::try_from(grow.increase_percent).unwrap_or(50);
    let target = (current * (100 + increase) / 100).div_ceil(MIB) * MIB;
    let target = target.min(max);
    let used = fullest.used_percent();
    if target > current {
        let grown = if target.is_multiple_of(MIB) {
            format!("{}Mi", target / MIB)
        } else {
            target.to_string()
        };
        out.grown = Some(format!(
            "the volumes grow from {size} to {grown}: {instance} is {used}% full (threshold \
             {threshold}%, at most {})",
            grow.max_size
        ));
        out.record = Some(AutoGrowStatus {
            size: grown.clone(),
            grown_at: Some(now.clone()),
            count: recorded.map_or(0, |r| r.count).saturating_add(1),
            at_limit: false,
        });
        out.size = grown;
    } else if !recorded.is_some_and(|r| r.at_limit) {
        out.at_limit = Some(format!(
            "{instance} is {used}% full (threshold {threshold}%) and its volume is at \
             spec.storage.autoGrow.maxSize ({}): auto-grow can do no more; raise maxSize or \
             spec.storage.size, or free space",
            grow.max_size
        ));
        out.record = Some(AutoGrowStatus {
            size: recorded.map_or_else(|| size.clone(), |r| r.size.clone()),
            grown_at: recorded.and_then(|r| r.grown_at.clone()),
            count: recorded.map_or(0, |r| r.count),
            at_limit: true,
        });
    }
    out
}

/// The `VolumesResized` condition's status, reason and message: whether every data claim
/// asks for `storage.size` and has it, and every instance's filesystem shows it, and every
/// WAL claim asks for `wal_size` and has it. `refused` is the API server's refusal of the
/// last change (from the apply), kept while the claims still ask for less.
pub fn resized(
    storage: &Storage,
    pvcs: &[PersistentVolumeClaim],
    usage: &[(&str, VolumeUsage)],
    refused: Option<&str>,
) -> (bool, &'static str, String) {
    let data: Vec<&PersistentVolumeClaim> = data_claims(pvcs).collect();
    let data = claims_resized(&storage.size, &data, usage, refused);
    let Some(wal_size) = storage.wal_size.as_deref().filter(|_| data.0) else {
        return data;
    };
    let wal: Vec<&PersistentVolumeClaim> = pvcs
        .iter()
        .filter(|p| crate::cluster::build::pvc::is_wal(p))
        .collect();
    match claims_resized(wal_size, &wal, &[], refused) {
        (true, reason, _) => (
            true,
            reason,
            format!("{}; every WAL volume has {wal_size}", data.2),
        ),
        not_yet => not_yet,
    }
}

/// [`resized`] for one kind of claim: `claims` against `size`, and the filesystems in
/// `usage`.
fn claims_resized(
    size: &str,
    pvcs: &[&PersistentVolumeClaim],
    usage: &[(&str, VolumeUsage)],
    refused: Option<&str>,
) -> (bool, &'static str, String) {
    use kube::ResourceExt;
    let Some(wanted) = bytes(size) else {
        return (true, "Resized", format!("every volume asks for {size}"));
    };
    let asking_less: Vec<String> = pvcs
        .iter()
        .filter(|p| request_and_capacity(p).0.is_some_and(|r| r < wanted))
        .map(|p| p.name_any())
        .collect();
    if !asking_less.is_empty() {
        if let Some(refused) = refused {
            return (false, "ResizeRefused", refused.to_string());
        }
        return (
            false,
            "Resizing",
            format!("{} asked to grow to {size}", asking_less.join(", ")),
        );
    }
    let growing: Vec<String> = pvcs
        .iter()
        .filter_map(|p| match request_and_capacity(p) {
            (Some(r), Some(c)) if c >= r => None,
            (_, Some(c)) => Some(format!("{} has {} MiB", p.name_any(), c / MIB)),
            _ => Some(format!("{} has no capacity yet", p.name_any())),
        })
        .collect();
    if !growing.is_empty() {
        return (
            false,
            "Resizing",
            format!(
                "the StorageClass grows the claims to {size}: {}",
                growing.join(", ")
            ),
        );
    }
    let small: Vec<String> = usage
        .iter()
        .filter(|(_, u)| u128::from(u.capacity_bytes) * 100 < wanted * SETTLED_PERCENT)
        .map(|(i, u)| format!("{i} reports {} MiB", u128::from(u.capacity_bytes) / MIB))
        .collect();
    if !small.is_empty() {
        return (
            false,
            "Resizing",
            format!(
                "the claims have {size}; the filesystems grow: {}",
                small.join(", ")
            ),
        );
    }
    (true, "Resized", format!("every volume has {size}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgop_api::cluster::AutoGrowSpec;

    const GIB: u64 = 1024 * 1024 * 1024;

    fn pvc(name: &str, request: &str, capacity: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"resources": {"requests": {"storage": request}}},
            "status": capacity.map(|c| serde_json::json!({"capacity": {"storage": c}})),
        }))
        .expect("pvc")
    }

    fn spec(size: &str, grow: Option<(i32, i32, &str)>) -> StorageSpec {
        StorageSpec {
            size: size.into(),
            storage_class_name: None,
            auto_grow: grow.map(|(t, i, m)| AutoGrowSpec {
                threshold_percent: t,
                increase_percent: i,
                max_size: m.into(),
            }),
        }
    }

    fn used(capacity: u64, percent: u64) -> VolumeUsage {
        VolumeUsage {
            capacity_bytes: capacity,
            used_bytes: capacity * percent / 100,
            available_bytes: capacity - capacity * percent / 100,
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn without_auto_grow_the_size_is_the_spec_s_or_what_auto_grow_reached_before() {
        let pvcs = [pvc("c-1", "1Gi", Some("1Gi"))];
        let full = [("c-1", used(GIB, 99))];
        let s = decide(&spec("1Gi", None), None, None, &pvcs, &full, &now());
        assert_eq!((s.size.as_str(), s.grown, s.record), ("1Gi", None, None));
        let before = AutoGrowStatus {
            size: "1536Mi".into(),
            grown_at: Some(now()),
            count: 1,
            at_limit: false,
        };
        let s = decide(
            &spec("1Gi", None),
            None,
            Some(&before),
            &pvcs,
            &full,
            &now(),
        );
        assert_eq!(s.size, "1536Mi");
        // A spec raised past it wins.
        let s = decide(
            &spec("2Gi", None),
            None,
            Some(&before),
            &pvcs,
            &full,
            &now(),
        );
        assert_eq!(s.size, "2Gi");
    }

    #[test]
    fn a_volume_past_the_threshold_grows_every_volume_by_the_increase_up_to_the_maximum() {
        let grow = spec("1Gi", Some((80, 50, "2Gi")));
        let pvcs = [
            pvc("c-1", "1Gi", Some("1Gi")),
            pvc("c-2", "1Gi", Some("1Gi")),
        ];
        let quiet = [("c-1", used(GIB, 50)), ("c-2", used(GIB, 79))];
        assert_eq!(decide(&grow, None, None, &pvcs, &quiet, &now()).size, "1Gi");
        let full = [("c-1", used(GIB, 50)), ("c-2", used(GIB, 85))];
        let s = decide(&grow, None, None, &pvcs, &full, &now());
        assert_eq!(s.size, "1536Mi");
        assert_eq!(
            s.record.as_ref().map(|r| (r.size.as_str(), r.count)),
            Some(("1536Mi", 1))
        );
        assert!(
            s.grown
                .as_deref()
                .is_some_and(|m| m.contains("c-2 is 85% full")),
            "{s:?}"
        );

        // The next growth waits until the last is over: claims, then filesystems.
        let recorded = s.record.clone();
        let asking = [
            pvc("c-1", "1536Mi", Some("1Gi")),
            pvc("c-2", "1536Mi", Some("1Gi")),
        ];
        let s = decide(&grow, None, recorded.as_ref(), &asking, &full, &now());
        assert_eq!((s.size.as_str(), s.grown.is_none()), ("1536Mi", true));
        let given = [
            pvc("c-1", "1536Mi", Some("1536Mi")),
            pvc("c-2", "1536Mi", Some("1536Mi")),
        ];
        let s = decide(&grow, None, recorded.as_ref(), &given, &full, &now());
        assert_eq!((s.size.as_str(), s.grown.is_none()), ("1536Mi", true));
        let grown_fs = [
            ("c-1", used(GIB * 3 / 2, 50)),
            ("c-2", used(GIB * 3 / 2, 90)),
        ];
        let s = decide(&grow, None, recorded.as_ref(), &given, &grown_fs, &now());
        // 1.5 GiB * 1.5 = 2.25 GiB, capped at 2 GiB.
        assert_eq!(s.size, "2048Mi");
        assert_eq!(s.record.as_ref().map(|r| r.count), Some(2));

        // At the maximum: reported once, not grown.
        let recorded = s.record.clone();
        let at_max = [
            pvc("c-1", "2Gi", Some("2Gi")),
            pvc("c-2", "2Gi", Some("2Gi")),
        ];
        let full_fs = [("c-1", used(2 * GIB, 50)), ("c-2", used(2 * GIB, 95))];
        let s = decide(&grow, None, recorded.as_ref(), &at_max, &full_fs, &now());
        assert_eq!(s.size, "2048Mi");
        assert!(s.grown.is_none());
        assert!(
            s.at_limit
                .as_deref()
                .is_some_and(|m| m.contains("maxSize (2Gi)"))
        );
        assert!(
            s.record
                .as_ref()
                .is_some_and(|r| r.at_limit && r.count == 2)
        );
        let again = decide(&grow, None, s.record.as_ref(), &at_max, &full_fs, &now());
        assert_eq!(
            (again.at_limit, again.record.clone()),
            (None, s.record.clone())
        );
        // Below the threshold again, the limit is lifted.
        let freed = [("c-1", used(2 * GIB, 50)), ("c-2", used(2 * GIB, 60))];
        let s = decide(&grow, None, again.record.as_ref(), &at_max, &freed, &now());
        assert!(s.record.as_ref().is_some_and(|r| !r.at_limit));
    }

    #[test]
    fn a_claim_not_bound_yet_holds_the_growth() {
        let grow = spec("1Gi", Some((80, 50, "4Gi")));
        let pvcs = [pvc("c-1", "1Gi", Some("1Gi")), pvc("c-2", "1Gi", None)];
        let full = [("c-1", used(GIB, 90))];
        assert_eq!(decide(&grow, None, None, &pvcs, &full, &now()).size, "1Gi");
    }

    fn wanted(size: &str, wal_size: Option<&str>) -> Storage {
        Storage {
            size: size.into(),
            wal_size: wal_size.map(Into::into),
            record: None,
            grown: None,
            at_limit: None,
        }
    }

    fn wal_pvc(name: &str, request: &str, capacity: Option<&str>) -> PersistentVolumeClaim {
        let mut p = pvc(name, request, capacity);
        p.metadata.labels = Some(
            [(
                pgop_api::labels::VOLUME.to_string(),
                pgop_api::labels::VOLUME_WAL.to_string(),
            )]
            .into(),
        );
        p
    }

    #[test]
    fn wal_claims_follow_wal_storage_and_are_not_data_volumes() {
        // A WAL claim larger than the data size is no shrink, and does not hold auto-grow.
        let pvcs = [
            pvc("c-1", "1Gi", Some("1Gi")),
            wal_pvc("c-1-wal", "4Gi", Some("4Gi")),
        ];
        let fs = [("c-1", used(GIB, 10))];
        assert_eq!(
            resized(&wanted("1Gi", Some("4Gi")), &pvcs, &fs, None),
            (
                true,
                "Resized",
                "every volume has 1Gi; every WAL volume has 4Gi".to_string()
            )
        );
        let r = resized(&wanted("1Gi", Some("8Gi")), &pvcs, &fs, None);
        assert_eq!(
            (r.0, r.1, r.2.as_str()),
            (false, "Resizing", "c-1-wal asked to grow to 8Gi")
        );
        let grow = spec("1Gi", Some((80, 50, "4Gi")));
        let full = [("c-1", used(GIB, 90))];
        assert_eq!(
            decide(&grow, None, None, &pvcs, &full, &now()).size,
            "1536Mi"
        );
    }

    #[test]
    fn the_condition_follows_a_resize_from_request_to_filesystem() {
        let small = [pvc("c-1", "1Gi", Some("1Gi"))];
        assert_eq!(
            resized(&wanted("2Gi", None), &small, &[], None).1,
            "Resizing"
        );
        let refused = resized(
            &wanted("2Gi", None),
            &small,
            &[],
            Some("forbidden: only dynamically ..."),
        );
        assert_eq!((refused.0, refused.1), (false, "ResizeRefused"));
        let asked = [pvc("c-1", "2Gi", Some("1Gi"))];
        let r = resized(&wanted("2Gi", None), &asked, &[], Some("stale"));
        assert_eq!(
            (r.1, r.2.as_str()),
            (
                "Resizing",
                "the StorageClass grows the claims to 2Gi: c-1 has 1024 MiB"
            )
        );
        let given = [pvc("c-1", "2Gi", Some("2Gi"))];
        let old_fs = [("c-1", used(GIB, 10))];
        assert_eq!(
            resized(&wanted("2Gi", None), &given, &old_fs, None).1,
            "Resizing"
        );
        let new_fs = [("c-1", used(2 * GIB - 50 * 1024 * 1024, 10))];
        assert_eq!(
            resized(&wanted("2Gi", None), &given, &new_fs, None),
            (true, "Resized", "every volume has 2Gi".to_string())
        );
    }
}
