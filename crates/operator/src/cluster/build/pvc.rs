//! One PersistentVolumeClaim per instance, named like the instance; it outlives pod
//! restarts and is deleted only with its instance (scale down) or its cluster.

use super::Common;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use pgop_api::labels;
use pgop_api::v1beta1::PostgresClusterSpec;

pub fn pvc(c: &Common, spec: &PostgresClusterSpec, instance: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: c.meta(
            instance,
            &[
                (labels::COMPONENT, labels::COMPONENT_DATABASE),
                (labels::INSTANCE_NAME, instance),
            ],
        ),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            storage_class_name: spec.storage.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(
                    [("storage".to_string(), Quantity(spec.storage.size.clone()))].into(),
                ),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}
