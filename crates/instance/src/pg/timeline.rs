//! Timelines: whether a standby can still follow its primary.
//!
//! A standby that replayed WAL of its old timeline past the point where the new primary's
//! timeline forked off can never follow it: PostgreSQL retries and logs "new timeline N
//! forked off current database system timeline M before current recovery point" forever.
//! That happens when the instance promoted did not have every record another standby had
//! (a failover that had to choose among the standbys that answered, or asynchronous
//! replication). Such a standby must be rewound (pg_rewind) onto the primary's timeline.
//!
//! The primary's timeline history (`pg_wal/<timeline>.history`) says where each of its
//! ancestors ended: read through `pg_read_binary_file`, which the replication role may
//! call (pg_rewind needs the same grant).

use super::sql::{Error, Upstream};
use pgop_api::instance_status::parse_lsn;

/// The primary's current timeline and the history of how it got there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryTimeline {
    pub timeline: u32,
    /// (parent timeline, the LSN at which the next timeline forked off it), oldest first.
    pub history: Vec<(u32, u64)>,
}

/// Where a standby is: its timeline and the end of the WAL it replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyPosition {
    pub timeline: u32,
    pub replayed: u64,
}

/// Whether a standby at `standby` can never follow a primary on `primary`: its timeline is
/// not an ancestor of the primary's (or is newer), or it replayed past the point where the
/// primary's line forked off it. A standby on the primary's own timeline, or behind the
/// fork, can follow (it may only lag).
pub fn diverged(primary: &PrimaryTimeline, standby: StandbyPosition) -> bool {
    if standby.timeline == primary.timeline {
        return false;
    }
    if standby.timeline > primary.timeline {
        return true;
    }
    match primary
        .history
        .iter()
        .find(|(parent, _)| *parent == standby.timeline)
    {
        Some((_, forked_at)) => standby.replayed > *forked_at,
        None => true,
    }
}

/// The entries of a timeline history file: `parent<TAB>switchpoint<TAB>reason` per line;
/// blank lines and `#` comments are skipped. An unreadable line is an error: deciding on a
/// partial history could throw a standby's data away for nothing.
pub fn parse_history(text: &str) -> Result<Vec<(u32, u64)>, String> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let parent = fields.next().and_then(|f| f.parse::<u32>().ok());
        let switchpoint = fields.next().and_then(parse_lsn);
        match (parent, switchpoint) {
            (Some(parent), Some(switchpoint)) => entries.push((parent, switchpoint)),
            _ => return Err(format!("unreadable timeline history line {line:?}")),
        }
    }
    Ok(entries)
}

/// The name of timeline `timeline`'s history file, relative to PGDATA.
pub fn history_file(timeline: u32) -> String {
    format!("pg_wal/{timeline:08X}.history")
}

impl Upstream {
    /// The primary's timeline and history; `None` when it is in recovery (not a primary
    /// yet, or no longer).
    pub async fn timeline(&self) -> Result<Option<PrimaryTimeline>, Error> {
        let reach = |source| self.unreachable(source);
        let client = self.connect().await?;
        let row = client
            .query_one(
                "SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                        ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
                        END",
                &[],
            )
            .await
            .map_err(reach)?;
        let Some(timeline) = row.try_get::<_, Option<i64>>(0).map_err(reach)? else {
            return Ok(None);
        };
        let timeline = u32::try_from(timeline).map_err(|_| Error::History {
            host: self.host.clone(),
            why: format!("timeline {timeline} is out of range"),
        })?;
        if timeline == 1 {
            return Ok(Some(PrimaryTimeline {
                timeline,
                history: Vec::new(),
            }));
        }
        let row = client
            .query_one("SELECT pg_read_binary_file($1)", &[&history_file(timeline)])
            .await
            .map_err(reach)?;
        let bytes: Vec<u8> = row.try_get(0).map_err(reach)?;
        let history =
            parse_history(&String::from_utf8_lossy(&bytes)).map_err(|why| Error::History {
                host: self.host.clone(),
                why,
            })?;
        Ok(Some(PrimaryTimeline { timeline, history }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIX: &str = "1\t0/3000060\tno recovery target specified\n\n\
2\t0/40000A0\tno recovery target specified\n\
3\t0/4A3F1D8\tno recovery target specified\n\
4\t0/4F00000\tno recovery target specified\n\
5\t0/50CEA60\tno recovery target specified\n";

    fn primary() -> PrimaryTimeline {
        PrimaryTimeline {
            timeline: 6,
            history: parse_history(SIX).expect("history"),
        }
    }

    fn at(timeline: u32, lsn: &str) -> StandbyPosition {
        StandbyPosition {
            timeline,
            replayed: parse_lsn(lsn).expect("lsn"),
        }
    }

    #[test]
    fn a_history_file_is_read_line_by_line() {
        let h = parse_history(SIX).expect("history");
        assert_eq!(h.len(), 5);
        assert_eq!(h[0], (1, 0x3000060));
        assert_eq!(h[4], (5, 0x50CEA60));
        assert_eq!(parse_history("# comment\n\n").expect("empty"), Vec::new());
        let bad = parse_history("5\tnot-an-lsn\treason\n").expect_err("bad line");
        assert!(bad.contains("not-an-lsn"), "{bad}");
        assert!(parse_history("five\t0/1\tx\n").is_err());
        assert_eq!(history_file(6), "pg_wal/00000006.history");
        assert_eq!(history_file(0x1A), "pg_wal/0000001A.history");
    }

    #[test]
    fn a_standby_past_the_fork_of_the_primarys_timeline_has_diverged() {
        let p = primary();
        // The failure seen in CI: the standby replayed one commit of timeline 5 that the
        // promoted instance never received.
        assert!(diverged(&p, at(5, "0/50CEB78")));
        // Up to the fork (inclusive) it can follow: it only lags.
        assert!(!diverged(&p, at(5, "0/50CEA60")));
        assert!(!diverged(&p, at(5, "0/50CE000")));
        // An older ancestor: compared with where that one ended.
        assert!(!diverged(&p, at(3, "0/4A3F1D8")));
        assert!(diverged(&p, at(3, "0/4A3F1E0")));
        // The primary's own timeline, whatever the position.
        assert!(!diverged(&p, at(6, "0/FFFFFFF")));
        // Not an ancestor, or newer than the primary's: it can never follow.
        assert!(diverged(&p, at(7, "0/1")));
        let other = PrimaryTimeline {
            timeline: 3,
            history: vec![(1, 0x100)],
        };
        assert!(diverged(&other, at(2, "0/50")));
        // A primary still on timeline 1 has no history: only timeline 1 follows it.
        let first = PrimaryTimeline {
            timeline: 1,
            history: Vec::new(),
        };
        assert!(!diverged(&first, at(1, "0/9000000")));
    }
}
