//! A standby's start with at least its primary's values of the parameters a hot standby
//! needs at least as high (read from pg_controldata).

use crate::pg::ControlData;
use std::collections::BTreeMap;

/// The parameters a hot standby needs at least at its primary's value, by pg_controldata's
/// label, and PostgreSQL's defaults.
const STANDBY_FLOORS: &[(&str, &str, i64)] = &[
    ("max_connections setting", "max_connections", 100),
    ("max_worker_processes setting", "max_worker_processes", 8),
    ("max_prepared_xacts setting", "max_prepared_transactions", 0),
    (
        "max_locks_per_xact setting",
        "max_locks_per_transaction",
        64,
    ),
];

/// The floors in the control file's report.
pub(super) fn controldata_floors(control: &ControlData) -> BTreeMap<String, i64> {
    STANDBY_FLOORS
        .iter()
        .filter_map(|(label, name, _)| {
            let value = control.field(label)?.parse::<i64>().ok()?;
            Some(((*name).to_string(), value))
        })
        .collect()
}

/// `parameters` with each floored parameter raised to its floor where the spec's value
/// (or PostgreSQL's default) is lower.
pub(super) fn with_floors(
    parameters: &BTreeMap<String, String>,
    floors: &BTreeMap<String, i64>,
) -> BTreeMap<String, String> {
    let mut out = parameters.clone();
    for (_, name, default) in STANDBY_FLOORS {
        let Some(floor) = floors.get(*name) else {
            continue;
        };
        let key = parameters
            .keys()
            .find(|k| k.eq_ignore_ascii_case(name))
            .cloned()
            .unwrap_or_else(|| (*name).to_string());
        let current = match parameters.get(&key) {
            Some(v) => match v.trim().parse::<i64>() {
                Ok(v) => v,
                Err(_) => continue,
            },
            None => *default,
        };
        if *floor > current {
            out.insert(key, floor.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_starts_with_at_least_its_primarys_hot_standby_values() {
        let out = "max_connections setting:              150\nmax_worker_processes setting:         8\nmax_wal_senders setting:              10\nmax_prepared_xacts setting:           0\nmax_locks_per_xact setting:           64\n";
        let floors = controldata_floors(&ControlData::parse(out));
        assert_eq!(floors.get("max_connections"), Some(&150));
        assert_eq!(floors.len(), 4);
        let spec = BTreeMap::from([
            ("max_connections".to_string(), "120".to_string()),
            ("work_mem".to_string(), "8MB".to_string()),
        ]);
        let floored = with_floors(&spec, &floors);
        assert_eq!(floored["max_connections"], "150");
        assert_eq!(floored["work_mem"], "8MB");
        assert!(
            !floored.contains_key("max_worker_processes"),
            "at the default already"
        );
        let higher = BTreeMap::from([("max_connections".to_string(), "200".to_string())]);
        assert_eq!(with_floors(&higher, &floors)["max_connections"], "200");
        assert_eq!(
            with_floors(&BTreeMap::new(), &floors)["max_connections"],
            "150"
        );
    }
}
