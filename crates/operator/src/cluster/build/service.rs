//! The three Services: `-rw` follows the primary, `-ro` the standbys, `-r` any instance.
//! They select on the role label, so moving the label moves the traffic.

use super::Common;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use pgop_api::constants::{POSTGRES_PORT, POSTGRES_PORT_NAME};
use pgop_api::labels;
use std::collections::BTreeMap;

fn service(c: &Common, suffix: &str, selector: &[(&str, &str)]) -> Service {
    let mut sel: BTreeMap<String, String> = BTreeMap::new();
    sel.insert(labels::CLUSTER.to_string(), c.cluster.clone());
    for (k, v) in selector {
        sel.insert((*k).to_string(), (*v).to_string());
    }
    Service {
        metadata: c.meta(&format!("{}-{suffix}", c.cluster), &[]),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(sel),
            ports: Some(vec![ServicePort {
                name: Some(POSTGRES_PORT_NAME.to_string()),
                port: i32::from(POSTGRES_PORT),
                target_port: Some(IntOrString::String(POSTGRES_PORT_NAME.to_string())),
                protocol: Some("TCP".to_string()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

pub fn all(c: &Common) -> Vec<Service> {
    vec![
        service(c, "rw", &[(labels::ROLE, labels::ROLE_PRIMARY)]),
        service(c, "ro", &[(labels::ROLE, labels::ROLE_REPLICA)]),
        service(c, "r", &[(labels::COMPONENT, labels::COMPONENT_DATABASE)]),
    ]
}
