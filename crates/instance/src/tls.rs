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

use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio_rustls::rustls::ServerConfig;

pub use pgop_tls::listener::{ServerTls, TlsListener};

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
