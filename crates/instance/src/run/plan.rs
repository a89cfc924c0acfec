//! The decision of one reconcile pass, as a pure function: from the cluster status and what
//! the manager observes of its instance, the one role action to take now, and the standbys
//! to keep slots and synchronous names for. It must never name a primary the status does
//! not name, and never initdb while another instance is the current primary. Actions that
//! run PostgreSQL as a primary ([`Action::needs_lease`]) are carried out only by the holder
//! of the primary Lease: the caller acquires it first, or waits.

use crate::bootstrap::DataState;
use crate::status::PgRole;
use pgop_api::PostgresClusterStatus;

/// What the manager sees of its instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    pub data: DataState,
    /// The postmaster runs.
    pub running: bool,
    /// The data directory holds `standby.signal` (it was left as a standby's).
    pub standby_signal: bool,
    /// The role PostgreSQL reports (`Stopped` when it does not answer).
    pub role: PgRole,
    /// A running standby already streams from the primary the status names.
    pub follows_primary: bool,
    /// A running standby replayed WAL past the point where the primary's timeline forked
    /// off its own: it can never follow without pg_rewind.
    pub diverged: bool,
    /// A running standby that does not stream was told by the primary that it removed WAL
    /// the standby still needs: it can never catch up by streaming.
    pub upstream_wal_gone: bool,
    /// The postmaster crashed while primary less than the hold-off ago (`failoverDelay` +
    /// 10 s): the operator may be failing over, so it is not restarted as a primary yet.
    pub held_off: bool,
    /// The cluster is a replica cluster (`spec.replica` enabled): its primary is a
    /// designated primary, a standby of the outside source.
    pub replica_cluster: bool,
    /// A running designated primary already follows the source the spec names.
    pub follows_source: bool,
    /// The cluster's data came from an outside source (`status.replica` exists: it is or
    /// was a replica cluster): never initdb, even once promoted.
    pub cloned_from_source: bool,
}

/// The one role change of this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do until the status changes (no primary named, or nothing safe to do).
    Wait,
    /// Already as the status says.
    Keep,
    /// initdb: the cluster's first primary.
    BootstrapPrimary,
    /// Start existing primary data.
    StartPrimary,
    /// Start existing standby data, streaming from `primary`.
    StartStandby { primary: String },
    /// The status names this standby the primary.
    Promote,
    /// A replica cluster's first instance: clone the outside source, then follow it as
    /// the designated primary.
    CloneSource,
    /// Start existing standby data as the designated primary, following the source.
    StartDesignated,
    /// A running standby the status names the primary of a replica cluster: re-pointed at
    /// the source (a reload), never promoted.
    FollowSource,
    /// A running designated primary whose source removed WAL it still needs: cloned from
    /// the source afresh (it holds nothing of its own).
    RecloneSource,
    /// No usable data: clone `primary`.
    Clone { primary: String },
    /// A former primary: pg_rewind (or re-clone) onto `primary`, then stream from it.
    Rejoin { primary: String },
    /// A running standby switches to `primary`.
    Follow { primary: String },
    /// A running standby whose primary removed WAL it still needs: clone `primary` afresh.
    Reclone { primary: String },
    /// A running primary the status no longer names (switchover): checkpoint, clean
    /// shutdown (the standbys get all WAL), release the Lease, stay stopped until the new
    /// primary is confirmed (`currentPrimary`), then rejoin.
    StepDown,
}

impl Action {
    /// Whether the action runs PostgreSQL as a primary: only the Lease holder may.
    pub fn needs_lease(&self) -> bool {
        // A designated primary takes no writes, but the cluster's other instances follow
        // it and the operator fails it over like a primary: one at a time, by the Lease.
        matches!(
            self,
            Action::BootstrapPrimary
                | Action::StartPrimary
                | Action::Promote
                | Action::CloneSource
                | Action::StartDesignated
                | Action::FollowSource
                | Action::RecloneSource
        )
    }
}

