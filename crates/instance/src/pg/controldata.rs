//! pg_controldata's report of a data directory, as `field: value` pairs, read in one place
//! for everything that needs the control file: the hot-standby floors of a standby's start
//! (`instance::floors`), whether a primary was shut down (`Instance::crashed_as_primary`),
//! and the major upgrade's checks and timeline step (`crate::upgrade`).

use super::binaries::{self, Binaries, RunAs};
use std::path::Path;

/// The fields pg_controldata printed, in its order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControlData {
    fields: Vec<(String, String)>,
}

impl ControlData {
    /// Runs `binaries`' pg_controldata on `pgdata` as `run_as`.
    pub async fn read(
        binaries: &Binaries,
        run_as: Option<RunAs>,
        pgdata: &Path,
    ) -> Result<Self, crate::bootstrap::Error> {
        let mut cmd = binaries::command(binaries, "pg_controldata", run_as);
        cmd.arg("-D").arg(pgdata);
        let out = crate::bootstrap::run("pg_controldata", cmd).await?;
        Ok(Self::parse(&String::from_utf8_lossy(&out.stdout)))
    }

    /// pg_controldata's `output`: each line `label: value`, both trimmed.
    pub fn parse(output: &str) -> Self {
        Self {
            fields: output
                .lines()
                .filter_map(|line| line.split_once(':'))
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .collect(),
        }
    }

    /// The value of the field labelled `label` (without the colon).
    pub fn field(&self, label: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == label)
            .map(|(_, v)| v.as_str())
    }

    /// `Database cluster state`: `shut down`, `in production`, `in archive recovery`, ...
    pub fn state(&self) -> Option<&str> {
        self.field("Database cluster state")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_values_are_trimmed_and_a_value_may_hold_colons() {
        let c = ControlData::parse(
            "pg_control version number:            1300\n\
             Database cluster state:               in production\n\
             pg_control last modified:             Fri 04 Dec 2026 10:00:00 AM UTC\n\
             max_connections setting:              150\n",
        );
        assert_eq!(c.field("pg_control version number"), Some("1300"));
        assert_eq!(c.state(), Some("in production"));
        assert_eq!(
            c.field("pg_control last modified"),
            Some("Fri 04 Dec 2026 10:00:00 AM UTC")
        );
        assert_eq!(c.field("max_connections setting"), Some("150"));
        assert_eq!(c.field("missing"), None);
        assert_eq!(ControlData::parse("").state(), None);
    }
}
