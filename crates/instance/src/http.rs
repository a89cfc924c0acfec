//! The manager's HTTP endpoints (axum): `/healthz`, `/readyz`, `/pg/status`, `/metrics` in
//! plain HTTP, and over mutual TLS only (see [`crate::tls`]) also `/pg/backups` (backups on
//! request) and `/pg/retention` (retention of the store), the only things HTTP may start. It must never change the instance's role or configuration
//! (those come from the cluster status).

use crate::backups::Begin;
use crate::instance::{BackupRefused, Instance};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pgop_api::constants::{
    PATH_BACKUPS, PATH_HEALTHZ, PATH_METRICS, PATH_PG_STATUS, PATH_READYZ, PATH_RETENTION,
};
use pgop_api::instance_status::{BackupRequest, RetentionRequest};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to listen on {0}")]
    Listen(SocketAddr, #[source] std::io::Error),
    #[error("failed to serve HTTP")]
    Serve(#[source] std::io::Error),
}

/// The read-only routes of the plain-HTTP port ([`pgop_api::constants::MANAGER_PORT`]):
/// health, readiness, status and metrics, for the kubelet, Prometheus and the operator's
/// status probes. Nothing here changes anything.
pub fn router(instance: Arc<Instance>) -> Router {
    Router::new()
        .route(PATH_HEALTHZ, get(healthz))
        .route(PATH_READYZ, get(readyz))
        .route(PATH_PG_STATUS, get(pg_status))
        .route(PATH_METRICS, get(metrics))
        .route_layer(axum::middleware::from_fn(traced))
        .with_state(instance)
}

/// A request that names a trace (`traceparent`, sent by the operator from a reconcile)
/// is served in a span of that trace (pgop_telemetry), so the operator's pass and the
/// manager's work are one trace. Requests without one (the kubelet's probes, Prometheus)
/// make no span.
async fn traced(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use tracing::Instrument;
    let Some(parent) = pgop_telemetry::extract(request.headers()) else {
        return next.run(request).await;
    };
    // The route's template, never the path as sent (a backup's name is in it).
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let span = tracing::info_span!(
        target: pgop_telemetry::TRACE_ONLY,
        "http request",
        otel.kind = "server",
        otel.name = %format!("{} {route}", request.method()),
        traceparent = %parent,
        http.response.status_code = tracing::field::Empty,
    );
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}

/// Every route, the state-changing ones (backups, retention) and the backup jobs
/// included: served only over mutual TLS ([`bind_tls`]).
pub fn authenticated_router(instance: Arc<Instance>) -> Router {
    router(instance.clone()).merge(
        Router::new()
            .route(PATH_BACKUPS, post(start_backup))
            .route(&format!("{PATH_BACKUPS}/{{name}}"), get(backup_job))
            .route(PATH_RETENTION, post(retention))
            .route_layer(axum::middleware::from_fn(traced))
            .with_state(instance),
    )
}

/// Binds `addr` (so a port conflict is an error at once) for the read-only routes and
/// returns the server future, which ends when `shutdown` completes.
pub async fn bind(
    addr: SocketAddr,
    instance: Arc<Instance>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = Result<(), Error>>), Error> {
    serve(addr, router(instance), shutdown).await
}

/// Binds `addr` for `router` over plain HTTP (a port conflict is an error at once) and
/// returns the bound address and the server future, which ends when `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = Result<(), Error>>), Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Listen(addr, e))?;
    let local = listener.local_addr().map_err(|e| Error::Listen(addr, e))?;
    let server = axum::serve(listener, router).with_graceful_shutdown(shutdown);
    Ok((local, async move { server.await.map_err(Error::Serve) }))
}

/// Binds `addr` for every route over mutual TLS with the configuration `tls` holds (see
/// [`crate::tls`]); returns the server future, which ends when `shutdown` completes.
pub async fn bind_tls(
    addr: SocketAddr,
    instance: Arc<Instance>,
    tls: crate::tls::ServerTls,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = Result<(), Error>>), Error> {
    let listener = crate::tls::TlsListener::bind(addr, tls)
        .await
        .map_err(|e| Error::Listen(addr, e))?;
    let local = axum::serve::Listener::local_addr(&listener).map_err(|e| Error::Listen(addr, e))?;
    let server =
        axum::serve(listener, authenticated_router(instance)).with_graceful_shutdown(shutdown);
    Ok((local, async move { server.await.map_err(Error::Serve) }))
}

