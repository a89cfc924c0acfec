//! Why an instance is not ready (`down` on `/pg/status`), decided from what the manager
//! knows: the status it is about to serve, PostgreSQL's last words at its last failed
//! start, and the parameters that start changed since the last one that succeeded. Pure.

use pgop_api::instance_status::{
    Down, DownReason, MAX_DOWN_MESSAGE, PgRole, PgStatus, VolumeUsage, printable,
};

/// What the manager remembers of the last failed start (cleared by a start that succeeds).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Failure {
    /// PostgreSQL's last error lines, or the manager's error.
    pub words: Option<String>,
    /// The primary no longer has the WAL this standby needs.
    pub wal_gone: bool,
    /// The parameters whose values at the failed start differ from those of the last
    /// start that succeeded (a restart for them left the instance down).
    pub changed_parameters: Vec<String>,
}

/// A volume with less than this free is full: PostgreSQL cannot write a WAL segment's
/// worth.
const FULL_BELOW_BYTES: u64 = 1024 * 1024;

/// PostgreSQL's words for a write refused for want of space.
const NO_SPACE: [&str; 3] = [
    "No space left on device",
    "Check free disk space",
    "could not extend file",
];

fn full(volume: Option<&VolumeUsage>) -> bool {
    volume.is_some_and(|v| v.capacity_bytes > 0 && v.available_bytes < FULL_BELOW_BYTES)
}

/// Why `status`'s instance is not ready, or `None` when it is ready (or stopped on
/// purpose: fenced, or not yet started with nothing failed). `since` is not set here.
pub fn decide(status: &PgStatus, failure: &Failure) -> Option<Down> {
    let down = |reason, message: String, parameters: Vec<String>| {
        Some(Down {
            reason,
            message: printable(&message, MAX_DOWN_MESSAGE),
            parameters,
            since: None,
        })
    };
    if let Some(error) = &status.major_upgrade_error {
        return down(DownReason::MajorUpgradeFailed, error.clone(), Vec::new());
    }
    if let Some(error) = &status.bootstrap_error {
        return down(DownReason::BootstrapFailed, error.clone(), Vec::new());
    }
    match status.role {
        PgRole::Primary => None,
        // Serves reads whether or not its source answers (reported in `streaming`).
        PgRole::DesignatedPrimary => None,
        PgRole::Replica if status.streaming => None,
        PgRole::Stopped if status.fenced => None,
        role => {
            let words = failure.words.as_deref().map(without_prefixes);
            if role == PgRole::Stopped && failure.wal_gone {
                let words = words.unwrap_or_else(|| {
                    "the primary no longer has the WAL this standby needs".into()
                });
                return down(DownReason::WalGone, words, Vec::new());
            }
            // A full volume first: a standby that cannot write the WAL it receives stops
            // streaming, crashes, restarts, and stops streaming again; named the same
            // throughout.
            let wal_full = full(status.wal_volume.as_ref());
            if wal_full || full(status.volume.as_ref()) {
                let (reason, which, volume) = if wal_full {
                    (DownReason::WalVolumeFull, "WAL", status.wal_volume)
                } else {
                    (DownReason::VolumeFull, "data", status.volume)
                };
                // No byte counts: the words stay the same while the volume stays full.
                let usage = volume
                    .map(|v| {
                        format!(
                            "the {which} volume is full (less than 1 MiB of {} MiB free)",
                            v.capacity_bytes >> 20
                        )
                    })
                    .unwrap_or_default();
                let message = match words {
                    Some(w) if role == PgRole::Stopped => format!("{usage}: {w}"),
                    _ => usage,
                };
                return down(reason, message, Vec::new());
            }
            if role == PgRole::Replica {
                return down(
                    DownReason::NotStreaming,
                    "PostgreSQL runs as a standby but does not stream from the primary".into(),
                    Vec::new(),
                );
            }
            let words = words?;
            if NO_SPACE.iter().any(|n| words.contains(n)) {
                return down(DownReason::VolumeFull, words, Vec::new());
            }
            down(
                DownReason::StartFailed,
                words,
                failure.changed_parameters.clone(),
            )
        }
    }
}

/// The names of the parameters set, unset or changed from `before` to `after`, sorted.
pub fn changed(
    before: &std::collections::BTreeMap<String, String>,
    after: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    let mut names: Vec<String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .cloned()
        .collect();
    names.sort();
    names.dedup();
    names
}

