//! What a running cluster cannot change, caught by the controller when the validating
//! webhook did not (it was down, or the change predates it): a `spec.storage.size` (or
//! `spec.walStorage.size`) below the volumes', `spec.walStorage` removed, and a PostgreSQL
//! major below the one the data holds. Each is a field error; the reconcile turns it into
//! phase Invalid before any child is touched.

/// `spec.storage.size` below the size a data volume of the cluster asks for already (the
/// largest such volume is named); `spec.walStorage.size` below a WAL volume's; no
/// `spec.walStorage` while the cluster has WAL volumes (the instances' WAL lives there).
pub fn storage_shrink(
    spec: &pgop_api::v1beta1::PostgresClusterSpec,
    pvcs: &[k8s_openapi::api::core::v1::PersistentVolumeClaim],
) -> Option<pgop_api::validation::FieldError> {
    use crate::cluster::build::pvc::is_wal;
    let (data, wal): (Vec<_>, Vec<_>) = pvcs.iter().partition(|p| !is_wal(p));
    if let Some(e) = shrink("spec.storage.size", &spec.storage.size, &data) {
        return Some(e);
    }
    match &spec.wal_storage {
        Some(w) => shrink("spec.walStorage.size", &w.size, &wal),
        None if !wal.is_empty() => Some(pgop_api::validation::FieldError {
            field: "spec.walStorage".to_string(),
            message: pgop_api::validation::MSG_WAL_STORAGE_REMOVED.to_string(),
        }),
        None => None,
    }
}

/// `field`'s `size` below what one of `pvcs` asks for already (the largest is named).
fn shrink(
    field: &str,
    size: &str,
    pvcs: &[&k8s_openapi::api::core::v1::PersistentVolumeClaim],
) -> Option<pgop_api::validation::FieldError> {
    let wanted = pgop_api::quantity::millis(size)?;
    let (current, _) = pvcs
        .iter()
        .filter_map(|pvc| {
            let size = pvc
                .spec
                .as_ref()?
                .resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("storage")?;
            Some((size.0.as_str(), pgop_api::quantity::millis(&size.0)?))
        })
        .filter(|(_, millis)| *millis > wanted)
        .max_by_key(|(_, millis)| *millis)?;
    Some(pgop_api::validation::FieldError {
        field: field.to_string(),
        message: pgop_api::validation::msg_storage_shrink(size, current),
    })
}

/// The PostgreSQL major version the cluster's data holds: `status.postgresVersion` once
/// pgop recorded it; before that (a cluster made before the field) what an instance
/// reported running (`status.instances[].postgresVersion`) or what its Pod was built to run
/// (`PGOP_POSTGRES_MAJOR`; a failed probe reports nothing, so either source alone could
/// miss it). `None` while no instance ever ran: the spec's major is then the one to make.
pub fn held_major(
    status: Option<&pgop_api::PostgresClusterStatus>,
    pods: &[k8s_openapi::api::core::v1::Pod],
) -> Option<i32> {
    if let Some(major) = status.and_then(|s| s.postgres_version) {
        return Some(major);
    }
    let major = |text: &str| {
        pgop_api::instance_status::parse_major(text).and_then(|m| i32::try_from(m).ok())
    };
    let reported = status
        .into_iter()
        .flat_map(|s| &s.instances)
        .filter_map(|i| major(i.postgres_version.as_deref()?));
    let built_for = pods
        .iter()
        .filter_map(|p| p.spec.as_ref())
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.env.iter().flatten())
        .filter(|e| e.name == crate::cluster::build::pod::env::POSTGRES_MAJOR)
        .filter_map(|e| major(e.value.as_deref()?));
    reported.chain(built_for).next()
}

