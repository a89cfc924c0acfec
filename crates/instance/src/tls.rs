//! The manager's authenticated endpoint: HTTPS with mutual TLS on
//! [`pgop_api::constants::MANAGER_TLS_PORT`], the only place the state-changing routes
//! (`POST /pg/backups`, `POST /pg/retention`) and the backup jobs answer. A client must
//! present a certificate the operator issued from the cluster's authority (see
//! `pgop_tls`); the handshake refuses anyone else, before any HTTP is read.
//!
//! The serving certificate, its key and the authority's certificate come from the Secret
//! `<cluster>-manager-tls`, read on every pass of the manager ([`Material::load`]); a
//! renewed certificate is used for the next connection, without a restart. Until the
//! first load, connections are closed at once.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;

/// A client has this long to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The configuration connections are accepted with; `None` until the material is loaded.
pub type ServerTls = watch::Receiver<Option<Arc<ServerConfig>>>;

/// The serving material as last loaded, and where a new configuration is published.
pub struct Material {
    tx: watch::Sender<Option<Arc<ServerConfig>>>,
    loaded: Mutex<Option<(String, String, String)>>,
}

impl Material {
    pub fn new() -> (Arc<Self>, ServerTls) {
        let (tx, rx) = watch::channel(None);
        (
            Arc::new(Self {
                tx,
                loaded: Mutex::new(None),
            }),
            rx,
        )
    }

    /// Uses this certificate, key and authority from now on; `Ok(true)` when they differ
    /// from the ones in use. Bad material leaves the previous configuration in use.
    pub fn load(
        &self,
        cert_pem: &str,
        key_pem: &str,
        ca_pem: &str,
    ) -> Result<bool, pgop_tls::Error> {
        let wanted = (
            cert_pem.to_string(),
            key_pem.to_string(),
            ca_pem.to_string(),
        );
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.as_ref() == Some(&wanted) {
            return Ok(false);
        }
        let config = pgop_tls::server_config(cert_pem, key_pem, ca_pem)?;
        self.tx.send_replace(Some(config));
        *loaded = Some(wanted);
        Ok(true)
    }

    pub fn is_loaded(&self) -> bool {
        self.tx.borrow().is_some()
    }
}

/// Accepts TCP connections on `addr` and completes their TLS handshakes concurrently (a
/// slow or hostile client holds up only its own connection); yields the established ones.
pub struct TlsListener {
    established: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl TlsListener {
    pub async fn bind(addr: SocketAddr, tls: ServerTls) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let (tx, established) = mpsc::channel(16);
        let acceptor = tokio::spawn(accept_loop(listener, tls, tx));
        Ok(Self {
            established,
            local,
            acceptor,
        })
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: ServerTls,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: do not spin.
                tracing::warn!(error = %e, "failed to accept a connection on the TLS port");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(config) = tls.borrow().clone() else {
            tracing::debug!(%peer, "no serving certificate yet: connection closed");
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = tx.send((stream, peer)).await;
                }
                Ok(Err(e)) => {
                    tracing::info!(%peer, error = %e, "refused a TLS client (no valid operator certificate)")
                }
                Err(_) => {
                    tracing::info!(%peer, "refused a TLS client (handshake not done within {HANDSHAKE_TIMEOUT:?})")
                }
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.established.recv().await {
            Some(established) => established,
            // The accept loop is gone (aborted): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
