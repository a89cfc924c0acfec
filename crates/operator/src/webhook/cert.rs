//! The webhooks' serving certificate, from one of two sources:
//! - [`Source::Managed`] (the default): pgop keeps an authority and a serving certificate in
//!   a Secret of its namespace, shared by every replica, and the `caBundle` of the
//!   webhook configurations (and of the CRDs' conversion webhook) it is given up to date. The first replica to find the Secret
//!   missing (or unusable) creates it; a conflicting write by another replica loses and
//!   reads the winner's. The certificate is renewed when less than
//!   [`Managed::renew_before_days`] of it is left; the authority when it would not outlive
//!   a new certificate, and then the old authority stays in the bundle beside the new one.
//!   A new authority reaches the `caBundle` before any replica serves a certificate it
//!   signed, so the API server trusts every certificate served, during a rotation too.
//! - [`Source::Files`]: `tls.crt` and `tls.key` in a directory (a cert-manager Certificate's
//!   Secret, mounted), read again at every check; cert-manager's CA injector keeps the
//!   `caBundle`.
//!
//! Either way the configuration in use changes only when the certificate does, and a
//! certificate that cannot be loaded leaves the previous one in use.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use pgop_tls::Authority;
use rustls::ServerConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub enum Source {
    Managed(Managed),
    Files { dir: PathBuf, check_every: Duration },
}

/// pgop's own authority and certificate (see the module documentation).
#[derive(Clone, Debug)]
pub struct Managed {
    /// Namespace and name of the Secret holding them.
    pub namespace: String,
    pub secret: String,
    /// The names the certificate is for: the Service's DNS names
    /// (`<service>.<namespace>.svc`), or the address of a `url` client configuration.
    pub names: Vec<String>,
    /// The webhook configurations (validating and mutating ones of these names) whose
    /// webhooks' `caBundle` pgop keeps.
    pub configurations: Vec<String>,
    /// The CustomResourceDefinitions whose conversion webhook's `caBundle` pgop keeps
    /// (those with `conversion.strategy: Webhook`; the others are left alone).
    pub conversion_crds: Vec<String>,
    /// Where those CRDs are to call their conversion webhook, written with the `caBundle`
    /// (a CRD names one webhook, so one release of pgop converts for everybody); `None`:
    /// where the CRD says.
    pub conversion_client: Option<ConversionClient>,
    /// How long a serving certificate is valid.
    pub validity_days: i64,
    /// A certificate with less than this left is renewed.
    pub renew_before_days: i64,
    /// How often the Secret and the configurations are looked at.
    pub check_every: Duration,
}

/// Where the API server is to call the conversion webhook (always at
/// [`pgop_api::CONVERT_PATH`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConversionClient {
    /// A Service in front of the operator's replicas.
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
    /// A URL's scheme, host and port (`https://127.0.0.1:9443`).
    Url(String),
    /// The webhook server's own address, `https://ADDRESS` (read once it is bound): an
    /// operator out of cluster on the API server's machine, as `pgop dev` runs it. The
    /// serving certificate must be for that address (`names`).
    Loopback,
}

impl ConversionClient {
    /// The `clientConfig` fields it sets, `caBundle` aside (the other form is cleared).
    fn fields(&self) -> serde_json::Value {
        match self {
            ConversionClient::Service {
                namespace,
                name,
                port,
            } => serde_json::json!({
                "service": {"namespace": namespace, "name": name, "port": port,
                            "path": pgop_api::CONVERT_PATH},
                "url": null,
            }),
            ConversionClient::Url(base) => serde_json::json!({
                "url": convert_url(base),
                "service": null,
            }),
            // Resolved to a URL before the keeper starts ([`super::Webhook::run`]).
            ConversionClient::Loopback => serde_json::json!({}),
        }
    }

    /// Whether `config` already calls here.
    fn is(&self, config: &WebhookClientConfig) -> bool {
        match self {
            ConversionClient::Service {
                namespace,
                name,
                port,
            } => {
                config.url.is_none()
                    && config.service.as_ref().is_some_and(|s| {
                        &s.namespace == namespace
                            && &s.name == name
                            && s.port == Some(*port)
                            && s.path.as_deref() == Some(pgop_api::CONVERT_PATH)
                    })
            }
            ConversionClient::Url(base) => {
                config.service.is_none() && config.url.as_deref() == Some(&convert_url(base))
            }
            ConversionClient::Loopback => true,
        }
    }
}

