//! The admission webhooks of PostgresCluster and PostgresBackup, served by every
//! `pgop operator` replica over HTTPS (leader or not: a standby replica answers too).
//!
//! - `POST /mutate/postgresclusters` writes the defaults the schema cannot express into
//!   the stored object ([`review::defaults`]), on CREATE and UPDATE alike.
//! - `POST /validate/postgresclusters` and `POST /validate/postgresbackups` take an
//!   `admission.k8s.io/v1` AdmissionReview and answer it ([`review`]): refused with every
//!   invalid field named (in the message, and as `details.causes` with their `field`),
//!   allowed otherwise, with warnings for checks that could not be made.
//! - `POST /convert` is the conversion webhook of the PostgresCluster CRD when it serves
//!   `v1beta1` ([`pgop_api::crds_with_v1beta1`]): a `ConversionReview` whose objects are
//!   converted by [`pgop_api::v1beta1::convert`]. Every replica converts the same way,
//!   selector or not: conversion is not a review.
//! - The serving certificate comes from [`cert`]: pgop's own authority in a Secret, with the
//!   `caBundle` of the webhook configurations kept up to date, or files (cert-manager).
//!   A renewed certificate is served from the next connection on.
//!
//! The configurations themselves (rules, `failurePolicy: Ignore`, `timeoutSeconds: 5`)
//! come with the chart and `deploy/`: see docs/api.md#admission-webhooks. With the webhook
//! down the API server admits the request, and the controller's own validation still
//! stops an invalid spec (phase Invalid).

pub mod cert;
pub mod review;

use crate::metrics::{Metrics, Review, Webhook as MetricsWebhook};
use axum::Router;
use axum::extract::State;
use axum::routing::post;
use kube::ResourceExt;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::conversion::ConversionReview;
use kube::core::{DynamicObject, Status, response::StatusCause, response::StatusDetails};
use pgop_tls::listener::TlsListener;
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The paths the configurations call.
pub const MUTATE_CLUSTERS: &str = "/mutate/postgresclusters";
pub const VALIDATE_CLUSTERS: &str = "/validate/postgresclusters";
pub const VALIDATE_BACKUPS: &str = "/validate/postgresbackups";
pub const CONVERT: &str = pgop_api::CONVERT_PATH;

/// The webhooks' port in a cluster (`pgop operator --webhook-bind-address`).
pub const DEFAULT_PORT: u16 = 9443;

/// How the webhooks are served.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to listen (port 0: any free port, see [`Webhook::local_addr`]).
    pub listen: SocketAddr,
    pub certificate: cert::Source,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to listen for the webhooks on {0}")]
    Listen(SocketAddr, #[source] std::io::Error),
    #[error("the webhook server failed")]
    Serve(#[source] std::io::Error),
}

/// Webhooks whose address is bound, not serving yet.
pub struct Webhook {
    client: kube::Client,
    metrics: Option<Arc<Metrics>>,
    selector: Option<kube::core::Selector>,
    config: Config,
    listener: TlsListener,
    local: SocketAddr,
    tx: tokio::sync::watch::Sender<Option<Arc<rustls::ServerConfig>>>,
}

impl Webhook {
    /// Binds the address: a port in use is an error here, naming it.
    pub async fn bind(client: kube::Client, config: Config) -> Result<Self, Error> {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let listener = TlsListener::bind(config.listen, rx)
            .await
            .map_err(|e| Error::Listen(config.listen, e))?;
        let local = axum::serve::Listener::local_addr(&listener)
            .map_err(|e| Error::Listen(config.listen, e))?;
        Ok(Self {
            client,
            metrics: None,
            selector: None,
            config,
            listener,
            local,
            tx,
        })
    }

    /// Counts the reviews and reports the certificate's expiry in `metrics` (the
    /// operator's `/metrics`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Reviews only the clusters `selector` selects (`--cluster-selector`), and the
    /// backups of those: the others are allowed as they are, left to the release of pgop
    /// that manages them.
    pub fn with_selector(mut self, selector: Option<kube::core::Selector>) -> Self {
        self.selector = selector;
        self
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Serves until `shutdown` resolves, keeping the certificate meanwhile. Connections
    /// are closed at once until the first certificate is loaded.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let Self {
            client,
            metrics,
            selector,
            config,
            listener,
            local,
            tx,
        } = self;
        tracing::info!(address = %local, "serving the admission webhooks");
        let mut certificate = config.certificate;
        if let cert::Source::Managed(managed) = &mut certificate
            && managed.conversion_client == Some(cert::ConversionClient::Loopback)
        {
            managed.conversion_client =
                Some(cert::ConversionClient::Url(format!("https://{local}")));
        }
        let keeper = tokio::spawn(cert::keep(client.clone(), certificate, tx, metrics.clone()));
        let shared = Shared {
            client,
            metrics,
            selector: selector.map(Arc::new),
        };
        let served = axum::serve(listener, router(shared))
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(Error::Serve);
        keeper.abort();
        served
    }
}

