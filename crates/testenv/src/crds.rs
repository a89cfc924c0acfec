//! Installing CustomResourceDefinitions and waiting until the API server serves them.

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt, ResourceExt};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to parse CRD YAML document {index}")]
    ParseYaml {
        index: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("failed to apply CRD {name}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("CRD {name} was not established within {timeout:?}")]
    NotEstablished { name: String, timeout: Duration },
    #[error("discovery did not list {resource} in {group_version} within {timeout:?}")]
    NotDiscovered {
        resource: String,
        group_version: String,
        timeout: Duration,
    },
    #[error("no conversion webhook for the CRDs")]
    Callback(#[source] crate::callback::Error),
    #[error("failed to watch CRD {name}")]
    Watch {
        name: String,
        #[source]
        source: kube::runtime::wait::Error,
    },
}

/// Seconds on a quiet machine; a run on a saturated one saw 30 s pass (the API server's
/// CRD controllers starve with the rest), so the bound is for a stuck server only.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(120);

/// Parses one or more CRDs from (multi-document) YAML; empty documents are skipped.
pub fn from_yaml(yaml: &str) -> Result<Vec<CustomResourceDefinition>, Error> {
    let mut crds = Vec::new();
    for (index, doc) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc)
            .map_err(|source| Error::ParseYaml { index, source })?;
        if value.is_null() {
            continue;
        }
        let crd =
            serde_yaml::from_value(value).map_err(|source| Error::ParseYaml { index, source })?;
        crds.push(crd);
    }
    Ok(crds)
}

/// The CRD of a `#[derive(CustomResource)]` type.
pub fn of<K: CustomResourceExt>() -> CustomResourceDefinition {
    K::crd()
}

/// [`install`], with the conversion webhook of every CRD that converts through one
/// (`conversion.strategy: Webhook`) pointed at this process's callback endpoint
/// ([`crate::callback`]), which answers with `convert` (a `ConversionReview` body in, one
/// out) at `path`. For tests that run no operator whose own webhook could convert.
pub async fn install_converting(
    client: &Client,
    crds: impl IntoIterator<Item = CustomResourceDefinition>,
    convert: crate::callback::Handler,
    path: &str,
) -> Result<(), Error> {
    let endpoint = crate::callback::endpoint(convert).map_err(Error::Callback)?;
    let crds: Vec<CustomResourceDefinition> = crds
        .into_iter()
        .map(|mut crd| {
            let webhook = crd
                .spec
                .conversion
                .as_mut()
                .filter(|c| c.strategy == "Webhook")
                .and_then(|c| c.webhook.as_mut());
            if let Some(webhook) = webhook {
                webhook.client_config = Some(WebhookClientConfig {
                    url: Some(endpoint.url(path)),
                    ca_bundle: Some(ByteString(endpoint.ca_bundle.clone().into_bytes())),
                    service: None,
                });
            }
            crd
        })
        .collect();
    install(client, crds).await
}

/// Applies every CRD (server-side apply, so re-installing is harmless) and waits until
/// each one is Established and discovery lists its resource in every served version (a
/// CRD is Established a moment before discovery knows it, and clients that look a kind up
/// by discovery, as kubectl and Helm do, fail with 404 in between).
pub async fn install(
    client: &Client,
    crds: impl IntoIterator<Item = CustomResourceDefinition>,
) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("pgop-testenv").force();
    let mut names = Vec::new();
    let mut served = Vec::new();
    for mut crd in crds {
        let name = crd.name_any();
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            served.push((
                format!("{}/{}", crd.spec.group, version.name),
                crd.spec.names.plural.clone(),
            ));
        }
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(|source| Error::Apply {
                name: name.clone(),
                source,
            })?;
        names.push(name);
    }
    for name in names {
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        match tokio::time::timeout(ESTABLISH_TIMEOUT, established).await {
            Ok(Ok(_)) => {}
            Ok(Err(source)) => return Err(Error::Watch { name, source }),
            Err(_) => {
                return Err(Error::NotEstablished {
                    name,
                    timeout: ESTABLISH_TIMEOUT,
                });
            }
        }
    }
    for (group_version, resource) in served {
        let deadline = tokio::time::Instant::now() + ESTABLISH_TIMEOUT;
        loop {
            let listed = client
                .list_api_group_resources(&group_version)
                .await
                .is_ok_and(|l| l.resources.iter().any(|r| r.name == resource));
            if listed {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::NotDiscovered {
                    resource,
                    group_version,
                    timeout: ESTABLISH_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