/// The plan of one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub action: Action,
    /// The primary named by the status (target first), if any.
    pub primary: Option<String>,
    /// Replication slots to keep (only on the primary).
    pub slots: Vec<String>,
    /// The standbys for `synchronous_standby_names`, as they will be once this instance
    /// or another is the primary (set on standbys too, so a promotion starts with them).
    pub sync_standbys: Vec<String>,
}

pub fn plan(me: &str, status: &PostgresClusterStatus, observed: &Observed) -> Plan {
    let Some(primary) = status
        .target_primary
        .clone()
        .or_else(|| status.current_primary.clone())
    else {
        return Plan {
            action: Action::Wait,
            primary: None,
            slots: Vec::new(),
            sync_standbys: Vec::new(),
        };
    };
    let current = status.current_primary.as_deref();
    let others: Vec<String> = status
        .instances
        .iter()
        .map(|i| i.name.clone())
        .filter(|n| n != me)
        .collect();
    let usable = observed.data == DataState::Ready;
    if primary == me && observed.replica_cluster {
        let action = designated(me, current, observed);
        return Plan {
            action,
            primary: Some(primary),
            slots: others,
            // Cascading standbys are never synchronous (a standby does not wait for them).
            sync_standbys: Vec::new(),
        };
    }
    if primary == me {
        let action = if let DataState::OlderMajor(_) = observed.data {
            // The cluster's data, of an older major: never initdb over it, never start it.
            // It waits for an upgrade (the manager reports it on /pg/status).
            Action::Wait
        } else if !usable {
            // Another instance holds the cluster's data: initdb would fork a new cluster.
            // A cluster whose data is a source's is never initdb'd either.
            if current.is_none_or(|c| c == me) && !observed.cloned_from_source {
                Action::BootstrapPrimary
            } else {
                Action::Wait
            }
        } else if !observed.running {
            match current.filter(|c| *c != me) {
                Some(c) if observed.standby_signal => Action::StartStandby {
                    primary: c.to_string(),
                },
                _ if observed.held_off => Action::Wait,
                _ => Action::StartPrimary,
            }
        } else if observed.role.in_recovery() {
            // A standby, or a promoted replica cluster's designated primary.
            Action::Promote
        } else {
            Action::Keep
        };
        return Plan {
            action,
            primary: Some(primary),
            slots: others.clone(),
            sync_standbys: others,
        };
    }
    // A designated primary the status no longer names is a standby like any other.
    let role = match observed.role {
        PgRole::DesignatedPrimary => PgRole::Replica,
        role => role,
    };
    let action = if !usable {
        // Nothing, an interrupted bootstrap, or data of an older major (the primary was
        // upgraded in place): a standby clones the primary afresh.
        Action::Clone {
            primary: primary.clone(),
        }
    } else if !observed.running {
        if observed.standby_signal {
            Action::StartStandby {
                primary: primary.clone(),
            }
        } else if current == Some(primary.as_str()) {
            Action::Rejoin {
                primary: primary.clone(),
            }
        } else {
            // A former primary (stepped down, crashed, or restarted after losing its node)
            // while the change of primary is under way: rewinding onto a target that is not
            // the primary yet could not work; wait for it to be confirmed.
            Action::Wait
        }
    } else {
        match role {
            // Only once the new primary is confirmed (currentPrimary).
            PgRole::Primary if current == Some(primary.as_str()) => Action::Rejoin {
                primary: primary.clone(),
            },
            // A switchover under way: hand over cleanly first.
            PgRole::Primary => Action::StepDown,
            PgRole::Replica if observed.diverged && current == Some(primary.as_str()) => {
                Action::Rejoin {
                    primary: primary.clone(),
                }
            }
            PgRole::Replica
                if observed.upstream_wal_gone
                    && observed.follows_primary
                    && current == Some(primary.as_str()) =>
            {
                Action::Reclone {
                    primary: primary.clone(),
                }
            }
            PgRole::Replica if !observed.follows_primary => Action::Follow {
                primary: primary.clone(),
            },
            _ => Action::Keep,
        }
    };
    let mut sync_standbys: Vec<String> = others.into_iter().filter(|o| *o != primary).collect();
    sync_standbys.push(me.to_string());
    Plan {
        action,
        primary: Some(primary),
        slots: Vec::new(),
        sync_standbys,
    }
}

