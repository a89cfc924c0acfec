//! Retention: which base backups and WAL files to delete, as a pure function of what the
//! store holds and the time now; and [`apply`], which carries it out.
//!
//! Rules:
//! - a completed backup is kept while its end time is within `retention_days` of now;
//! - the newest completed backup is always kept, whatever its age;
//! - WAL is kept from the begin WAL position of the oldest kept backup on (every timeline;
//!   timeline history files always), so that every kept backup can be restored and rolled
//!   forward to the end of the archive; older WAL files are deleted;
//! - an incomplete backup (no manifest) is deleted once its newest object is older than
//!   the retention period (a backup under way is younger);
//! - with no completed backup at all, nothing is deleted.

use crate::base::{self, Manifest};
use crate::store::{self, Listed, Store};
use crate::wal::WalName;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Base(#[from] base::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// What the store holds.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub backups: Vec<Manifest>,
    /// Backups without manifest: id and the time of their newest object.
    pub incomplete: Vec<(String, jiff::Timestamp)>,
    /// Objects under `wal/`.
    pub wal: Vec<Listed>,
}

/// What retention keeps and deletes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub keep_backups: Vec<String>,
    pub delete_backups: Vec<String>,
    /// WAL object keys (relative to the cluster's root).
    pub delete_wal: Vec<String>,
    /// The first WAL file kept (the oldest kept backup's begin WAL).
    pub oldest_kept_wal: Option<String>,
}

/// The retention decision; pure.
pub fn plan(inventory: &Inventory, now: jiff::Timestamp, retention_days: u32) -> Plan {
    let window = jiff::SignedDuration::from_hours(24 * i64::from(retention_days));
    let cutoff = now.checked_sub(window).unwrap_or(jiff::Timestamp::MIN);
    let mut backups: Vec<&Manifest> = inventory.backups.iter().collect();
    backups.sort_by(|a, b| {
        a.end_time()
            .cmp(&b.end_time())
            .then(a.backup_id.cmp(&b.backup_id))
    });
    let newest = backups.last().map(|b| b.backup_id.clone());
    let mut out = Plan::default();
    for backup in &backups {
        let recent = backup.end_time().is_none_or(|end| end >= cutoff);
        if recent || Some(&backup.backup_id) == newest.as_ref() {
            out.keep_backups.push(backup.backup_id.clone());
        } else {
            out.delete_backups.push(backup.backup_id.clone());
        }
    }
    for (id, newest_object) in &inventory.incomplete {
        if *newest_object < cutoff {
            out.delete_backups.push(id.clone());
        }
    }
    let oldest_kept = backups
        .iter()
        .filter(|b| out.keep_backups.contains(&b.backup_id))
        .filter_map(|b| b.begin_wal_name())
        .filter_map(|w| w.position.map(|p| (p, w.name)))
        .min();
    let Some((oldest_position, oldest_name)) = oldest_kept else {
        // No completed backup (or none readable): which WAL is needed is unknown.
        return out;
    };
    out.oldest_kept_wal = Some(oldest_name);
    for object in &inventory.wal {
        let Some(wal) = WalName::from_key(&object.key) else {
            continue;
        };
        if let Some(position) = wal.position
            && position < oldest_position
        {
            out.delete_wal.push(object.key.clone());
        }
    }
    out
}

/// Reads what the store holds.
pub async fn inventory(store: &Store) -> Result<Inventory, Error> {
    let (backups, incomplete) = base::list(store).await?;
    let wal = store.list("wal/").await?;
    Ok(Inventory {
        backups,
        incomplete,
        wal,
    })
}