/// The conversion path under `base` (a scheme, host and port).
fn convert_url(base: &str) -> String {
    format!("{}{}", base.trim_end_matches('/'), pgop_api::CONVERT_PATH)
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read Secret {0}")]
    ReadSecret(String, #[source] kube::Error),
    #[error("failed to write Secret {0}")]
    WriteSecret(String, #[source] kube::Error),
    #[error("failed to generate the webhook certificate")]
    Generate(#[source] pgop_tls::Error),
    #[error("failed to update the caBundle of {0}")]
    CaBundle(String, #[source] kube::Error),
    #[error("failed to read {0}")]
    ReadFile(PathBuf, #[source] std::io::Error),
    #[error("the certificate and key do not make a TLS configuration")]
    Load(#[source] pgop_tls::Error),
}

/// Secret keys and annotations.
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const NOT_AFTER: &str = "database.example.com/not-after";
const CA_NOT_AFTER: &str = "database.example.com/ca-not-after";
const NAMES: &str = "database.example.com/names";

/// The authority (its certificate first, then the previous one while it is still
/// trusted), its key, and the serving certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Material {
    pub ca_bundle: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
    pub not_after: jiff::Timestamp,
    pub ca_not_after: jiff::Timestamp,
    pub names: Vec<String>,
}

/// What to do with the Secret as read.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Serve what it holds.
    Use(Material),
    /// Write this (a new certificate, perhaps a new authority), then serve it.
    Write { material: Material, why: String },
}

impl Material {
    fn from_secret(secret: &Secret) -> Option<Self> {
        let data = secret.data.as_ref()?;
        let text = |key: &str| {
            data.get(key)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
        };
        let annotations = secret.metadata.annotations.as_ref()?;
        let time = |key: &str| annotations.get(key)?.parse::<jiff::Timestamp>().ok();
        Some(Self {
            ca_bundle: text(CA_CERT)?,
            ca_key: text(CA_KEY)?,
            cert: text(TLS_CERT)?,
            key: text(TLS_KEY)?,
            not_after: time(NOT_AFTER)?,
            ca_not_after: time(CA_NOT_AFTER)?,
            names: annotations
                .get(NAMES)?
                .split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect(),
        })
    }

    fn to_secret(&self, namespace: &str, name: &str, resource_version: Option<String>) -> Secret {
        let data: BTreeMap<String, ByteString> = [
            (CA_CERT, &self.ca_bundle),
            (CA_KEY, &self.ca_key),
            (TLS_CERT, &self.cert),
            (TLS_KEY, &self.key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
        Secret {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                resource_version,
                annotations: Some(
                    [
                        (NOT_AFTER, self.not_after.to_string()),
                        (CA_NOT_AFTER, self.ca_not_after.to_string()),
                        (NAMES, self.names.join(",")),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
                ),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_string(),
                        "pgop".to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".to_string()),
            data: Some(data),
            ..Default::default()
        }
    }

    /// The first certificate of the bundle: the authority that signs now.
    fn current_ca(&self) -> &str {
        first_pem(&self.ca_bundle)
    }
}

fn first_pem(bundle: &str) -> &str {
    const END: &str = "-----END CERTIFICATE-----";
    match bundle.find(END) {
        Some(at) => &bundle[..at + END.len()],
        None => bundle,
    }
}

fn days(n: i64) -> jiff::SignedDuration {
    jiff::SignedDuration::from_hours(24 * n)
}

/// The decision over the Secret as read (`None`: there is none), pure but for the keys it
/// generates.
pub fn plan(
    secret: Option<&Secret>,
    config: &Managed,
    now: jiff::Timestamp,
) -> Result<Plan, pgop_tls::Error> {
    let current = secret.and_then(Material::from_secret).filter(|m| {
        Authority::from_pem_webhook(m.current_ca(), &m.ca_key).is_ok()
            && pgop_tls::webhook_server_config(&m.cert, &m.key).is_ok()
    });
    let Some(current) = current else {
        let why = if secret.is_some() {
            "the Secret holds no usable authority and certificate"
        } else {
            "there is no Secret yet"
        };
        let ca = Authority::generate_webhook(now)?;
        return issue(&ca, ca.cert_pem().to_string(), config, now, why.to_string());
    };
    let left = |t: jiff::Timestamp| t.duration_since(now);
    // The authority must outlive every certificate it signs.
    if left(current.ca_not_after) < days(config.validity_days + config.renew_before_days) {
        let ca = Authority::generate_webhook(now)?;
        let bundle = format!("{}\n{}\n", ca.cert_pem().trim_end(), current.current_ca());
        return issue(
            &ca,
            bundle,
            config,
            now,
            format!("the authority expires at {}", current.ca_not_after),
        );
    }
    let why = if left(current.not_after) < days(config.renew_before_days) {
        format!("the certificate expires at {}", current.not_after)
    } else if current.names != config.names {
        format!(
            "the certificate is for {}, not {}",
            current.names.join(","),
            config.names.join(",")
        )
    } else {
        return Ok(Plan::Use(current));
    };
    let ca = Authority::from_pem_webhook(current.current_ca(), &current.ca_key)?;
    let mut next = issue(&ca, current.ca_bundle.clone(), config, now, why)?;
    if let Plan::Write { material, .. } = &mut next {
        material.ca_not_after = current.ca_not_after;
    }
    Ok(next)
}

fn issue(
    ca: &Authority,
    ca_bundle: String,
    config: &Managed,
    now: jiff::Timestamp,
    why: String,
) -> Result<Plan, pgop_tls::Error> {
    let issued = ca.issue_webhook_server(&config.names, now, config.validity_days)?;
    // The authority is valid until midnight UTC of its last day: a day less, to be sure.
    let ca_not_after = now
        .checked_add(days(pgop_tls::CA_VALIDITY_DAYS - 1))
        .unwrap_or(now);
    Ok(Plan::Write {
        material: Material {
            ca_bundle,
            ca_key: ca.key_pem().to_string(),
            cert: issued.cert_pem,
            key: issued.key_pem,
            not_after: issued.not_after,
            ca_not_after,
            names: config.names.clone(),
        },
        why,
    })
}

/// Keeps the serving configuration published in `tx` up to date from `source`, until
/// dropped. Failures are logged and retried.
pub async fn keep(
    client: kube::Client,
    source: Source,
    tx: watch::Sender<Option<Arc<ServerConfig>>>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
) {
    let mut serving: Option<String> = None;
    loop {
        let (result, every) = match &source {
            Source::Managed(config) => (
                managed_step(&client, config, &tx, &mut serving, metrics.as_deref()).await,
                config.check_every,
            ),
            Source::Files { dir, check_every } => {
                (files_step(dir, &tx, &mut serving), *check_every)
            }
        };
        let wait = match result {
            Ok(Next::Check) => every,
            // Another replica wrote the Secret first: read it (and put its authority back
            // into the caBundle, should this one have written its own) at once.
            Ok(Next::Reread) => every.min(RETRY),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "the webhooks' certificate");
                every.min(Duration::from_secs(5))
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// When to look again after a step.
enum Next {
    /// After the check interval.
    Check,
    /// Soon: the Secret changed under this replica's write.
    Reread,
}

/// How soon a replica that lost a write reads again.
const RETRY: Duration = Duration::from_secs(1);

/// Serves `cert` from now on, unless it already is.
fn serve(
    tx: &watch::Sender<Option<Arc<ServerConfig>>>,
    serving: &mut Option<String>,
    cert: &str,
    key: &str,
) -> Result<(), Error> {
    if serving.as_deref() == Some(cert) {
        return Ok(());
    }
    let config = pgop_tls::webhook_server_config(cert, key).map_err(Error::Load)?;
    tx.send_replace(Some(config));
    *serving = Some(cert.to_string());
    tracing::info!("the webhooks serve a new certificate");
    Ok(())
}

fn files_step(
    dir: &std::path::Path,
    tx: &watch::Sender<Option<Arc<ServerConfig>>>,
    serving: &mut Option<String>,
) -> Result<Next, Error> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|e| Error::ReadFile(path, e))
    };
    let (cert, key) = (read(TLS_CERT)?, read(TLS_KEY)?);
    serve(tx, serving, &cert, &key).map(|()| Next::Check)
}

async fn managed_step(
    client: &kube::Client,
    config: &Managed,
    tx: &watch::Sender<Option<Arc<ServerConfig>>>,
    serving: &mut Option<String>,
    metrics: Option<&crate::metrics::Metrics>,
) -> Result<Next, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let name = format!("{}/{}", config.namespace, config.secret);
    let secret = secrets
        .get_opt(&config.secret)
        .await
        .map_err(|e| Error::ReadSecret(name.clone(), e))?;
    let material = match plan(secret.as_ref(), config, jiff::Timestamp::now())
        .map_err(Error::Generate)?
    {
        Plan::Use(material) => material,
        Plan::Write { material, why } => {
            // The API server trusts a new authority before anyone serves what it signed.
            ca_bundles(client, config, &material.ca_bundle).await?;
            let written = match &secret {
                // A merge patch carrying the resourceVersion read: refused (409) when
                // another replica wrote in between, as an update would be.
                Some(old) => {
                    let rv = old.metadata.resource_version.clone();
                    let new = material.to_secret(&config.namespace, &config.secret, rv);
                    secrets
                        .patch(&config.secret, &PatchParams::default(), &Patch::Merge(&new))
                        .await
                }
                None => {
                    let new = material.to_secret(&config.namespace, &config.secret, None);
                    secrets.create(&PostParams::default(), &new).await
                }
            };
            match written {
                Ok(_) => {
                    tracing::info!(secret = %name, %why, not_after = %material.not_after, "wrote the webhooks' certificate");
                    material
                }
                // Another replica wrote first: serve what it wrote, read next time.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tracing::info!(secret = %name, "another replica renewed the webhooks' certificate first");
                    return Ok(Next::Reread);
                }
                Err(e) => return Err(Error::WriteSecret(name, e)),
            }
        }
    };
    ca_bundles(client, config, &material.ca_bundle).await?;
    serve(tx, serving, &material.cert, &material.key)?;
    if let Some(metrics) = metrics {
        metrics.set_webhook_certificate_expiry(material.not_after);
    }
    Ok(Next::Check)
}

/// Sets `bundle` as the `caBundle` of every webhook of the configurations (validating and
/// mutating ones of each name), where it differs. A configuration that does not exist
/// (yet) is skipped.
async fn ca_bundles(client: &kube::Client, config: &Managed, bundle: &str) -> Result<(), Error> {
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for name in &config.configurations {
        set_bundle(&validating, name, bundle, |c| {
            c.webhooks
                .iter()
                .flatten()
                .map(|w| (w.name.clone(), w.client_config.ca_bundle.clone()))
                .collect()
        })
        .await?;
        set_bundle(&mutating, name, bundle, |c| {
            c.webhooks
                .iter()
                .flatten()
                .map(|w| (w.name.clone(), w.client_config.ca_bundle.clone()))
                .collect()
        })
        .await?;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in &config.conversion_crds {
        conversion_bundle(&crds, name, bundle, config.conversion_client.as_ref()).await?;
    }
    Ok(())
}

/// The `caBundle` of a CRD's conversion webhook, where the CRD converts by webhook and
/// the bundle differs.
async fn conversion_bundle(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    bundle: &str,
    client: Option<&ConversionClient>,
) -> Result<(), Error> {
    let failed = |e| Error::CaBundle(format!("CustomResourceDefinition {name}"), e);
    let Some(crd) = api.get_opt(name).await.map_err(failed)? else {
        tracing::debug!(crd = %name, "no such CustomResourceDefinition (yet)");
        return Ok(());
    };
    let Some(conversion) = crd.spec.conversion.filter(|c| c.strategy == "Webhook") else {
        return Ok(());
    };
    let current = conversion
        .webhook
        .and_then(|w| w.client_config)
        .unwrap_or_default();
    let bundled = current.ca_bundle.as_ref().map(|b| b.0.as_slice()) == Some(bundle.as_bytes());
    let called = client.is_none_or(|c| c.is(&current));
    if bundled && called {
        return Ok(());
    }
    let mut fields = client.map_or_else(|| serde_json::json!({}), ConversionClient::fields);
    fields["caBundle"] = serde_json::json!(ByteString(bundle.as_bytes().to_vec()));
    let patch = serde_json::json!({"spec": {"conversion": {"webhook": {"clientConfig": fields}}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(failed)?;
    tracing::info!(crd = %name, client = ?client, "updated the conversion webhook's caBundle and address");
    Ok(())
}

/// A webhook of a configuration: its name and its `caBundle`.
type Hook = (String, Option<ByteString>);

/// One configuration of kind `K`: its webhooks by `hooks`.
async fn set_bundle<K>(
    api: &Api<K>,
    name: &str,
    bundle: &str,
    hooks: fn(&K) -> Vec<Hook>,
) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&());
    let failed = |e| Error::CaBundle(format!("{kind} {name}"), e);
    let Some(configuration) = api.get_opt(name).await.map_err(failed)? else {
        tracing::debug!(%kind, configuration = %name, "no such webhook configuration (yet)");
        return Ok(());
    };
    let stale: Vec<serde_json::Value> = hooks(&configuration)
        .into_iter()
        .filter(|(_, ca)| ca.as_ref().map(|b| b.0.as_slice()) != Some(bundle.as_bytes()))
        .map(|(hook, _)| {
            serde_json::json!({
                "name": hook,
                "clientConfig": {"caBundle": ByteString(bundle.as_bytes().to_vec())},
            })
        })
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    let patch = serde_json::json!({"webhooks": stale});
    api.patch(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map_err(failed)?;
    tracing::info!(%kind, configuration = %name, "updated the caBundle of the webhooks");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_client_is_written_in_full_and_recognised_once_there() {
        let service = ConversionClient::Service {
            namespace: "ops".into(),
            name: "hooks".into(),
            port: 443,
        };
        let fields = service.fields();
        assert_eq!(fields["service"]["path"], pgop_api::CONVERT_PATH);
        assert_eq!(fields["url"], serde_json::Value::Null);
        let written: WebhookClientConfig = serde_json::from_value(fields).expect("a clientConfig");
        assert!(service.is(&written));
        let elsewhere = ConversionClient::Service {
            namespace: "pgop-system".into(),
            name: "hooks".into(),
            port: 443,
        };
        assert!(!elsewhere.is(&written));
        let url = ConversionClient::Url("https://127.0.0.1:9443/".into());
        let fields = url.fields();
        assert_eq!(fields["url"], "https://127.0.0.1:9443/convert");
        assert_eq!(fields["service"], serde_json::Value::Null);
        let written: WebhookClientConfig = serde_json::from_value(fields).expect("a clientConfig");
        assert!(url.is(&written));
        assert!(!service.is(&written));
    }

    fn config() -> Managed {
        Managed {
            namespace: "pgop-system".into(),
            secret: "pgop-webhook-tls".into(),
            names: vec!["pgop-webhook.pgop-system.svc".into()],
            configurations: vec!["pgop".into()],
            conversion_crds: Vec::new(),
            conversion_client: None,
            validity_days: 90,
            renew_before_days: 30,
            check_every: Duration::from_secs(60),
        }
    }

    fn written(plan: Plan) -> Material {
        match plan {
            Plan::Write { material, .. } => material,
            Plan::Use(_) => panic!("expected a write"),
        }
    }

    fn secret_of(m: &Material) -> Secret {
        m.to_secret("pgop-system", "pgop-webhook-tls", Some("1".into()))
    }

    #[test]
    fn a_missing_or_broken_secret_gets_a_new_authority_and_certificate() {
        let now = jiff::Timestamp::now();
        let first = written(plan(None, &config(), now).expect("plan"));
        assert_eq!(first.names, config().names);
        assert!(pgop_tls::webhook_server_config(&first.cert, &first.key).is_ok());
        // Read back: used as it is.
        let again = plan(Some(&secret_of(&first)), &config(), now).expect("plan");
        assert_eq!(again, Plan::Use(first.clone()));
        let mut broken = secret_of(&first);
        if let Some(data) = broken.data.as_mut() {
            data.insert(TLS_KEY.into(), ByteString(b"not a key".to_vec()));
        }
        let fresh = written(plan(Some(&broken), &config(), now).expect("plan"));
        assert_ne!(fresh.ca_bundle, first.ca_bundle);
    }

    #[test]
    fn the_certificate_is_renewed_by_the_same_authority_and_the_names_followed() {
        let now = jiff::Timestamp::now();
        let first = written(plan(None, &config(), now).expect("plan"));
        let later = now.checked_add(days(61)).expect("time");
        let renewed = written(plan(Some(&secret_of(&first)), &config(), later).expect("plan"));
        assert_eq!(
            renewed.ca_bundle, first.ca_bundle,
            "same authority, same bundle"
        );
        assert_ne!(renewed.cert, first.cert);
        assert_eq!(renewed.ca_not_after, first.ca_not_after);
        let mut moved = config();
        moved.names = vec!["127.0.0.1".into()];
        let renamed = written(plan(Some(&secret_of(&first)), &moved, now).expect("plan"));
        assert_eq!(renamed.names, ["127.0.0.1"]);
        assert_eq!(renamed.ca_bundle, first.ca_bundle);
    }

    #[test]
    fn an_expiring_authority_is_replaced_and_kept_in_the_bundle_beside_the_new_one() {
        let now = jiff::Timestamp::now();
        let first = written(plan(None, &config(), now).expect("plan"));
        let late = first.ca_not_after.checked_sub(days(100)).expect("time");
        let next = written(plan(Some(&secret_of(&first)), &config(), late).expect("plan"));
        assert_eq!(next.ca_bundle.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(next.ca_bundle.contains(first.current_ca()));
        assert_ne!(next.current_ca(), first.current_ca());
        // The next renewal keeps only the new authority and the one before it.
        let later = next.ca_not_after.checked_sub(days(100)).expect("time");
        let third = written(plan(Some(&secret_of(&next)), &config(), later).expect("plan"));
        assert_eq!(third.ca_bundle.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(third.ca_bundle.contains(next.current_ca()));
        assert!(!third.ca_bundle.contains(first.current_ca()));
    }
}
