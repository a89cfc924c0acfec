//! What a running cluster cannot change, caught by the controller when the validating
//! webhook did not (it was down, or the change predates it): a `spec.storage.size` below
//! the volumes', and a PostgreSQL major other than the one the instances run. Each is a
//! field error; the reconcile turns it into phase Invalid before any child is touched.

/// `spec.storage.size` below the size a volume of the cluster asks for already (the
/// largest such volume is named).
pub fn storage_shrink(
    spec: &pgop_api::v1beta1::PostgresClusterSpec,
    pvcs: &[k8s_openapi::api::core::v1::PersistentVolumeClaim],
) -> Option<pgop_api::validation::FieldError> {
    let wanted = pgop_api::quantity::millis(&spec.storage.size)?;
    let (size, _) = pvcs
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
        field: "spec.storage.size".to_string(),
        message: pgop_api::validation::msg_storage_shrink(&spec.storage.size, size),
    })
}

/// The major version of `spec` when an instance runs another one: what its Pod was built
/// to run (`PGOP_POSTGRES_MAJOR`), or what it reported running
/// (`status.instances[].postgresVersion`; Pods made before the variable carry none, and a
/// failed probe reports nothing, so either source alone could miss it). Its data directory
/// holds that major, and pgop does not upgrade in place.
pub fn major_change(
    spec: &pgop_api::v1beta1::PostgresClusterSpec,
    status: Option<&pgop_api::PostgresClusterStatus>,
    pods: &[k8s_openapi::api::core::v1::Pod],
) -> Option<pgop_api::validation::FieldError> {
    let wanted = spec
        .postgresql
        .version
        .unwrap_or(pgop_api::cluster::DEFAULT_POSTGRES_VERSION);
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
        .filter(|e| e.name == super::build::pod::env::POSTGRES_MAJOR)
        .filter_map(|e| major(e.value.as_deref()?));
    let running = reported.chain(built_for).find(|major| *major != wanted)?;
    let verb = if wanted < running {
        "lowered"
    } else {
        "raised"
    };
    Some(pgop_api::validation::FieldError {
        field: "spec.postgresql.version".to_string(),
        message: format!(
            "may not be {verb} to {wanted}: the instances run PostgreSQL {running}, and pgop does not change the major version of a data directory (restore a logical backup into a new cluster of {wanted} instead)"
        ),
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
    }

    #[test]
    fn another_major_than_the_instances_run_is_refused() {
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
        assert_eq!(super::major_change(&spec(None), Some(&fifteen), &[]), None);
        assert_eq!(
            super::major_change(&spec(Some(15)), Some(&fifteen), &[]),
            None
        );
        let raised = super::major_change(&spec(Some(18)), Some(&fifteen), &[]).expect("refused");
        assert_eq!(raised.field, "spec.postgresql.version");
        assert!(
            raised.message.contains("raised to 18") && raised.message.contains("PostgreSQL 15"),
            "{}",
            raised.message
        );
        let eighteen = status(&[Some("18.6")]);
        let lowered = super::major_change(&spec(None), Some(&eighteen), &[]).expect("refused");
        assert!(
            lowered.message.contains("lowered to 15"),
            "{}",
            lowered.message
        );
        // A Pod built for 15 whose instance reports nothing (a failed probe): still 15.
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-1"},
            "spec": {"containers": [{"name": "postgres", "env": [
                {"name": "PGOP_POSTGRES_MAJOR", "value": "15"}
            ]}]}
        }))
        .expect("pod fixture");
        let silent = status(&[None]);
        let from_pod =
            super::major_change(&spec(Some(18)), Some(&silent), std::slice::from_ref(&pod))
                .expect("refused");
        assert!(
            from_pod.message.contains("PostgreSQL 15"),
            "{}",
            from_pod.message
        );
        assert_eq!(
            super::major_change(&spec(Some(15)), Some(&silent), &[pod]),
            None
        );
        // Nothing reported yet (a new cluster): nothing to compare.
        assert_eq!(super::major_change(&spec(Some(18)), None, &[]), None);
        assert_eq!(
            super::major_change(&spec(Some(18)), Some(&status(&[None])), &[]),
            None
        );
    }
}
