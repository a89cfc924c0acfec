//! The pooler manager's HTTP endpoints: `/healthz` (the manager is up), `/readyz`
//! (PgBouncer runs, its admin console answers, it has a server to send connections to and
//! its pooler is still in the spec) and `/metrics` ([`super::stats::encode`]). Read-only.

use super::Pooler;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use pgop_api::constants::{PATH_HEALTHZ, PATH_METRICS, PATH_READYZ};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

pub use crate::http::Error;

pub fn router(pooler: Arc<Pooler>) -> Router {
    Router::new()
        .route(PATH_HEALTHZ, get(healthz))
        .route(PATH_READYZ, get(readyz))
        .route(PATH_METRICS, get(metrics))
        .with_state(pooler)
}

/// Binds `addr` (a port conflict is an error at once) and returns the server future,
/// which ends when `shutdown` completes.
pub async fn bind(
    addr: SocketAddr,
    pooler: Arc<Pooler>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = Result<(), Error>>), Error> {
    crate::http::serve(addr, router(pooler), shutdown).await
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(pooler): State<Arc<Pooler>>) -> (StatusCode, String) {
    match pooler.readiness().await {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

async fn metrics(State(pooler): State<Arc<Pooler>>) -> Response {
    crate::http::metrics_response(pooler.metrics().await)
}
