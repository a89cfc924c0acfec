//! pgop's certificates: for the channel between the operator and the instance managers,
//! and for PostgreSQL's own connections.
//!
//! Each PostgresCluster has two certificate authorities, whose keys only the operator reads:
//! one for the managers' channel (Secret `<cluster>-ca`, [`Authority::generate`]) and one
//! for PostgreSQL ([`Authority::generate_postgres`], see [`postgres`]). Kept apart, so that
//! a certificate PostgreSQL accepts (the replication client's, which every instance holds)
//! can never open a manager's endpoint.
//!
//! The managers' authority signs two kinds of certificates, told apart by their extended
//! key usage, which rustls checks on both ends:
//! - [`Usage::ManagerServer`]: the instance managers' serving certificate (Secret
//!   `<cluster>-manager-tls`, readable by the cluster's instances), for the name
//!   [`MANAGER_SERVER_NAME`], `serverAuth` only;
//! - [`Usage::OperatorClient`]: the operator's client certificate, `clientAuth` only, which
//!   never leaves the operator's memory.
//!
//! A manager therefore answers its state-changing endpoints only to a client holding a
//! certificate the operator issued for this cluster; an instance's own certificate cannot
//! stand in for it (wrong usage), nor can one of another cluster (another authority).
//! Both ends speak TLS 1.3 only.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::sync::Arc;

/// The name in every manager's serving certificate, which the operator verifies (it
/// connects to Pod IPs; the authority is per cluster, so one name serves every instance).
pub const MANAGER_SERVER_NAME: &str = "pgop-instance-manager";
/// The common name of the managers' authority's certificate.
const CA_COMMON_NAME: &str = "pgop instance-manager CA";
/// The common name of the PostgreSQL authority's certificate.
const POSTGRES_CA_COMMON_NAME: &str = "pgop PostgreSQL CA";
/// The common name of the admission webhooks' authority (`pgop operator`'s own, kept in a
/// Secret of its namespace; see `pgop_operator::webhook`).
const WEBHOOK_CA_COMMON_NAME: &str = "pgop webhook CA";
/// The common name of the operator's client certificates.
pub const OPERATOR_COMMON_NAME: &str = "pgop-operator";

