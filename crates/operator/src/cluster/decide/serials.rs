//! Which instances a cluster should have: pure planning over serials.
//!
//! An instance is `<cluster>-<serial>`, its Pod and PVC share that name. Serials only
//! grow (the next one is kept in `status.nextSerial`), so a name is never reused and a
//! new instance never meets an old instance's leftovers. Scaling down removes the
//! highest serial that is not the primary.

use std::collections::BTreeSet;

/// The instance set after planning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Serials to keep or create, ascending.
    pub serials: Vec<i32>,
    /// Serials that exist but are no longer wanted.
    pub remove: Vec<i32>,
    /// The serial of the primary.
    pub primary: i32,
    /// The first serial never used, to persist in `status.nextSerial`.
    pub next_serial: i32,
}

impl Plan {
    pub fn created(&self, existing: &BTreeSet<i32>) -> Vec<i32> {
        self.serials
            .iter()
            .copied()
            .filter(|s| !existing.contains(s))
            .collect()
    }
}

/// The name of instance `serial` of `cluster`.
pub fn instance_name(cluster: &str, serial: i32) -> String {
    format!("{cluster}-{serial}")
}

/// The serial of an instance name of `cluster`, if it is one.
pub fn serial_of(cluster: &str, name: &str) -> Option<i32> {
    let rest = name.strip_prefix(cluster)?.strip_prefix('-')?;
    if rest.starts_with('0') || rest.starts_with('+') {
        return None;
    }
    rest.parse::<i32>().ok().filter(|s| *s > 0)
}

/// Plans `replicas` instances from the `existing` serials.
///
/// - `next_serial` comes from the status; it is raised past every existing serial, so a
///   status lost or reset cannot make a serial come back.
/// - `primary` is the current primary's serial if that instance still exists; otherwise
///   the lowest existing serial, or the first new one for a new cluster.
pub fn plan(
    replicas: i32,
    existing: &BTreeSet<i32>,
    next_serial: i32,
    current_primary: Option<i32>,
) -> Plan {
    let replicas = usize::try_from(replicas.max(1)).unwrap_or(1);
    let mut next = next_serial.max(1);
    if let Some(max) = existing.iter().next_back() {
        next = next.max(max + 1);
    }
    let primary = current_primary
        .filter(|p| existing.contains(p))
        .or_else(|| existing.iter().next().copied());
    let mut serials: Vec<i32> = existing.iter().copied().collect();
    let mut remove = Vec::new();
    while serials.len() > replicas {
        // The highest serial that is not the primary goes first.
        let Some(pos) = serials.iter().rposition(|s| Some(*s) != primary) else {
            break;
        };
        remove.push(serials.remove(pos));
    }
    while serials.len() < replicas {
        serials.push(next);
        next += 1;
    }
    let primary = primary.unwrap_or(serials[0]);
    remove.sort_unstable();
    Plan {
        serials,
        remove,
        primary,
        next_serial: next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &[i32]) -> BTreeSet<i32> {
        s.iter().copied().collect()
    }

    #[test]
    fn a_new_cluster_starts_at_serial_one_with_the_first_as_primary() {
        let p = plan(3, &set(&[]), 1, None);
        assert_eq!(p.serials, vec![1, 2, 3]);
        assert_eq!(p.primary, 1);
        assert_eq!(p.next_serial, 4);
        assert!(p.remove.is_empty());
    }

    #[test]
    fn scaling_up_uses_new_serials_never_old_ones() {
        // Serial 2 was removed earlier; status remembers 4 as next.
        let p = plan(3, &set(&[1, 3]), 4, Some(1));
        assert_eq!(p.serials, vec![1, 3, 4]);
        assert_eq!(p.created(&set(&[1, 3])), vec![4]);
        assert_eq!(p.next_serial, 5);
    }

    #[test]
    fn a_lost_next_serial_is_raised_past_existing_instances() {
        let p = plan(3, &set(&[5, 6]), 1, Some(5));
        assert_eq!(p.serials, vec![5, 6, 7]);
    }

    #[test]
    fn scaling_down_removes_the_highest_serial_that_is_not_the_primary() {
        let p = plan(2, &set(&[1, 2, 3]), 4, Some(3));
        assert_eq!(p.serials, vec![1, 3]);
        assert_eq!(p.remove, vec![2]);
        assert_eq!(p.primary, 3);
        let p = plan(1, &set(&[1, 2, 3]), 4, Some(1));
        assert_eq!(p.serials, vec![1]);
        assert_eq!(p.remove, vec![2, 3]);
    }

    #[test]
    fn a_vanished_primary_falls_back_to_the_lowest_existing_serial() {
        let p = plan(2, &set(&[2, 3]), 4, Some(1));
        assert_eq!(p.primary, 2);
    }

    #[test]
    fn serials_are_parsed_only_from_this_clusters_names() {
        assert_eq!(serial_of("main", "main-3"), Some(3));
        assert_eq!(serial_of("main", "main-03"), None);
        assert_eq!(serial_of("main", "main-rw"), None);
        assert_eq!(serial_of("main", "main-x-3"), None);
        assert_eq!(serial_of("main", "mainx-3"), None);
        assert_eq!(serial_of("main", "main-0"), None);
    }
}
