//! Dereference: read what exists. Every child carries the cluster label, so the watch
//! caches ([`super::cache`]) file them by cluster, and a pass reads them there without a
//! request. A cluster the caches may not yet show as its last pass left it (see
//! [`super::cache::Expectations`]), or caches not yet filled, are read from the API server
//! instead: one labelled LIST per kind. Nothing here writes.

use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use pgop_api::labels;

use super::cache::{Caches, Expectations};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

pub use crate::cluster::error::ListError as Error;

pub use crate::cluster::world::Observed;

async fn list<K>(client: &Client, namespace: &str, selector: &str) -> Result<Vec<K>, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    api.list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .map_err(|source| Error {
            kind: <K as k8s_openapi::Resource>::KIND,
            source,
        })
}

/// Where a pass read the children from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Cache,
    ApiServer,
}

/// Every child of `cluster`: from the caches when they can be trusted, else from the API
/// server.
pub async fn read(
    client: &Client,
    caches: Option<&Caches>,
    expectations: &Expectations,
    namespace: &str,
    cluster: &str,
) -> Result<(Observed, Source), Error> {
    if let Some(caches) = caches
        && caches.ready()
        && expectations.met(caches, namespace, cluster)
    {
        return Ok((caches.observe(namespace, cluster), Source::Cache));
    }
    Ok((
        observe(client, namespace, cluster).await?,
        Source::ApiServer,
    ))
}

/// Every child of `cluster`, listed from the API server (one labelled LIST per kind).
pub async fn observe(client: &Client, namespace: &str, cluster: &str) -> Result<Observed, Error> {
    let sel = format!("{}={cluster}", labels::CLUSTER);
    let (
        service_accounts,
        roles,
        role_bindings,
        secrets,
        services,
        pdbs,
        pvcs,
        pods,
        network_policies,
        deployments,
    ) = tokio::try_join!(
        list(client, namespace, &sel),
        list(client, namespace, &sel),
        list(client, namespace, &sel),
        list(client, namespace, &sel),
        list(client, namespace, &sel),
        list(client, namespace, &sel),
        list(client, namespace, &sel),
        list(client, namespace, &sel),
        list(client, namespace, &sel),
        list(client, namespace, &sel),
    )?;
    Ok(Observed {
        service_accounts,
        roles,
        role_bindings,
        secrets,
        services,
        pod_disruption_budgets: pdbs,
        pvcs,
        pods,
        network_policies,
        deployments,
    })
}
