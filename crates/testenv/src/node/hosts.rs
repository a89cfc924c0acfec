//! Service names without DNS: the node writes a hosts file mapping
//! `<service>.<namespace>.svc` (and `.svc.cluster.local`) to the addresses of the ready
//! pods the Service selects, and hands its path to every pod process in
//! `PGOP_HOSTS_FILE`. In a real cluster that variable is unset and DNS answers instead.
//!
//! The endpoints come from the Service's selector and the pods' Ready condition — what
//! the EndpointSlice controller computes — rather than from the EndpointSlices themselves,
//! because the API server refuses loopback addresses in EndpointSlices, and loopback
//! addresses are all the pod IPs here are.

use super::NodeError;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::path::Path;

/// The environment variable naming the hosts file.
pub const HOSTS_FILE_ENV: &str = "PGOP_HOSTS_FILE";

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Rewrites the hosts file from the current Services and pods (only when it changed).
pub async fn sync(client: &Client, namespace: Option<&str>, path: &Path) -> Result<(), NodeError> {
    let (services, pods): (Api<Service>, Api<Pod>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let services = services
        .list(&ListParams::default())
        .await
        .map_err(|e| NodeError::api("list Services", e))?;
    let pods = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| NodeError::api("list pods", e))?;
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for svc in services.items {
        let Some(ns) = svc.namespace() else { continue };
        let Some(selector) = svc.spec.as_ref().and_then(|s| s.selector.clone()) else {
            continue;
        };
        if selector.is_empty() {
            continue;
        }
        let ips = by_name
            .entry(format!("{}.{ns}.svc", svc.name_any()))
            .or_default();
        for pod in &pods.items {
            let matches = pod.namespace().as_deref() == Some(ns.as_str())
                && selector.iter().all(|(k, v)| pod.labels().get(k) == Some(v));
            if matches
                && ready(pod)
                && pod.metadata.deletion_timestamp.is_none()
                && let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone())
            {
                ips.push(ip);
            }
        }
    }
    let mut text =
        String::from("# written by the pgop local node: service name -> ready pod addresses\n");
    for (name, ips) in &mut by_name {
        ips.sort();
        ips.dedup();
        for ip in ips.iter() {
            text.push_str(&format!("{ip} {name} {name}.cluster.local\n"));
        }
    }
    if std::fs::read_to_string(path).ok().as_deref() != Some(text.as_str()) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, &text).map_err(|e| NodeError::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| NodeError::io(path, e))?;
    }
    Ok(())
}

/// Looks `host` up in a hosts file written by [`sync`]: its first address, if any.
pub fn resolve(hosts_file: &Path, host: &str) -> Option<String> {
    let text = std::fs::read_to_string(hosts_file).ok()?;
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let mut parts = l.split_whitespace();
        let ip = parts.next()?;
        parts.any(|n| n == host).then(|| ip.to_string())
    })
}
