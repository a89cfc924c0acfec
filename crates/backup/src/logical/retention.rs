//! Retention of logical backups: pure plans and their application.

use super::*;

/// The logical backups to delete, oldest first: those whose end time is more than
/// `retention_days` before `now`, never the newest completed one (by end time). A manifest
/// whose end time does not parse is kept. Pure.
pub fn plan_retention(
    manifests: &[LogicalManifest],
    now: jiff::Timestamp,
    retention_days: u32,
) -> Vec<String> {
    let window = jiff::SignedDuration::from_hours(24 * i64::from(retention_days));
    let cutoff = now.checked_sub(window).unwrap_or(jiff::Timestamp::MIN);
    let mut sorted: Vec<&LogicalManifest> = manifests.iter().collect();
    sorted.sort_by(|a, b| {
        a.end_time()
            .cmp(&b.end_time())
            .then(a.backup_id.cmp(&b.backup_id))
    });
    let newest = sorted.last().map(|m| m.backup_id.clone());
    sorted
        .iter()
        .filter(|m| Some(&m.backup_id) != newest.as_ref())
        .filter(|m| m.end_time().is_some_and(|end| end < cutoff))
        .map(|m| m.backup_id.clone())
        .collect()
}

/// Incomplete logical backups (no manifest) whose newest object is older than
/// [`INCOMPLETE_GRACE`]: leftovers of failed backups. Pure.
pub fn plan_leftovers(
    incomplete: &[(String, jiff::Timestamp)],
    now: jiff::Timestamp,
) -> Vec<String> {
    let grace = jiff::SignedDuration::try_from(INCOMPLETE_GRACE).unwrap_or_default();
    let cutoff = now.checked_sub(grace).unwrap_or(jiff::Timestamp::MIN);
    incomplete
        .iter()
        .filter(|(_, newest)| *newest < cutoff)
        .map(|(id, _)| id.clone())
        .collect()
}

/// What [`apply_retention`] did (or would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionResult {
    pub kept: Vec<String>,
    pub deleted: Vec<String>,
    /// Incomplete backups (no manifest) older than [`INCOMPLETE_GRACE`].
    pub deleted_incomplete: Vec<String>,
}

/// Applies [`plan_retention`] and [`plan_leftovers`] to the store (nothing is deleted when
/// `dry_run`).
pub async fn apply_retention(
    store: &Store,
    now: jiff::Timestamp,
    retention_days: u32,
    dry_run: bool,
) -> Result<RetentionResult, Error> {
    let manifests = list(store).await?;
    let deleted = plan_retention(&manifests, now, retention_days);
    let leftovers = incomplete(store).await?;
    let deleted_incomplete: Vec<String> = plan_leftovers(&leftovers, now)
        .into_iter()
        .filter(|id| check_id(id).is_ok())
        .collect();
    let kept = manifests
        .iter()
        .map(|m| m.backup_id.clone())
        .filter(|id| !deleted.contains(id))
        .collect();
    if !dry_run {
        for id in deleted.iter().chain(&deleted_incomplete) {
            delete(store, id).await?;
        }
    }
    Ok(RetentionResult {
        kept,
        deleted,
        deleted_incomplete,
    })
}