/// The action of the instance the status names the primary of a replica cluster: it
/// follows the source and is never promoted; a writable primary is left alone (demotion
/// is not built: the webhook refuses turning a cluster into a replica).
fn designated(me: &str, current: Option<&str>, observed: &Observed) -> Action {
    match observed.data {
        DataState::Ready => {}
        // As for a primary: never cloned over, never started, reported.
        DataState::OlderMajor(_) => return Action::Wait,
        // The first instance clones the source; a target without data waits (as a target
        // without data never initdbs while another instance is the current primary).
        _ if current.is_none_or(|c| c == me) => return Action::CloneSource,
        _ => return Action::Wait,
    }
    if !observed.running {
        return if observed.standby_signal {
            Action::StartDesignated
        } else {
            // A writable primary's data in a replica cluster: never started as one, never
            // thrown away.
            Action::Wait
        };
    }
    match observed.role {
        PgRole::Primary | PgRole::Stopped => Action::Wait,
        PgRole::DesignatedPrimary if observed.follows_source && observed.upstream_wal_gone => {
            Action::RecloneSource
        }
        PgRole::Replica | PgRole::DesignatedPrimary if observed.follows_source => Action::Keep,
        PgRole::Replica | PgRole::DesignatedPrimary => Action::FollowSource,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(yaml: &str) -> PostgresClusterStatus {
        serde_yaml::from_str(yaml).expect("status fixture")
    }

    const TWO: &str = "
targetPrimary: demo-1
currentPrimary: demo-1
instances: [{name: demo-1, serial: 1}, {name: demo-2, serial: 2}]
";

    fn observed(data: DataState, running: bool, signal: bool, role: PgRole) -> Observed {
        Observed {
            data,
            running,
            standby_signal: signal,
            role,
            follows_primary: true,
            diverged: false,
            upstream_wal_gone: false,
            held_off: false,
            replica_cluster: false,
            follows_source: false,
            cloned_from_source: false,
        }
    }

    const EMPTY: Observed = Observed {
        data: DataState::Missing,
        running: false,
        standby_signal: false,
        role: PgRole::Stopped,
        follows_primary: false,
        diverged: false,
        upstream_wal_gone: false,
        held_off: false,
        replica_cluster: false,
        follows_source: false,
        cloned_from_source: false,
    };

    #[test]
    fn without_a_named_primary_nothing_happens() {
        let plan = plan("demo-1", &status("{}"), &EMPTY);
        assert_eq!(plan.action, Action::Wait);
    }

    #[test]
    fn the_named_primary_initdbs_and_the_others_clone() {
        let s = status(TWO);
        let p = plan("demo-1", &s, &EMPTY);
        assert_eq!(p.action, Action::BootstrapPrimary);
        assert_eq!(p.slots, ["demo-2"]);
        let p = plan("demo-2", &s, &EMPTY);
        assert_eq!(
            p.action,
            Action::Clone {
                primary: "demo-1".into()
            }
        );
        assert_eq!(p.sync_standbys, ["demo-2"]);
        assert!(p.slots.is_empty());
    }

    #[test]
    fn a_target_without_data_never_initdbs_while_another_is_current() {
        let s = status("{targetPrimary: demo-2, currentPrimary: demo-1}");
        assert_eq!(plan("demo-2", &s, &EMPTY).action, Action::Wait);
    }

    #[test]
    fn a_running_standby_named_primary_promotes() {
        let s = status("{targetPrimary: demo-2, currentPrimary: demo-1}");
        let o = observed(DataState::Ready, true, false, PgRole::Replica);
        assert_eq!(plan("demo-2", &s, &o).action, Action::Promote);
        // Stopped with standby data: start as a standby of the current primary first.
        let o = observed(DataState::Ready, false, true, PgRole::Stopped);
        assert_eq!(
            plan("demo-2", &s, &o).action,
            Action::StartStandby {
                primary: "demo-1".into()
            }
        );
    }

    #[test]
    fn an_old_primary_steps_down_waits_and_rejoins_only_once_the_new_one_is_current() {
        let switching = status("{targetPrimary: demo-2, currentPrimary: demo-1}");
        let done = status("{targetPrimary: demo-2, currentPrimary: demo-2}");
        // Running as primary while another is the target: hand over cleanly.
        let o = observed(DataState::Ready, true, false, PgRole::Primary);
        assert_eq!(plan("demo-1", &switching, &o).action, Action::StepDown);
        assert_eq!(
            plan("demo-1", &done, &o).action,
            Action::Rejoin {
                primary: "demo-2".into()
            }
        );
        // Stepped down (or restarted after losing its node): primary data, not running.
        let o = observed(DataState::Ready, false, false, PgRole::Stopped);
        assert_eq!(plan("demo-1", &switching, &o).action, Action::Wait);
        let failing = status("{targetPrimary: demo-2}");
        assert_eq!(plan("demo-1", &failing, &o).action, Action::Wait);
        assert_eq!(
            plan("demo-1", &done, &o).action,
            Action::Rejoin {
                primary: "demo-2".into()
            }
        );
        // A third instance meanwhile keeps streaming, and is never asked to step down.
        let o = observed(DataState::Ready, true, true, PgRole::Replica);
        assert_eq!(plan("demo-3", &switching, &o).action, Action::Keep);
    }

    #[test]
    fn only_the_lease_holder_runs_as_primary() {
        let s = status(TWO);
        let starts = [
            plan("demo-1", &s, &EMPTY).action,
            plan(
                "demo-1",
                &s,
                &observed(DataState::Ready, false, false, PgRole::Stopped),
            )
            .action,
            plan(
                "demo-2",
                &status("{targetPrimary: demo-2, currentPrimary: demo-1}"),
                &observed(DataState::Ready, true, true, PgRole::Replica),
            )
            .action,
        ];
        assert_eq!(
            starts,
            [
                Action::BootstrapPrimary,
                Action::StartPrimary,
                Action::Promote
            ]
        );
        assert!(starts.iter().all(Action::needs_lease));
        let others = [
            Action::Wait,
            Action::Keep,
            Action::StepDown,
            Action::StartStandby {
                primary: "demo-1".into(),
            },
            Action::Clone {
                primary: "demo-1".into(),
            },
            Action::Rejoin {
                primary: "demo-1".into(),
            },
            Action::Follow {
                primary: "demo-1".into(),
            },
        ];
        assert!(!others.iter().any(Action::needs_lease));
    }

    #[test]
    fn a_crashed_primary_is_held_off_then_restarts_if_still_named() {
        let s = status(TWO);
        let mut o = observed(DataState::Ready, false, false, PgRole::Stopped);
        o.held_off = true;
        assert_eq!(plan("demo-1", &s, &o).action, Action::Wait);
        o.held_off = false;
        assert_eq!(plan("demo-1", &s, &o).action, Action::StartPrimary);
        // Meanwhile the operator chose another: it waits, then rejoins as usual.
        o.held_off = true;
        let failing = status("{targetPrimary: demo-2, currentPrimary: demo-1}");
        assert_eq!(plan("demo-1", &failing, &o).action, Action::Wait);
    }

    #[test]
    fn a_standby_follows_a_new_primary_and_interrupted_clones_are_redone() {
        let s = status("{targetPrimary: demo-2, currentPrimary: demo-2}");
        let mut o = observed(DataState::Ready, true, true, PgRole::Replica);
        assert_eq!(plan("demo-3", &s, &o).action, Action::Keep);
        o.follows_primary = false;
        assert_eq!(
            plan("demo-3", &s, &o).action,
            Action::Follow {
                primary: "demo-2".into()
            }
        );
        let o = observed(DataState::Incomplete, false, false, PgRole::Stopped);
        assert_eq!(
            plan("demo-3", &s, &o).action,
            Action::Clone {
                primary: "demo-2".into()
            }
        );
    }

    #[test]
    fn a_standby_that_diverged_from_the_confirmed_primary_rejoins_by_rewind() {
        let done = status("{targetPrimary: demo-2, currentPrimary: demo-2}");
        let mut o = observed(DataState::Ready, true, true, PgRole::Replica);
        o.diverged = true;
        assert_eq!(
            plan("demo-3", &done, &o).action,
            Action::Rejoin {
                primary: "demo-2".into()
            }
        );
        // Not while the new primary is still only the target: it may not have promoted.
        let failing = status("{targetPrimary: demo-2, currentPrimary: demo-1}");
        assert_eq!(plan("demo-3", &failing, &o).action, Action::Keep);
        // The primary itself never rewinds.
        assert_eq!(plan("demo-2", &done, &o).action, Action::Promote);
    }

    #[test]
    fn a_standby_whose_primary_removed_wal_it_needs_is_recloned_from_the_confirmed_primary() {
        let done = status("{targetPrimary: demo-2, currentPrimary: demo-2}");
        let mut o = observed(DataState::Ready, true, true, PgRole::Replica);
        o.upstream_wal_gone = true;
        assert_eq!(
            plan("demo-3", &done, &o).action,
            Action::Reclone {
                primary: "demo-2".into()
            }
        );
        // Diverged as well: a rewind first (which clones afresh when it cannot work).
        o.diverged = true;
        assert_eq!(
            plan("demo-3", &done, &o).action,
            Action::Rejoin {
                primary: "demo-2".into()
            }
        );
        o.diverged = false;
        // Not while a change of primary is under way: the new one may have that WAL.
        let failing = status("{targetPrimary: demo-2, currentPrimary: demo-1}");
        assert_eq!(plan("demo-3", &failing, &o).action, Action::Keep);
        // Not what a standby told so by another upstream does: it follows the primary.
        o.follows_primary = false;
        assert_eq!(
            plan("demo-3", &done, &o).action,
            Action::Follow {
                primary: "demo-2".into()
            }
        );
    }

    #[test]
    fn a_standby_with_data_of_an_older_major_reclones_from_the_upgraded_primary() {
        let s = status(TWO);
        for running in [false, true] {
            let o = observed(DataState::OlderMajor(15), running, true, PgRole::Stopped);
            assert_eq!(
                plan("demo-2", &s, &o).action,
                Action::Clone {
                    primary: "demo-1".into()
                }
            );
        }
    }

    #[test]
    fn the_primary_with_data_of_an_older_major_never_initdbs_nor_starts_it() {
        let stale = observed(DataState::OlderMajor(15), false, false, PgRole::Stopped);
        for s in [
            status(TWO),
            status("{targetPrimary: demo-1}"),
            status("{targetPrimary: demo-1, currentPrimary: demo-2}"),
        ] {
            let p = plan("demo-1", &s, &stale);
            assert_eq!(p.action, Action::Wait);
            assert!(!p.action.needs_lease());
        }
        // Once upgraded (the binaries' major), it starts as usual.
        let upgraded = observed(DataState::Ready, false, false, PgRole::Stopped);
        assert_eq!(
            plan("demo-1", &status(TWO), &upgraded).action,
            Action::StartPrimary
        );
    }

    fn replica(mut o: Observed) -> Observed {
        o.replica_cluster = true;
        o
    }

    #[test]
    fn a_replica_clusters_primary_clones_and_follows_the_source_and_never_promotes() {
        let s = status(TWO);
        let p = plan("demo-1", &s, &replica(EMPTY));
        assert_eq!(p.action, Action::CloneSource);
        assert!(p.action.needs_lease());
        // Its standbys get slots on it, and none of them is synchronous.
        assert_eq!(p.slots, ["demo-2"]);
        assert!(p.sync_standbys.is_empty());
        // The other instances clone it as they would a primary (cascading).
        assert_eq!(
            plan("demo-2", &s, &replica(EMPTY)).action,
            Action::Clone {
                primary: "demo-1".into()
            }
        );
        // Standby data, stopped: started as the designated primary.
        let stopped = replica(observed(DataState::Ready, false, true, PgRole::Stopped));
        assert_eq!(plan("demo-1", &s, &stopped).action, Action::StartDesignated);
        // Running, following the source: kept; following anything else: re-pointed.
        let mut o = replica(observed(
            DataState::Ready,
            true,
            true,
            PgRole::DesignatedPrimary,
        ));
        o.follows_source = true;
        assert_eq!(plan("demo-1", &s, &o).action, Action::Keep);
        o.follows_source = false;
        assert_eq!(plan("demo-1", &s, &o).action, Action::FollowSource);
        // Its source removed WAL it needs (confirmed): cloned afresh, by the Lease holder.
        o.follows_source = true;
        o.upstream_wal_gone = true;
        let p = plan("demo-1", &s, &o);
        assert_eq!(p.action, Action::RecloneSource);
        assert!(p.action.needs_lease());
    }

    #[test]
    fn a_replica_clusters_failover_repoints_a_standby_at_the_source() {
        let failing = status("{targetPrimary: demo-2, currentPrimary: demo-1}");
        let standby = replica(observed(DataState::Ready, true, true, PgRole::Replica));
        let p = plan("demo-2", &failing, &standby);
        assert_eq!(p.action, Action::FollowSource);
        assert!(p.action.needs_lease());
        // Never initdb, never a clone over another's data while it is current.
        assert_eq!(
            plan("demo-2", &failing, &replica(EMPTY)).action,
            Action::Wait
        );
        // The former designated primary, back, follows the new one like any standby.
        let done = status("{targetPrimary: demo-2, currentPrimary: demo-2}");
        let mut old = replica(observed(
            DataState::Ready,
            true,
            true,
            PgRole::DesignatedPrimary,
        ));
        old.follows_primary = false;
        assert_eq!(
            plan("demo-1", &done, &old).action,
            Action::Follow {
                primary: "demo-2".into()
            }
        );
    }

    #[test]
    fn a_promoted_replica_clusters_designated_primary_is_promoted_and_never_initdbs() {
        let s = status(TWO);
        let mut o = observed(DataState::Ready, true, true, PgRole::DesignatedPrimary);
        o.cloned_from_source = true;
        let p = plan("demo-1", &s, &o);
        assert_eq!(p.action, Action::Promote);
        assert!(p.action.needs_lease());
        let mut empty = EMPTY;
        empty.cloned_from_source = true;
        assert_eq!(plan("demo-1", &s, &empty).action, Action::Wait);
        // Its standbys follow it as they did.
        let standby = observed(DataState::Ready, true, true, PgRole::Replica);
        assert_eq!(plan("demo-2", &s, &standby).action, Action::Keep);
    }

    #[test]
    fn a_writable_primary_in_a_replica_cluster_is_left_alone() {
        let s = status(TWO);
        for o in [
            observed(DataState::Ready, true, false, PgRole::Primary),
            observed(DataState::Ready, false, false, PgRole::Stopped),
            observed(DataState::OlderMajor(15), false, true, PgRole::Stopped),
        ] {
            assert_eq!(plan("demo-1", &s, &replica(o)).action, Action::Wait);
        }
    }
}