/// Applies retention to the store: backups first (manifest first, so that a backup half
/// deleted is incomplete, never a manifest without data), then WAL.
pub async fn apply(
    store: &Store,
    now: jiff::Timestamp,
    retention_days: u32,
) -> Result<Plan, Error> {
    let inventory = inventory(store).await?;
    let plan = plan(&inventory, now, retention_days);
    for id in &plan.delete_backups {
        let dir = format!("base/{id}/");
        store
            .delete(&format!("{dir}{}", base::MANIFEST_FILE))
            .await?;
        for object in store.list(&dir).await? {
            store.delete(&object.key).await?;
        }
    }
    for key in &plan.delete_wal {
        store.delete(key).await?;
    }
    tracing::info!(kept = ?plan.keep_backups, deleted = ?plan.delete_backups, wal_deleted = plan.delete_wal.len(), "retention applied");
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(id: &str, begin_wal: &str, end: &str) -> Manifest {
        Manifest {
            format: 1,
            backup_id: id.into(),
            cluster: "c".into(),
            system_identifier: "1".into(),
            timeline: 1,
            begin_lsn: "0/0".into(),
            end_lsn: "0/0".into(),
            begin_wal: begin_wal.into(),
            end_wal: begin_wal.into(),
            begin_time: end.into(),
            end_time: end.into(),
            size_bytes: 0,
            stored_bytes: 0,
            postgres_version_num: 150000,
            from_standby: false,
            files: vec![],
        }
    }

    fn wal(names: &[&str]) -> Vec<Listed> {
        names
            .iter()
            .map(|n| Listed {
                key: WalName::parse(n).expect("name").key(),
                size: 1,
                last_modified: jiff::Timestamp::UNIX_EPOCH,
            })
            .collect()
    }

    fn t(s: &str) -> jiff::Timestamp {
        s.parse().expect("time")
    }

    #[test]
    fn old_backups_and_their_wal_go_the_newest_backup_stays() {
        let inventory = Inventory {
            backups: vec![
                backup("b1", "000000010000000000000002", "2025-01-01T00:00:00Z"),
                backup("b2", "000000010000000000000005", "2025-01-20T00:00:00Z"),
                backup("b3", "000000020000000000000009", "2025-02-05T00:00:00Z"),
            ],
            incomplete: vec![
                ("old".into(), t("2025-01-02T00:00:00Z")),
                ("running".into(), t("2025-02-09T23:00:00Z")),
            ],
            wal: wal(&[
                "000000010000000000000001",
                "000000010000000000000004",
                "000000010000000000000005",
                "000000010000000000000006.partial",
                "00000002.history",
                "000000020000000000000006",
                "000000020000000000000009",
            ]),
        };
        // Ten days: b3 is recent, b2 and b1 are not.
        let plan = plan(&inventory, t("2025-02-10T00:00:00Z"), 10);
        assert_eq!(plan.keep_backups, vec!["b3"]);
        assert_eq!(plan.delete_backups, vec!["b1", "b2", "old"]);
        assert_eq!(
            plan.oldest_kept_wal.as_deref(),
            Some("000000020000000000000009")
        );
        let deleted: Vec<_> = plan
            .delete_wal
            .iter()
            .map(|k| WalName::from_key(k).expect("key").name)
            .collect();
        assert_eq!(
            deleted,
            vec![
                "000000010000000000000001",
                "000000010000000000000004",
                "000000010000000000000005",
                "000000010000000000000006.partial",
                "000000020000000000000006"
            ]
        );
    }

    #[test]
    fn the_last_backup_is_kept_however_old_and_nothing_goes_without_backups() {
        let inventory = Inventory {
            backups: vec![backup(
                "b1",
                "000000010000000000000002",
                "2024-01-01T00:00:00Z",
            )],
            incomplete: vec![],
            wal: wal(&["000000010000000000000001", "000000010000000000000002"]),
        };
        let plan1 = plan(&inventory, t("2025-06-01T00:00:00Z"), 1);
        assert_eq!(plan1.keep_backups, vec!["b1"]);
        assert!(plan1.delete_backups.is_empty());
        assert_eq!(plan1.delete_wal.len(), 1, "only the WAL before b1");

        let empty = Inventory {
            backups: vec![],
            incomplete: vec![],
            wal: wal(&["000000010000000000000001"]),
        };
        assert_eq!(plan(&empty, t("2025-06-01T00:00:00Z"), 1), Plan::default());
    }
}