/// How long a new authority is valid.
pub const CA_VALIDITY_DAYS: i64 = 3650;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to generate the {what}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("the {what} is not valid PEM")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("the {what} holds no certificate")]
    NoCertificate { what: &'static str },
    #[error("the {what} is not an X.509 certificate with a readable validity")]
    Validity { what: &'static str },
    #[error("the authority's key is not a key pgop can sign with")]
    Key(#[source] rcgen::Error),
    #[error("failed to build the TLS configuration ({what})")]
    Config {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    #[error("failed to build the client-certificate verifier")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
}

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// The instance managers' serving certificate.
    ManagerServer,
    /// The operator's client certificate.
    OperatorClient,
}

/// A certificate and its key, PEM-encoded, and the end of its validity.
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_after: jiff::Timestamp,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Issued")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// A cluster's certificate authority.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

fn generating(what: &'static str) -> impl Fn(rcgen::Error) -> Error {
    move |source| Error::Generate { what, source }
}

/// Midnight UTC of the day `days` from `now`'s day (negative: before).
fn day(now: jiff::Timestamp, days: i64) -> jiff::civil::Date {
    let date = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    date.checked_add(jiff::Span::new().days(days))
        .unwrap_or(date)
}

/// Sets `params`' validity: from the day before `now` (so that a clock a little behind
/// accepts the certificate) to midnight UTC `days` days after `now`'s day, which it
/// returns.
fn validity(params: &mut CertificateParams, now: jiff::Timestamp, days: i64) -> jiff::Timestamp {
    let ymd = |d: jiff::civil::Date| {
        rcgen::date_time_ymd(
            i32::from(d.year()),
            u8::try_from(d.month()).unwrap_or(1),
            u8::try_from(d.day()).unwrap_or(1),
        )
    };
    let end = day(now, days);
    params.not_before = ymd(day(now, -1));
    params.not_after = ymd(end);
    end.to_zoned(jiff::tz::TimeZone::UTC)
        .map(|z| z.timestamp())
        .unwrap_or(now)
}

/// The authority's parameters: the same every time, so that an authority read back from
/// its Secret signs certificates that chain to the certificate made when it was created.
fn ca_params(now: jiff::Timestamp, common_name: &str) -> Result<CertificateParams, Error> {
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(generating("authority"))?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name.push(DnType::CommonName, common_name);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut ca, now, CA_VALIDITY_DAYS);
    Ok(ca)
}

impl Authority {
    /// A new authority for the managers' channel, valid for [`CA_VALIDITY_DAYS`] from `now`.
    pub fn generate(now: jiff::Timestamp) -> Result<Self, Error> {
        Self::generate_named(now, CA_COMMON_NAME)
    }

    /// A new authority for PostgreSQL's certificates (server and clients).
    pub fn generate_postgres(now: jiff::Timestamp) -> Result<Self, Error> {
        Self::generate_named(now, POSTGRES_CA_COMMON_NAME)
    }

    /// A new authority named `common_name` (another issuer's, in tests: an authority's
    /// name must tell it apart from the others a peer trusts, which look up issuers by
    /// name).
    pub fn generate_named(now: jiff::Timestamp, common_name: &'static str) -> Result<Self, Error> {
        let key = KeyPair::generate().map_err(generating("authority key"))?;
        let params = ca_params(now, common_name)?;
        let cert = params.self_signed(&key).map_err(generating("authority"))?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A new authority for the admission webhooks' serving certificate.
    pub fn generate_webhook(now: jiff::Timestamp) -> Result<Self, Error> {
        Self::generate_named(now, WEBHOOK_CA_COMMON_NAME)
    }

    /// The webhooks' authority stored as `ca.crt` and `ca.key`.
    pub fn from_pem_webhook(cert_pem: &str, key_pem: &str) -> Result<Self, Error> {
        Self::from_pem_named(cert_pem, key_pem, WEBHOOK_CA_COMMON_NAME)
    }

    /// The managers' authority stored as `ca.crt` and `ca.key`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, Error> {
        Self::from_pem_named(cert_pem, key_pem, CA_COMMON_NAME)
    }

    /// The PostgreSQL authority stored as `ca.crt` and `ca.key`.
    pub fn from_pem_postgres(cert_pem: &str, key_pem: &str) -> Result<Self, Error> {
        Self::from_pem_named(cert_pem, key_pem, POSTGRES_CA_COMMON_NAME)
    }

    fn from_pem_named(
        cert_pem: &str,
        key_pem: &str,
        common_name: &'static str,
    ) -> Result<Self, Error> {
        first_cert(cert_pem, "authority certificate")?;
        let key = KeyPair::from_pem(key_pem).map_err(Error::Key)?;
        Ok(Self {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            issuer: Issuer::new(ca_params(jiff::Timestamp::now(), common_name)?, key),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The authority's key, PEM-encoded: for its Secret, nowhere else.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A new certificate for `usage`, valid from the day before `now` for `days` days.
    pub fn issue(&self, usage: Usage, now: jiff::Timestamp, days: i64) -> Result<Issued, Error> {
        let what = match usage {
            Usage::ManagerServer => "manager certificate",
            Usage::OperatorClient => "operator certificate",
        };
        let (names, common_name, eku) = match usage {
            Usage::ManagerServer => (
                vec![MANAGER_SERVER_NAME.to_string()],
                MANAGER_SERVER_NAME,
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            Usage::OperatorClient => (
                Vec::new(),
                OPERATOR_COMMON_NAME,
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
        };
        self.sign(what, names, common_name, eku, now, days)
    }

    /// PostgreSQL's serving certificate for these DNS names (the first is its common
    /// name). Only from the PostgreSQL authority ([`Authority::generate_postgres`]).
    pub fn issue_postgres_server(
        &self,
        names: &[String],
        now: jiff::Timestamp,
        days: i64,
    ) -> Result<Issued, Error> {
        let what = "PostgreSQL server certificate";
        let common_name = names.first().cloned().unwrap_or_default();
        self.sign(
            what,
            names.to_vec(),
            &common_name,
            ExtendedKeyUsagePurpose::ServerAuth,
            now,
            days,
        )
    }

    /// The admission webhooks' serving certificate for these names (DNS names, or IP
    /// addresses; the first is its common name). Only from the webhooks' authority
    /// ([`Authority::generate_webhook`]).
    pub fn issue_webhook_server(
        &self,
        names: &[String],
        now: jiff::Timestamp,
        days: i64,
    ) -> Result<Issued, Error> {
        let common_name = names.first().cloned().unwrap_or_default();
        self.sign(
            "webhook certificate",
            names.to_vec(),
            &common_name,
            ExtendedKeyUsagePurpose::ServerAuth,
            now,
            days,
        )
    }

    /// A PostgreSQL client certificate for database user `user` (its common name, which
    /// pg_hba's `cert` method matches against the user name).
    pub fn issue_postgres_client(
        &self,
        user: &str,
        now: jiff::Timestamp,
        days: i64,
    ) -> Result<Issued, Error> {
        self.sign(
            "PostgreSQL client certificate",
            Vec::new(),
            user,
            ExtendedKeyUsagePurpose::ClientAuth,
            now,
            days,
        )
    }

    fn sign(
        &self,
        what: &'static str,
        names: Vec<String>,
        common_name: &str,
        eku: ExtendedKeyUsagePurpose,
        now: jiff::Timestamp,
        days: i64,
    ) -> Result<Issued, Error> {
        let key = KeyPair::generate().map_err(generating(what))?;
        let mut params = CertificateParams::new(names).map_err(generating(what))?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![eku];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let not_after = validity(&mut params, now, days);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generating(what))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after,
        })
    }
}

fn first_cert(pem: &str, what: &'static str) -> Result<CertificateDer<'static>, Error> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or(Error::NoCertificate { what })?
        .map_err(|source| Error::Pem { what, source })
}

fn certs(pem: &str, what: &'static str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Error::Pem { what, source })?;
    if certs.is_empty() {
        return Err(Error::NoCertificate { what });
    }
    Ok(certs)
}

fn key(pem: &str, what: &'static str) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|source| Error::Pem { what, source })
}

fn roots(ca_pem: &str) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    for cert in certs(ca_pem, "authority certificate")? {
        roots.add(cert).map_err(|source| Error::Config {
            what: "trusted authority",
            source,
        })?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A manager's server configuration: its certificate, and a client certificate issued
/// by `ca_pem` required of every client (TLS 1.3 only).
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
) -> Result<Arc<ServerConfig>, Error> {
    let provider = provider();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(ca_pem)?),
        provider.clone(),
    )
    .build()
    .map_err(Error::Verifier)?;
    let config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|source| Error::Config {
            what: "protocol versions",
            source,
        })?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certs(cert_pem, "manager certificate")?,
            key(key_pem, "manager key")?,
        )
        .map_err(|source| Error::Config {
            what: "manager certificate",
            source,
        })?;
    Ok(Arc::new(config))
}