/// Waits until the API server converts a `v1alpha1` PostgresCluster in `namespace`
/// through the conversion webhook: a dry-run create of a one-instance probe, which is
/// converted to `v1beta1` to be stored and so fails while the CRD does not yet call a
/// webhook that answers (the certificate keeper writes its `caBundle` and address once it
/// has a certificate). `pgop dev` waits for this before it applies a manifest of either
/// version; the real-node tests after installing the chart. The last refusal when it does
/// not within `timeout`.
pub async fn wait_converting(
    client: &kube::Client,
    namespace: &str,
    timeout: Duration,
) -> Result<(), String> {
    let api: kube::Api<pgop_api::PostgresCluster> =
        kube::Api::namespaced(client.clone(), namespace);
    let probe: pgop_api::PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": pgop_api::v1beta1::V1ALPHA1, "kind": "PostgresCluster",
        "metadata": {"name": "pgop-conversion-probe"},
        "spec": {"replicas": 1, "storage": {"size": "1Gi"}}
    }))
    .map_err(|e| format!("the conversion probe: {e}"))?;
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..kube::api::PostParams::default()
    };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match api.create(&dry_run, &probe).await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(format!(
                    "the API server did not convert a {} PostgresCluster within {timeout:?}: {e}",
                    pgop_api::v1beta1::V1ALPHA1
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
struct Shared {
    client: kube::Client,
    metrics: Option<Arc<Metrics>>,
    selector: Option<Arc<kube::core::Selector>>,
}

impl Shared {
    fn record(&self, webhook: MetricsWebhook, review: Review) {
        if let Some(metrics) = &self.metrics {
            metrics.record_review(webhook, review);
        }
    }
}

fn router(shared: Shared) -> Router {
    Router::new()
        .route(MUTATE_CLUSTERS, post(default_cluster))
        .route(VALIDATE_CLUSTERS, post(validate_cluster))
        .route(VALIDATE_BACKUPS, post(validate_backup))
        .route(CONVERT, post(convert))
        .with_state(shared)
}

/// The conversion webhook: every object of the review to the version asked for, or a
/// failure naming the first object that could not be converted (the API server then
/// fails the request it was serving, rather than hand out a half-converted list).
async fn convert(
    State(shared): State<Shared>,
    axum::Json(review): axum::Json<ConversionReview>,
) -> axum::Json<ConversionReview> {
    let (answer, result) = conversion(review);
    shared.record(MetricsWebhook::ConvertClusters, result);
    axum::Json(answer)
}

fn conversion(review: ConversionReview) -> (ConversionReview, Review) {
    let (answer, converted) = pgop_api::v1beta1::review(review);
    if !converted {
        let message = answer
            .response
            .as_ref()
            .map(|r| r.result.message.clone())
            .unwrap_or_default();
        tracing::warn!(%message, "conversion failed");
    }
    let result = if converted {
        Review::Converted
    } else {
        Review::Invalid
    };
    (answer, result)
}

/// How long one review may take, lookups included (the configurations give the API
/// server's call 5 s).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(4);

/// The defaulting webhook: the defaults the schema cannot express, as a JSON patch
/// ([`review::defaults`]), on CREATE and UPDATE alike.
async fn default_cluster(
    State(shared): State<Shared>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    let (answer, result) = defaults(review, shared.selector.as_deref());
    shared.record(MetricsWebhook::DefaultClusters, result);
    answer
}

fn defaults(
    review: AdmissionReview<DynamicObject>,
    selector: Option<&kube::core::Selector>,
) -> Answered {
    let (request, response) = match open(review) {
        Ok(opened) => opened,
        Err(answered) => return *answered,
    };
    // The patch's paths (`/spec/bootstrap`, `/spec/backup/timezone`) are the same in
    // v1alpha1 and v1beta1.
    let cluster = match decode_cluster(request.object.as_ref()) {
        Ok(Versioned { cluster, .. }) => cluster,
        // Not for this webhook to refuse: the validating one and the schema say why.
        Err(e) => {
            tracing::warn!(error = %e, "the defaulting webhook could not read a PostgresCluster");
            return (axum::Json(response.into_review()), Review::Invalid);
        }
    };
    if !review::selected(selector, cluster.labels()) {
        return (axum::Json(response.into_review()), Review::Skipped);
    }
    let ops = review::defaults(&cluster.spec);
    if ops.is_empty() {
        return (axum::Json(response.into_review()), Review::Allowed);
    }
    let patched = serde_json::from_value::<json_patch::Patch>(serde_json::Value::Array(ops))
        .map_err(|e| e.to_string())
        .and_then(|patch| {
            response
                .clone()
                .with_patch(patch)
                .map_err(|e| e.to_string())
        });
    match patched {
        Ok(response) => (axum::Json(response.into_review()), Review::Patched),
        Err(e) => {
            tracing::warn!(error = %e, "the defaulting webhook could not build its patch");
            (axum::Json(response.into_review()), Review::Invalid)
        }
    }
}

async fn validate_cluster(
    State(shared): State<Shared>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    let client = &shared.client;
    let selector = shared.selector.as_deref();
    let (answer, result) = answer(
        review,
        decode_cluster,
        |namespace, old: Option<Versioned>, new: Versioned| async move {
            if !review::selected(selector, new.cluster.labels()) {
                return None;
            }
            let old = old.map(|o| o.cluster);
            let verdict = review::cluster(&namespace, old.as_ref(), &new.cluster, client).await;
            Some(if new.v1beta1 {
                in_v1beta1(verdict)
            } else {
                verdict
            })
        },
    )
    .await;
    shared.record(MetricsWebhook::ValidateClusters, result);
    answer
}

async fn validate_backup(
    State(shared): State<Shared>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    let client = &shared.client;
    let selector = shared.selector.as_deref();
    let (answer, result) = answer(
        review,
        decode::<pgop_api::PostgresBackup>,
        |namespace, old, new| async move {
            Some(review::backup(&namespace, old.as_ref(), &new, client, selector).await)
        },
    )
    .await;
    shared.record(MetricsWebhook::ValidateBackups, result);
    answer
}

/// Decodes the request's objects by `decode` and answers with `check`'s verdict.
async fn answer<K, F, Fut>(
    review: AdmissionReview<DynamicObject>,
    decode: fn(Option<&DynamicObject>) -> Result<K, String>,
    check: F,
) -> Answered
where
    F: FnOnce(String, Option<K>, K) -> Fut,
    // `None`: not this operator's to review (another release's cluster).
    Fut: std::future::Future<Output = Option<review::Verdict>>,
{
    let (request, response) = match open(review) {
        Ok(opened) => opened,
        Err(answered) => return *answered,
    };
    let decoded = decode(request.object.as_ref()).and_then(|new| {
        let old = match request.operation {
            Operation::Update => Some(decode(request.old_object.as_ref())?),
            _ => None,
        };
        Ok((old, new))
    });
    let (old, new) = match decoded {
        Ok(objects) => objects,
        Err(e) => return (axum::Json(response.deny(e).into_review()), Review::Invalid),
    };
    let namespace = request.namespace.clone().unwrap_or_default();
    let verdict = match tokio::time::timeout(REVIEW_TIMEOUT, check(namespace, old, new)).await {
        Ok(Some(verdict)) => verdict,
        Ok(None) => return (axum::Json(response.into_review()), Review::Skipped),
        Err(_) => review::Verdict {
            errors: Vec::new(),
            warnings: vec![format!(
                "pgop's webhook did not finish its checks within {REVIEW_TIMEOUT:?}; the operator checks the spec again"
            )],
        },
    };
    let result = if !verdict.errors.is_empty() {
        Review::Refused
    } else if !verdict.warnings.is_empty() {
        Review::Unchecked
    } else {
        Review::Allowed
    };
    (axum::Json(respond(response, verdict).into_review()), result)
}

/// An answer and what it was, for the metrics.
type Answered = (axum::Json<AdmissionReview<DynamicObject>>, Review);

/// The request of a review of a CREATE or UPDATE, and the response to fill in; anything
/// else is answered here (an unreadable review as invalid, other operations allowed).
fn open(
    review: AdmissionReview<DynamicObject>,
) -> Result<(AdmissionRequest<DynamicObject>, AdmissionResponse), Box<Answered>> {
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(e) => {
            return Err(Box::new((
                axum::Json(AdmissionResponse::invalid(e).into_review()),
                Review::Invalid,
            )));
        }
    };
    let response = AdmissionResponse::from(&request);
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Err(Box::new((
            axum::Json(response.into_review()),
            Review::Allowed,
        )));
    }
    Ok((request, response))
}

