//! A cluster's certificates (see `pgop_tls`), each renewed [`RENEW_BEFORE_DAYS`] days
//! before it expires or as soon as it is not its authority's:
//! - the operator-to-manager channel: an authority in Secret `<cluster>-ca` (created once,
//!   read only by the operator) and the managers' serving certificate in Secret
//!   `<cluster>-manager-tls` (read by the instances). The operator's own client
//!   certificates live in memory only ([`ManagerClients`]);
//! - PostgreSQL: an authority in Secret `<cluster>-postgres-ca` (created once, read only by
//!   the operator), the server certificate in `<cluster>-server-tls` (every Service name,
//!   short and fully qualified, and every instance's name; issued anew when those change)
//!   and the replication user's client certificate in `<cluster>-replication-tls`.
//!
//! Here: their names, reading an authority from its Secret, and the operator's client
//! configurations. Which to keep and which to issue is decided in
//! `decide::certificates`.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, ResourceExt};
use pgop_api::constants::{CA_SECRET_SUFFIX, MANAGER_TLS_SECRET_SUFFIX};
use pgop_tls::{Authority, Usage};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How long a manager certificate is valid.
pub const MANAGER_CERT_DAYS: i64 = 90;
/// A manager certificate is renewed when it has fewer days than this left.
pub const RENEW_BEFORE_DAYS: i64 = 30;
/// How long an operator client certificate is valid; one is issued anew after a day.
const OPERATOR_CERT_DAYS: i64 = 2;
const OPERATOR_CERT_REISSUE: jiff::SignedDuration = jiff::SignedDuration::from_hours(24);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "Secret {name} does not hold a usable certificate authority (ca.crt, ca.key); delete \
         it to have a new one made (the managers then get new certificates)"
    )]
    BadAuthority {
        name: String,
        #[source]
        source: pgop_tls::Error,
    },
    #[error("Secret {name} lacks {key}")]
    MissingKey { name: String, key: &'static str },
    #[error("failed to issue a certificate")]
    Issue(#[source] pgop_tls::Error),
    #[error("failed to read Secret {name}")]
    Read {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {name} does not exist yet (the cluster's reconcile creates it)")]
    NoAuthority { name: String },
}

pub fn ca_secret_name(cluster: &str) -> String {
    format!("{cluster}{CA_SECRET_SUFFIX}")
}

pub fn manager_tls_secret_name(cluster: &str) -> String {
    format!("{cluster}{MANAGER_TLS_SECRET_SUFFIX}")
}

pub(super) fn text(secret: &Secret, key: &'static str) -> Result<String, Error> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .ok_or_else(|| Error::MissingKey {
            name: secret.name_any(),
            key,
        })
}

/// Which of a cluster's two authorities a Secret holds.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Managers,
    Postgres,
}

pub(super) fn authority_of(secret: &Secret, kind: Kind) -> Result<Authority, Error> {
    let name = secret.name_any();
    let bad = |source| Error::BadAuthority {
        name: name.clone(),
        source,
    };
    let cert = text(secret, "ca.crt")?;
    let key = text(secret, "ca.key")?;
    match kind {
        Kind::Managers => Authority::from_pem(&cert, &key),
        Kind::Postgres => Authority::from_pem_postgres(&cert, &key),
    }
    .map_err(bad)
}

struct Cached {
    ca_pem: String,
    issued_at: jiff::Timestamp,
    config: Arc<rustls::ClientConfig>,
}

/// The operator's client configurations for the managers, per cluster: a client
/// certificate from the cluster's authority, issued in memory and renewed daily.
#[derive(Default)]
pub struct ManagerClients {
    cache: Mutex<HashMap<(String, String), Cached>>,
}

impl ManagerClients {
    /// The configuration for `namespace/cluster`, whose authority is in Secret
    /// `<cluster>-ca` (read from the API server).
    pub async fn for_cluster(
        &self,
        client: &Client,
        namespace: &str,
        cluster: &str,
    ) -> Result<Arc<rustls::ClientConfig>, Error> {
        let name = ca_secret_name(cluster);
        let secret = Api::<Secret>::namespaced(client.clone(), namespace)
            .get_opt(&name)
            .await
            .map_err(|source| Error::Read {
                name: name.clone(),
                source,
            })?
            .ok_or(Error::NoAuthority { name })?;
        self.for_authority(
            namespace,
            cluster,
            &authority_of(&secret, Kind::Managers)?,
            jiff::Timestamp::now(),
        )
    }

    /// The configuration for `namespace/cluster` with this authority.
    pub fn for_authority(
        &self,
        namespace: &str,
        cluster: &str,
        authority: &Authority,
        now: jiff::Timestamp,
    ) -> Result<Arc<rustls::ClientConfig>, Error> {
        let key = (namespace.to_string(), cluster.to_string());
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.get(&key)
            && c.ca_pem == authority.cert_pem()
            && now.duration_since(c.issued_at) < OPERATOR_CERT_REISSUE
        {
            return Ok(c.config.clone());
        }
        let issued = authority
            .issue(Usage::OperatorClient, now, OPERATOR_CERT_DAYS)
            .map_err(Error::Issue)?;
        let config =
            pgop_tls::client_config(authority.cert_pem(), &issued.cert_pem, &issued.key_pem)
                .map_err(Error::Issue)?;
        cache.insert(
            key,
            Cached {
                ca_pem: authority.cert_pem().to_string(),
                issued_at: now,
                config: config.clone(),
            },
        );
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn client_configurations_are_cached_per_cluster_and_authority() {
        let now = ts("2026-12-01T12:00:00Z");
        let clients = ManagerClients::default();
        let a = Authority::generate(now).expect("authority");
        let first = clients.for_authority("ns", "db", &a, now).expect("config");
        let same = clients
            .for_authority("ns", "db", &a, ts("2026-12-02T11:59:59Z"))
            .expect("config");
        assert!(Arc::ptr_eq(&first, &same));
        let next_day = clients
            .for_authority("ns", "db", &a, ts("2026-12-02T12:00:00Z"))
            .expect("config");
        assert!(!Arc::ptr_eq(&first, &next_day));
        let b = Authority::generate(now).expect("authority");
        let other = clients.for_authority("ns", "db", &b, now).expect("config");
        assert!(
            !Arc::ptr_eq(&next_day, &other),
            "a new authority, a new certificate"
        );
    }
}
