//! TLS for PostgreSQL connections made with tokio-postgres: the instance manager's check of
//! its primary, and the tests. The server is verified as `sslmode=verify-full` does it:
//! its certificate must chain to the given authority and name the expected host.
//!
//! Instances connect to each other by Pod IP (libpq's `hostaddr`) but verify the name
//! every instance's certificate carries, `<cluster>-rw` ([`PostgresTls::server_name`]),
//! as libpq does with `host=<cluster>-rw hostaddr=<ip>`.

use crate::{Error, certs, key, provider, roots};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// How many days PostgreSQL's certificates are valid for.
pub const CERT_DAYS: i64 = 90;

/// A tokio-postgres TLS connector that verifies the server (TLS 1.2 or 1.3) and may
/// present a client certificate.
#[derive(Clone)]
pub struct PostgresTls {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for PostgresTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl PostgresTls {
    /// Trusts only the authority `ca_pem`; presents `client` (certificate and key, PEM)
    /// when given.
    pub fn verify_full(ca_pem: &str, client: Option<(&str, &str)>) -> Result<Self, Error> {
        let builder = builder(provider())?.with_root_certificates(roots(ca_pem)?);
        let config = match client {
            Some((cert, key_pem)) => builder
                .with_client_auth_cert(
                    certs(cert, "client certificate")?,
                    key(key_pem, "client key")?,
                )
                .map_err(|source| Error::Config {
                    what: "client certificate",
                    source,
                })?,
            None => builder.with_no_client_auth(),
        };
        Ok(Self {
            config: Arc::new(config),
            server_name: None,
        })
    }

    /// Encrypts without verifying the server, as libpq's `sslmode=require`: for clients
    /// that hold no authority to check against (a certificate is still required of the
    /// server, and its handshake signature checked).
    pub fn without_verification() -> Result<Self, Error> {
        let provider = provider();
        let config = builder(provider.clone())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
            .with_no_client_auth();
        Ok(Self {
            config: Arc::new(config),
            server_name: None,
        })
    }

    /// Verifies the server under `name` whatever host the connection names (an IP).
    pub fn server_name(mut self, name: &str) -> Result<Self, Error> {
        let parsed = ServerName::try_from(name.to_string()).map_err(|_| Error::Config {
            what: "server name",
            source: rustls::Error::General(format!("{name:?} is not a DNS name or address")),
        })?;
        self.server_name = Some(parsed);
        Ok(self)
    }
}

/// A client configuration of TLS 1.3 or 1.2 (what PostgreSQL's `ssl_min_protocol_version`
/// allows), before its authorities.
fn builder(
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, Error> {
    ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|source| Error::Config {
            what: "protocol versions",
            source,
        })
}

/// Connects with `config` over TLS (`sslmode=require`: refused without it) when `tls` is
/// given, else without; the connection task runs until the client drops.
pub async fn connect(
    config: &mut tokio_postgres::Config,
    tls: Option<PostgresTls>,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let client = match tls {
        Some(tls) => {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
            let (client, connection) = config.connect(tls).await?;
            tokio::spawn(connection);
            client
        }
        None => {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            client
        }
    };
    Ok(client)
}

impl<S> MakeTlsConnect<S> for PostgresTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type TlsConnect = Connect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Connect, io::Error> {
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => ServerName::try_from(domain.to_string())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        };
        Ok(Connect {
            connector: tokio_rustls::TlsConnector::from(self.config.clone()),
            name,
        })
    }
}

/// Why a certificate a user brings for PostgreSQL cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("{0}")]
    Read(#[from] Error),
    #[error("its key is not the certificate's key, or not a key rustls can use")]
    Key(#[source] rustls::Error),
    #[error(
        "it does not verify against ca.crt for the name {name} (the instances verify that name)"
    )]
    Verify {
        name: String,
        #[source]
        source: rustls::Error,
    },
    #[error("{0:?} is not a DNS name")]
    Name(String),
}

/// Checks a server certificate a user brings (`tls.crt`: the certificate, then any
/// intermediates; `tls.key`; `ca.crt`): the key is the certificate's, and the chain
/// verifies against `ca.crt` for `name` now (valid, `serverAuth`, the name in it).
pub fn check_server_certificate(
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
    name: &str,
) -> Result<(), CheckError> {
    let provider = provider();
    let chain = certs(cert_pem, "tls.crt")?;
    rustls::sign::CertifiedKey::from_der(chain.clone(), key(key_pem, "tls.key")?, &provider)
        .map_err(CheckError::Key)?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots(ca_pem)?),
        provider,
    )
    .build()
    .map_err(|e| CheckError::Verify {
        name: name.to_string(),
        source: rustls::Error::General(e.to_string()),
    })?;
    let server_name =
        ServerName::try_from(name.to_string()).map_err(|_| CheckError::Name(name.to_string()))?;
    let (leaf, intermediates) = chain
        .split_first()
        .ok_or(CheckError::Read(Error::NoCertificate { what: "tls.crt" }))?;
    use rustls::client::danger::ServerCertVerifier;
    verifier
        .verify_server_cert(
            leaf,
            intermediates,
            &server_name,
            &[],
            rustls::pki_types::UnixTime::now(),
        )
        .map_err(|source| CheckError::Verify {
            name: name.to_string(),
            source,
        })?;
    Ok(())
}

/// Accepts any server certificate ([`PostgresTls::without_verification`]).
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// One connection's handshake (see [`PostgresTls`]).
pub struct Connect {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Stream<S>, io::Error>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = self.connector.connect(self.name, stream).await?;
            Ok(Stream(tls))
        })
    }
}

/// A TLS connection to PostgreSQL.
pub struct Stream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for Stream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM without channel binding: the server was verified already.
        ChannelBinding::none()
    }
}