/// A PostgresCluster under review, in `v1alpha1` whatever it was written in, and whether
/// that was `v1beta1` (the refusal then names `v1beta1`'s fields).
struct Versioned {
    cluster: pgop_api::PostgresCluster,
    v1beta1: bool,
}

fn decode_cluster(object: Option<&DynamicObject>) -> Result<Versioned, String> {
    let beta = object
        .and_then(|o| o.types.as_ref())
        .is_some_and(|t| t.api_version == pgop_api::v1beta1::API_VERSION);
    if !beta {
        return decode(object).map(|cluster| Versioned {
            cluster,
            v1beta1: false,
        });
    }
    let beta: pgop_api::v1beta1::PostgresCluster = decode(object)?;
    Ok(Versioned {
        cluster: pgop_api::PostgresCluster {
            metadata: beta.metadata,
            spec: beta.spec.into(),
            status: beta.status,
        },
        v1beta1: true,
    })
}

/// A verdict on a `v1alpha1` cluster, worded for the `v1beta1` object it came from.
fn in_v1beta1(verdict: review::Verdict) -> review::Verdict {
    use pgop_api::v1beta1::{field_path, with_field_paths};
    review::Verdict {
        errors: verdict
            .errors
            .into_iter()
            .map(|e| pgop_api::FieldError {
                field: field_path(&e.field),
                message: with_field_paths(&e.message),
            })
            .collect(),
        warnings: verdict
            .warnings
            .iter()
            .map(|w| with_field_paths(w))
            .collect(),
    }
}