async fn healthz(State(instance): State<Arc<Instance>>) -> (StatusCode, &'static str) {
    if instance.healthy().await {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "postgresql is not answering\n",
        )
    }
}

async fn readyz(State(instance): State<Arc<Instance>>) -> (StatusCode, &'static str) {
    if instance.ready().await {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn pg_status(State(instance): State<Arc<Instance>>) -> Json<crate::status::PgStatus> {
    Json(instance.status().await)
}

/// `GET /metrics`: one fresh status, the backup jobs, the data volume's usage and the
/// certificates' expiry, in the OpenMetrics text format.
async fn metrics(State(instance): State<Arc<Instance>>) -> Response {
    let status = instance.status().await;
    let jobs = instance.backup_jobs();
    // The data volume as the status read it (one statvfs per scrape, not two).
    let usage = |v: pgop_api::instance_status::VolumeUsage| crate::metrics::Volume {
        capacity_bytes: v.capacity_bytes,
        used_bytes: v.used_bytes,
        available_bytes: v.available_bytes,
    };
    let (volume, wal_volume) = (status.volume.map(usage), status.wal_volume.map(usage));
    // Two small files: off the async threads, as any filesystem call.
    let files = crate::config::tls_files(&instance.options().layout);
    let certificates = tokio::task::spawn_blocking(move || crate::metrics::certificates(&files))
        .await
        .unwrap_or_default();
    let manager = crate::metrics::Manager {
        cluster: &instance.options().layout.cluster,
        crash_restarts: instance.restarts(),
        volume,
        wal_volume,
        certificates: &certificates,
    };
    metrics_response(crate::metrics::encode(&status, &jobs, manager))
}

/// A `/metrics` answer: the encoded exposition, or a 500 when it could not be encoded.
pub fn metrics_response(encoded: Result<String, std::fmt::Error>) -> Response {
    match encoded {
        Ok(body) => (
            [(
                axum::http::header::CONTENT_TYPE,
                crate::metrics::CONTENT_TYPE,
            )],
            body,
        )
            .into_response(),
        Err(std::fmt::Error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed to encode the metrics\n",
        )
            .into_response(),
    }
}

/// `POST /pg/backups`: 202 and the new job (with `verify`, the restore check follows the
/// backup in the same job); 200 and the job of that name if it exists
/// (whatever its phase); 409 while another backup runs; 400 without a store; 503 while
/// PostgreSQL does not run.
async fn start_backup(
    State(instance): State<Arc<Instance>>,
    Json(request): Json<BackupRequest>,
) -> Response {
    if request.name.is_empty() || request.name.len() > 253 {
        return (
            StatusCode::BAD_REQUEST,
            "the backup name must have 1 to 253 characters\n",
        )
            .into_response();
    }
    match instance.start_backup(&request.name, request.method, request.verify) {
        Ok(Begin::Started(job)) => (StatusCode::ACCEPTED, Json(job)).into_response(),
        Ok(Begin::Existing(job)) => (StatusCode::OK, Json(job)).into_response(),
        Ok(Begin::Busy { running }) => (
            StatusCode::CONFLICT,
            format!("another base backup is running on this instance: {running}\n"),
        )
            .into_response(),
        Err(refused @ BackupRefused::NoStore) => {
            (StatusCode::BAD_REQUEST, format!("{refused}\n")).into_response()
        }
        Err(refused @ BackupRefused::NotRunning) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{refused}\n")).into_response()
        }
    }
}

/// `POST /pg/retention`: 200 and what was removed; 400 without a store or with
/// `retentionDays` 0; 500 when the store fails (nothing more is removed then).
async fn retention(
    State(instance): State<Arc<Instance>>,
    Json(request): Json<RetentionRequest>,
) -> Response {
    if request.retention_days == 0 {
        return (
            StatusCode::BAD_REQUEST,
            "retentionDays must be at least 1\n",
        )
            .into_response();
    }
    match instance.retention(request.retention_days).await {
        Ok(done) => Json(done).into_response(),
        Err(e @ crate::instance::Error::NoStore) => {
            (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\n", crate::error_chain(&e)),
        )
            .into_response(),
    }
}

/// `GET /pg/backups/<name>`: the job, or 404 when this manager does not know it (it
/// restarted since, or never ran it).
async fn backup_job(State(instance): State<Arc<Instance>>, Path(name): Path<String>) -> Response {
    match instance.backup_job(&name) {
        Some(job) => Json(job).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no backup job {name} on this instance manager\n"),
        )
            .into_response(),
    }
}
