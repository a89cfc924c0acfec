//! Step 4: the instance serials to keep, create and remove (see [`super::serials`]),
//! and the children built for them. The plan's `next_serial` is in the status each pass
//! writes before it applies anything, which reserves new serials before any instance is
//! created.

use super::serials as instances;
use crate::cluster::{build, world};
use kube::ResourceExt;
use pgop_api::v1beta1::PostgresCluster;
use std::collections::BTreeSet;

/// Step 4: the instances to keep, create and remove, by serial.
pub(in crate::cluster) struct Planned {
    pub plan: instances::Plan,
    /// Every planned instance: its name and serial.
    pub named: Vec<(String, i32)>,
    /// The serials with a Pod or a claim now.
    pub existing: BTreeSet<i32>,
}

/// Step 4: plans the instance serials of `defaulted`'s spec against the Pods and claims
/// that exist.
pub(in crate::cluster) fn plan(
    cluster: &PostgresCluster,
    defaulted: &PostgresCluster,
    observed: &world::Observed,
) -> Planned {
    let name = cluster.name_any();
    let existing: BTreeSet<i32> = observed
        .pods
        .iter()
        .map(|p| p.name_any())
        .chain(observed.pvcs.iter().map(|p| p.name_any()))
        .filter_map(|n| instances::serial_of(&name, &n))
        .collect();
    let old_status = cluster.status.clone().unwrap_or_default();
    let current_primary = old_status
        .current_primary
        .as_deref()
        .and_then(|p| instances::serial_of(&name, p));
    let plan = instances::plan(
        defaulted.spec.instances,
        &existing,
        old_status.next_serial,
        current_primary,
    );
    let named = plan
        .serials
        .iter()
        .map(|s| (instances::instance_name(&name, *s), *s))
        .collect();
    Planned {
        plan,
        named,
        existing,
    }
}

/// Step 6's children: every planned instance, the one named `labelled` carrying the primary
/// role label (none during a change of primary), each running PostgreSQL `major`.
pub(in crate::cluster) fn children(
    defaulted: &PostgresCluster,
    named: &[(String, i32)],
    credentials: &build::Credentials,
    settings: &crate::Settings,
    labelled: Option<&str>,
    major: i32,
    budgets: &build::Budgets,
) -> Result<build::Children, build::Error> {
    let wanted = specs(named, labelled, major);
    build::children(defaulted, &wanted, credentials, settings, budgets)
}

/// The instances to build, `labelled` carrying the primary's role label.
pub(in crate::cluster) fn specs(
    named: &[(String, i32)],
    labelled: Option<&str>,
    major: i32,
) -> Vec<build::InstanceSpec> {
    named
        .iter()
        .map(|(instance, _)| build::InstanceSpec {
            name: instance.clone(),
            primary: labelled == Some(instance.as_str()),
            major,
            upgrade_from: None,
        })
        .collect()
}