/// PostgreSQL's log lines without their `log_line_prefix` (the time and the process id,
/// which differ at every attempt): each line from its severity on ("FATAL:  ..."), lines
/// joined by newlines.
pub fn without_prefixes(words: &str) -> String {
    const SEVERITIES: [&str; 9] = [
        "PANIC:",
        "FATAL:",
        "ERROR:",
        "WARNING:",
        "LOG:",
        "DETAIL:",
        "HINT:",
        "CONTEXT:",
        "STATEMENT:",
    ];
    words
        .lines()
        .map(|line| {
            let at = SEVERITIES.iter().filter_map(|s| line.find(s)).min();
            match at {
                Some(at) => line[at..].trim_end(),
                None => line.trim_end(),
            }
        })
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped() -> PgStatus {
        PgStatus::stopped("main-2", false)
    }

    fn failed(words: &str, parameters: &[&str]) -> Failure {
        Failure {
            words: Some(words.into()),
            wal_gone: false,
            changed_parameters: parameters.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn a_start_failed_after_a_restart_names_the_parameters_and_postgresqls_words() {
        let words = "2026-12-06 02:00:00.123 UTC [4242] FATAL:  could not map anonymous shared memory: Cannot allocate memory\n2026-12-06 02:00:00.123 UTC [4242] HINT:  This error usually means ...\n2026-12-06 02:00:00.124 UTC [4242] LOG:  database system is shut down";
        let down = decide(&stopped(), &failed(words, &["huge_pages"])).expect("down");
        assert_eq!(down.reason, DownReason::StartFailed);
        assert_eq!(down.parameters, vec!["huge_pages".to_string()]);
        assert_eq!(
            down.message,
            "FATAL:  could not map anonymous shared memory: Cannot allocate memory | HINT:  \
             This error usually means ... | LOG:  database system is shut down"
        );
        assert!(down.cannot_start_with_parameters());
        // The same failure at another time and process reads the same.
        let again = words
            .replace("[4242]", "[4343]")
            .replace("02:00:00", "02:00:05");
        assert_eq!(
            decide(&stopped(), &failed(&again, &["huge_pages"])),
            Some(down)
        );
    }

    #[test]
    fn a_full_volume_is_named_from_the_volume_or_from_postgresqls_words() {
        let mut status = stopped();
        status.volume = Some(VolumeUsage {
            capacity_bytes: 64 << 20,
            used_bytes: 64 << 20,
            available_bytes: 0,
        });
        let down = decide(
            &status,
            &failed(
                "PANIC:  could not write to file \"pg_wal/xlogtemp.42\": No space left on device",
                &[],
            ),
        )
        .expect("down");
        assert_eq!(down.reason, DownReason::VolumeFull);
        assert!(
            down.message
                .starts_with("the data volume is full (less than 1 MiB of 64 MiB free): PANIC:"),
            "{}",
            down.message
        );
        // Full by the words alone (the volume freed meanwhile: the words stay until a start).
        let down = decide(&stopped(), &failed("FATAL:  could not write to file \"x\": wrote only 4096 of 8192 bytes at offset 0\nHINT:  Check free disk space.", &[])).expect("down");
        assert_eq!(down.reason, DownReason::VolumeFull);
        // The WAL volume.
        let mut status = stopped();
        status.wal_volume = Some(VolumeUsage {
            capacity_bytes: 32 << 20,
            used_bytes: 32 << 20,
            available_bytes: 4096,
        });
        let down = decide(&status, &Failure::default()).expect("down");
        assert_eq!(down.reason, DownReason::WalVolumeFull);
        assert!(down.parameters.is_empty());
    }

    #[test]
    fn the_managers_own_errors_come_first() {
        let mut status = stopped();
        status.bootstrap_error = Some("restore: object 0000000100000000000000A1 is corrupt".into());
        let down = decide(&status, &failed("FATAL:  x", &["work_mem"])).expect("down");
        assert_eq!(down.reason, DownReason::BootstrapFailed);
        assert!(!down.cannot_start_with_parameters());
        status.major_upgrade_error = Some("pg_upgrade failed".into());
        assert_eq!(
            decide(&status, &Failure::default()).map(|d| d.reason),
            Some(DownReason::MajorUpgradeFailed)
        );
        let gone = Failure {
            words: None,
            wal_gone: true,
            changed_parameters: Vec::new(),
        };
        assert_eq!(
            decide(&stopped(), &gone).map(|d| d.reason),
            Some(DownReason::WalGone)
        );
    }

    #[test]
    fn the_parameters_named_are_those_changed_since_the_last_good_start() {
        let map = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let good = map(&[("work_mem", "4MB"), ("huge_pages", "try")]);
        let bad = map(&[
            ("work_mem", "4MB"),
            ("huge_pages", "on"),
            ("shared_preload_libraries", "/x"),
        ]);
        assert_eq!(
            changed(&good, &bad),
            vec!["huge_pages", "shared_preload_libraries"]
        );
        assert!(changed(&good, &good).is_empty());
        assert_eq!(
            changed(&bad, &good),
            vec!["huge_pages", "shared_preload_libraries"]
        );
    }

    #[test]
    fn ready_fenced_or_never_failed_instances_are_not_down() {
        assert_eq!(decide(&stopped(), &Failure::default()), None);
        let mut fenced = stopped();
        fenced.fenced = true;
        assert_eq!(decide(&fenced, &failed("FATAL:  x", &[])), None);
        let mut primary = stopped();
        primary.role = PgRole::Primary;
        primary.running = true;
        assert_eq!(decide(&primary, &failed("FATAL:  x", &[])), None);
        let mut standby = primary.clone();
        standby.role = PgRole::Replica;
        standby.streaming = true;
        assert_eq!(decide(&standby, &Failure::default()), None);
        standby.streaming = false;
        assert_eq!(
            decide(&standby, &Failure::default()).map(|d| d.reason),
            Some(DownReason::NotStreaming)
        );
        // A standby that stopped streaming because its volume is full says so.
        standby.volume = Some(VolumeUsage {
            capacity_bytes: 64 << 20,
            used_bytes: 64 << 20,
            available_bytes: 0,
        });
        assert_eq!(
            decide(&standby, &Failure::default()).map(|d| d.reason),
            Some(DownReason::VolumeFull)
        );
    }

    #[test]
    fn control_characters_in_postgresqls_words_are_escaped_and_the_message_is_bounded() {
        let words = format!("FATAL:  bad value \"\u{1b}[2J{}\"", "x".repeat(4000));
        let down = decide(&stopped(), &failed(&words, &["search_path"])).expect("down");
        assert!(down.message.len() <= MAX_DOWN_MESSAGE);
        assert!(
            !down.message.chars().any(char::is_control),
            "{}",
            down.message
        );
        assert!(down.message.contains("\\u{1b}[2J"));
    }
}