/// `spec.postgresql.version` below the major the data holds (the validating webhook
/// refuses the change; without it, it is caught here, before any Pod is rebuilt):
/// PostgreSQL's data files cannot be downgraded. A higher major is an in-place upgrade
/// ([`super::upgrade`]).
pub fn major_change(
    spec: &pgop_api::v1beta1::PostgresClusterSpec,
    held: i32,
) -> Option<pgop_api::validation::FieldError> {
    let wanted = spec
        .postgresql
        .version
        .unwrap_or(pgop_api::cluster::DEFAULT_POSTGRES_VERSION);
    let message = pgop_api::validation::version_change_error(held, wanted, None)?;
    Some(pgop_api::validation::FieldError {
        field: "spec.postgresql.version".to_string(),
        message,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_spec_below_the_volumes_is_invalid_naming_the_field() {
        let spec: pgop_api::v1beta1::PostgresClusterSpec =
            serde_json::from_value(serde_json::json!({"storage": {"size": "1Gi"}})).expect("spec");
        let pvc = |size: &str| -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db-1"},
                "spec": {"resources": {"requests": {"storage": size}}}
            }))
            .expect("pvc")
        };
        assert_eq!(
            super::storage_shrink(&spec, &[pvc("1Gi"), pvc("1024Mi")]),
            None
        );
        assert_eq!(super::storage_shrink(&spec, &[pvc("512Mi")]), None);
        let e = super::storage_shrink(&spec, &[pvc("1Gi"), pvc("2Gi"), pvc("1536Mi")])
            .expect("a shrink");
        assert_eq!(e.field, "spec.storage.size");
        assert!(e.message.contains("1Gi is smaller than 2Gi"), "{e}");
        // A WAL claim is measured against spec.walStorage, and may not lose it.
        let wal = |size: &str| {
            let mut p = pvc(size);
            p.metadata.name = Some("db-1-wal".into());
            p.metadata.labels = Some([("database.example.com/volume".into(), "wal".into())].into());
            p
        };
        let e = super::storage_shrink(&spec, &[pvc("1Gi"), wal("4Gi")]).expect("no walStorage");
        assert_eq!(e.field, "spec.walStorage");
        let with_wal: pgop_api::v1beta1::PostgresClusterSpec = serde_json::from_value(
            serde_json::json!({"storage": {"size": "1Gi"}, "walStorage": {"size": "2Gi"}}),
        )
        .expect("spec");
        assert_eq!(
            super::storage_shrink(&with_wal, &[pvc("1Gi"), wal("2Gi")]),
            None
        );
        let e = super::storage_shrink(&with_wal, &[pvc("1Gi"), wal("4Gi")]).expect("a shrink");
        assert_eq!(e.field, "spec.walStorage.size");
        assert!(e.message.contains("2Gi is smaller than 4Gi"), "{e}");
    }

    #[test]
    fn the_major_the_data_holds_is_recorded_else_reported_else_built_for() {
        let spec = |version: Option<i32>| -> pgop_api::v1beta1::PostgresClusterSpec {
            serde_json::from_value(serde_json::json!({
                "instances": 2, "storage": {"size": "1Gi"},
                "postgresql": {"version": version}
            }))
            .expect("spec fixture")
        };
        let status = |versions: &[Option<&str>]| -> pgop_api::PostgresClusterStatus {
            serde_json::from_value(serde_json::json!({
                "instances": versions.iter().enumerate().map(|(i, v)| serde_json::json!({
                    "name": format!("db-{}", i + 1), "serial": i + 1, "postgresVersion": v
                })).collect::<Vec<_>>()
            }))
            .expect("status fixture")
        };
        let fifteen = status(&[Some("15.14 (Debian 15.14-0+deb12u1)"), None]);
        assert_eq!(super::held_major(Some(&fifteen), &[]), Some(15));
        // A Pod built for 15 whose instance reports nothing (a failed probe): still 15.
        let pod = |major: &str| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db-1"},
                "spec": {"containers": [{"name": "postgres", "env": [
                    {"name": "PGOP_POSTGRES_MAJOR", "value": major}
                ]}]}
            }))
            .expect("pod fixture")
        };
        let silent = status(&[None]);
        assert_eq!(super::held_major(Some(&silent), &[pod("15")]), Some(15));
        // Nothing reported yet (a new cluster): nothing held.
        assert_eq!(super::held_major(None, &[]), None);
        assert_eq!(super::held_major(Some(&silent), &[]), None);
        // Once recorded, the record wins: the primary's Pod built for 18 while pg_upgrade
        // runs does not make the data 18.
        let mut recorded = fifteen.clone();
        recorded.postgres_version = Some(15);
        assert_eq!(super::held_major(Some(&recorded), &[pod("18")]), Some(15));

        assert_eq!(super::major_change(&spec(None), 15), None);
        assert_eq!(super::major_change(&spec(Some(15)), 15), None);
        // Raised: an in-place upgrade, not an invalid spec.
        assert_eq!(super::major_change(&spec(Some(18)), 15), None);
        let lowered = super::major_change(&spec(None), 18).expect("refused");
        assert_eq!(lowered.field, "spec.postgresql.version");
        assert!(
            lowered.message.contains("lowered to 15")
                && lowered.message.contains("PostgreSQL 18's"),
            "{}",
            lowered.message
        );
    }
}
