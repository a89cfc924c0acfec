//! The PersistentVolumeClaims of an instance: its data volume, named like the instance, and
//! with `spec.walStorage` its write-ahead log's, `<instance>-wal`. They outlive pod restarts
//! and are deleted only with their instance (scale down) or their cluster.

use super::Common;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use pgop_api::labels;
use pgop_api::v1beta1::PostgresClusterSpec;

/// The claims of `instance`: data first, then the WAL's when `spec.walStorage` is set.
pub(crate) fn pvcs(
    c: &Common,
    spec: &PostgresClusterSpec,
    instance: &str,
) -> Vec<PersistentVolumeClaim> {
    let data = claim(
        c,
        instance,
        instance,
        labels::VOLUME_DATA,
        &spec.storage.size,
        spec.storage.storage_class_name.as_deref(),
    );
    let wal = spec.wal_storage.as_ref().map(|w| {
        claim(
            c,
            instance,
            &labels::wal_claim(instance),
            labels::VOLUME_WAL,
            &w.size,
            w.storage_class_name.as_deref(),
        )
    });
    std::iter::once(data).chain(wal).collect()
}

/// Whether a claim of the cluster holds an instance's WAL (`spec.walStorage`), not its data.
pub fn is_wal(pvc: &PersistentVolumeClaim) -> bool {
    pvc.labels().get(labels::VOLUME).map(String::as_str) == Some(labels::VOLUME_WAL)
}

fn claim(
    c: &Common,
    instance: &str,
    name: &str,
    volume: &str,
    size: &str,
    class: Option<&str>,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: c.meta(
            name,
            &[
                (labels::COMPONENT, labels::COMPONENT_DATABASE),
                (labels::INSTANCE_NAME, instance),
                (labels::VOLUME, volume),
            ],
        ),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            storage_class_name: class.map(str::to_string),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_string(), Quantity(size.to_string()))].into()),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}
