//! The manager's HTTP endpoints (axum): `/healthz`, `/readyz` and `/pg/status`. Read-only: it
//! must never change the instance (role changes come from the cluster status, not HTTP).

use crate::instance::Instance;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use pgop_api::constants::{PATH_HEALTHZ, PATH_PG_STATUS, PATH_READYZ};
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

/// The routes, for serving or testing.
pub fn router(instance: Arc<Instance>) -> Router {
    Router::new()
        .route(PATH_HEALTHZ, get(healthz))
        .route(PATH_READYZ, get(readyz))
        .route(PATH_PG_STATUS, get(pg_status))
        .with_state(instance)
}

/// Binds `addr` (so a port conflict is an error at once) and returns the server future,
/// which ends when `shutdown` completes.
pub async fn bind(
    addr: SocketAddr,
    instance: Arc<Instance>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = Result<(), Error>>), Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Listen(addr, e))?;
    let local = listener.local_addr().map_err(|e| Error::Listen(addr, e))?;
    let server = axum::serve(listener, router(instance)).with_graceful_shutdown(shutdown);
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
