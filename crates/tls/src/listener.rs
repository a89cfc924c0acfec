//! An HTTPS listener for axum whose TLS configuration can change while it runs: each
//! connection is accepted with the configuration current at that moment, so a renewed
//! certificate is used from the next connection on, without a restart. Handshakes run
//! concurrently, each bounded by [`HANDSHAKE_TIMEOUT`]: a slow or hostile client holds up
//! only its own connection. Until a configuration is published, connections are closed at
//! once.
//!
//! Used by the instance manager's mutual-TLS endpoint and the operator's admission
//! webhooks.

use rustls::ServerConfig;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;

/// A client has this long to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The configuration connections are accepted with; `None` until there is one.
pub type ServerTls = watch::Receiver<Option<Arc<ServerConfig>>>;

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
                    tracing::info!(%peer, error = %e, "refused a TLS client")
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
