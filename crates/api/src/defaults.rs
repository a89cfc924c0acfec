//! Defaults that the schema cannot express.
//!
//! Simple defaults (`replicas: 1`, `retentionDays: 30`, ...) are schema defaults, applied
//! by the API server and by serde alike. What is left here depends on other fields, or
//! would clash with a CEL rule as a schema default (a defaulted `bootstrap.initdb` would
//! make every `bootstrap.recovery` invalid).

use crate::cluster::{BootstrapSpec, InitdbSpec, PostgresClusterSpec};

/// Time zone of backup schedules when `spec.backup.timezone` is unset.
pub const DEFAULT_TIMEZONE: &str = "UTC";

/// The spec with every default filled in. Idempotent; never changes a field the user set.
pub fn with_defaults(mut spec: PostgresClusterSpec) -> PostgresClusterSpec {
    apply_defaults(&mut spec);
    spec
}

/// Fills in the defaults of [`with_defaults`] in place.
pub fn apply_defaults(spec: &mut PostgresClusterSpec) {
    let bootstrap = spec.bootstrap.get_or_insert(BootstrapSpec {
        initdb: None,
        recovery: None,
    });
    if bootstrap.initdb.is_none() && bootstrap.recovery.is_none() {
        bootstrap.initdb = Some(InitdbSpec::default());
    }
    if let Some(backup) = &mut spec.backup
        && backup.timezone.is_none()
    {
        backup.timezone = Some(DEFAULT_TIMEZONE.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate;

    fn spec(yaml: &str) -> PostgresClusterSpec {
        serde_yaml::from_str(yaml).expect("test spec parses")
    }

    #[test]
    fn a_cluster_without_bootstrap_gets_initdb_app_app() {
        let s = with_defaults(spec("storage: {size: 1Gi}"));
        let initdb = s.bootstrap.and_then(|b| b.initdb);
        assert_eq!(
            initdb,
            Some(InitdbSpec {
                database: "app".into(),
                owner: "app".into()
            })
        );
    }

    #[test]
    fn a_recovery_is_left_alone() {
        let s = with_defaults(spec(
            "storage: {size: 1Gi}\nbootstrap: {recovery: {backup: b}}",
        ));
        assert_eq!(validate(&s), Ok(()));
        assert!(s.bootstrap.is_some_and(|b| b.initdb.is_none()));
    }

    #[test]
    fn backups_default_to_utc_but_keep_a_set_timezone() {
        let s = with_defaults(spec("storage: {size: 1Gi}\nbackup: {}"));
        assert_eq!(
            s.backup.and_then(|b| b.timezone).as_deref(),
            Some(DEFAULT_TIMEZONE)
        );
        let s = with_defaults(spec(
            "storage: {size: 1Gi}\nbackup: {timezone: Europe/Berlin}",
        ));
        assert_eq!(
            s.backup.and_then(|b| b.timezone).as_deref(),
            Some("Europe/Berlin")
        );
    }

    #[test]
    fn defaulting_is_idempotent_and_keeps_a_valid_spec_valid() {
        let once = with_defaults(spec("replicas: 3\nstorage: {size: 1Gi}\nbackup: {}"));
        assert_eq!(with_defaults(once.clone()), once);
        assert_eq!(validate(&once), Ok(()));
    }
}
