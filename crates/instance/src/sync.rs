//! Synchronous replication: `synchronous_standby_names = 'ANY n (...)'` from the spec and
//! the current standbys. With `dataDurability: required` it must never weaken the quorum
//! because standbys are missing (commits then wait); with `preferred` it lowers `n` to the
//! standbys actually streaming, so the primary stays writable.

use pgop_api::cluster::DataDurability;

/// What the spec asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncSpec {
    /// How many standbys must confirm a commit (0: asynchronous replication).
    pub synchronous: u32,
    pub durability: DataDurability,
}

impl SyncSpec {
    /// Asynchronous replication.
    pub const ASYNC: Self = Self {
        synchronous: 0,
        durability: DataDurability::Preferred,
    };
}

/// `synchronous_standby_names` for `standbys` (all the cluster's standbys by instance name)
/// of which `streaming` are connected now.
pub fn standby_names(spec: SyncSpec, standbys: &[String], streaming: &[String]) -> String {
    if spec.synchronous == 0 {
        return String::new();
    }
    let (n, names): (u32, Vec<&String>) = match spec.durability {
        DataDurability::Required => (spec.synchronous, standbys.iter().collect()),
        DataDurability::Preferred => {
            let live: Vec<&String> = standbys.iter().filter(|s| streaming.contains(s)).collect();
            (spec.synchronous.min(live.len() as u32), live)
        }
    };
    if n == 0 {
        return String::new();
    }
    if names.is_empty() {
        // Required with no standby known yet: any standby that connects may confirm.
        return format!("ANY {n} (*)");
    }
    let quoted: Vec<String> = names
        .iter()
        .map(|s| format!("\"{}\"", s.replace('"', "")))
        .collect();
    format!("ANY {n} ({})", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn required_keeps_the_quorum_when_standbys_are_missing() {
        let spec = SyncSpec {
            synchronous: 1,
            durability: DataDurability::Required,
        };
        assert_eq!(
            standby_names(spec, &names(&["a", "b"]), &[]),
            "ANY 1 (\"a\", \"b\")"
        );
        assert_eq!(standby_names(spec, &[], &[]), "ANY 1 (*)");
    }

    #[test]
    fn preferred_follows_the_streaming_standbys() {
        let spec = SyncSpec {
            synchronous: 2,
            durability: DataDurability::Preferred,
        };
        assert_eq!(
            standby_names(spec, &names(&["a", "b"]), &names(&["b"])),
            "ANY 1 (\"b\")"
        );
        assert_eq!(standby_names(spec, &names(&["a"]), &[]), "");
        assert_eq!(
            standby_names(SyncSpec::ASYNC, &names(&["a"]), &names(&["a"])),
            ""
        );
    }
}