/// The admission webhooks' server configuration: this certificate chain and key, no client
/// certificate (the API server calls without one), TLS 1.2 and 1.3.
pub fn webhook_server_config(cert_pem: &str, key_pem: &str) -> Result<Arc<ServerConfig>, Error> {
    let config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|source| Error::Config {
            what: "protocol versions",
            source,
        })?
        .with_no_client_auth()
        .with_single_cert(
            certs(cert_pem, "webhook certificate")?,
            key(key_pem, "webhook key")?,
        )
        .map_err(|source| Error::Config {
            what: "webhook certificate",
            source,
        })?;
    Ok(Arc::new(config))
}

/// The operator's client configuration for one cluster: trusts only `ca_pem`, presents
/// `cert_pem` (TLS 1.3 only). Connect with [`manager_server_name`].
pub fn client_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<Arc<ClientConfig>, Error> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|source| Error::Config {
            what: "protocol versions",
            source,
        })?
        .with_root_certificates(roots(ca_pem)?)
        .with_client_auth_cert(
            certs(cert_pem, "operator certificate")?,
            key(key_pem, "operator key")?,
        )
        .map_err(|source| Error::Config {
            what: "operator certificate",
            source,
        })?;
    Ok(Arc::new(config))
}

/// The name the operator verifies in a manager's certificate.
pub fn manager_server_name() -> ServerName<'static> {
    // A constant, valid DNS name (a unit test parses it too).
    #[allow(clippy::expect_used)]
    ServerName::try_from(MANAGER_SERVER_NAME).expect("MANAGER_SERVER_NAME is a DNS name")
}

mod expiry;
pub mod listener;
pub mod postgres;

pub use expiry::not_after;

#[cfg(test)]
mod tests;