fn decode<K: DeserializeOwned>(object: Option<&DynamicObject>) -> Result<K, String> {
    let object = object.ok_or("the request carries no object")?;
    serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("the object does not decode: {e}"))
}

/// The response for `verdict`: refused with every field (message and causes), or allowed;
/// warnings either way.
fn respond(response: AdmissionResponse, verdict: review::Verdict) -> AdmissionResponse {
    let mut response = if verdict.errors.is_empty() {
        response
    } else {
        let message = verdict.message();
        let mut denied = response.deny(&message);
        denied.result = Status::failure(&message, "Invalid")
            .with_code(422)
            .with_details(StatusDetails {
                causes: verdict
                    .errors
                    .iter()
                    .map(|e| StatusCause {
                        reason: "FieldValueInvalid".to_string(),
                        message: e.message.clone(),
                        field: e.field.clone(),
                    })
                    .collect(),
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
                retry_after_seconds: 0,
            });
        denied
    };
    if !verdict.warnings.is_empty() {
        response.warnings = Some(verdict.warnings);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn review(objects: Vec<serde_json::Value>, desired: &str) -> ConversionReview {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "u-7", "desiredAPIVersion": desired, "objects": objects}
        }))
        .expect("a ConversionReview")
    }

    fn cluster(name: &str, spec: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "database.example.com/v1alpha1",
            "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": spec
        })
    }

    #[test]
    fn a_conversion_review_converts_every_object_and_answers_its_uid() {
        let objects = vec![
            cluster("a", json!({"replicas": 2, "storage": {"size": "1Gi"}})),
            cluster("b", json!({"replicas": 3, "storage": {"size": "2Gi"}})),
        ];
        let (answer, result) = conversion(review(objects, pgop_api::v1beta1::API_VERSION));
        assert_eq!(result, Review::Converted);
        let response = answer.response.expect("a response");
        assert_eq!(response.uid, "u-7");
        assert_eq!(
            response.result.status,
            Some(kube::core::response::StatusSummary::Success)
        );
        let instances: Vec<_> = response
            .converted_objects
            .iter()
            .map(|o| {
                (
                    o["metadata"]["name"].clone(),
                    o["spec"]["instances"].clone(),
                )
            })
            .collect();
        assert_eq!(instances, [(json!("a"), json!(2)), (json!("b"), json!(3))]);
        assert!(
            response
                .converted_objects
                .iter()
                .all(|o| o["apiVersion"] == pgop_api::v1beta1::API_VERSION)
        );
    }

    #[test]
    fn a_conversion_that_fails_names_the_object_and_converts_nothing() {
        let objects = vec![
            cluster("good", json!({"storage": {"size": "1Gi"}})),
            cluster(
                "bad",
                json!({"replicas": "three", "storage": {"size": "1Gi"}}),
            ),
        ];
        let (answer, result) = conversion(review(objects, pgop_api::v1beta1::API_VERSION));
        assert_eq!(result, Review::Invalid);
        let response = answer.response.expect("a response");
        assert_eq!(response.uid, "u-7");
        assert!(response.converted_objects.is_empty());
        assert_eq!(
            response.result.status,
            Some(kube::core::response::StatusSummary::Failure)
        );
        assert!(
            response.result.message.contains("PostgresCluster \"bad\""),
            "{}",
            response.result.message
        );
        let (answer, result) = conversion(
            serde_json::from_value(json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview"
            }))
            .expect("a review without a request"),
        );
        assert_eq!(result, Review::Invalid);
        assert!(answer.response.is_some());
    }

    #[test]
    fn a_v1beta1_cluster_is_reviewed_as_v1alpha1_and_refused_in_v1beta1_names() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": pgop_api::v1beta1::API_VERSION,
            "kind": "PostgresCluster",
            "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"instances": 3, "storage": {"size": "1Gi"},
                     "ha": {"synchronous": {"standbys": 3}}}
        }))
        .expect("a DynamicObject");
        let Versioned { cluster, v1beta1 } = decode_cluster(Some(&object)).expect("decoded");
        assert!(v1beta1);
        assert_eq!(cluster.spec.replicas, 3);
        assert_eq!(cluster.spec.replication.synchronous, 3);
        let errors = pgop_api::validate(&cluster.spec).expect_err("too many standbys");
        let worded = in_v1beta1(review::Verdict {
            errors,
            warnings: vec!["spec.affinity.nodeSelector was not checked".into()],
        });
        assert_eq!(worded.errors[0].field, "spec.ha.synchronous.standbys");
        assert!(
            worded.errors[0].message.contains("spec.instances"),
            "{}",
            worded.errors[0].message
        );
        assert_eq!(
            worded.warnings,
            ["spec.scheduling.nodeSelector was not checked"]
        );
        // v1alpha1 stays as it is.
        let mut alpha = object.clone();
        if let Some(t) = alpha.types.as_mut() {
            t.api_version = "database.example.com/v1alpha1".into();
        }
        let decoded = decode_cluster(Some(&alpha)).expect("decoded");
        assert!(!decoded.v1beta1);
        assert_eq!(
            decoded.cluster.spec.replicas, 1,
            "v1alpha1 has no instances field"
        );
    }
}
