//! An HTTPS endpoint on 127.0.0.1 that the API server calls back: the conversion webhook
//! of a CRD serving two versions, for tests that run no operator (or whose operator's own
//! webhook is not the one the CRD names).
//!
//! One per process, on a thread and a runtime of its own: the tests of a binary run on
//! runtimes of their own, each gone when its test ends, and they share one control plane
//! (and so one CRD) that outlives all of them. Its authority is made at start and lives
//! in memory only.
//!
//! The server speaks just enough HTTP/1.1 for the API server's webhook client: a `POST`
//! with a `Content-Length` body, answered `200` with the handler's JSON, connections kept
//! alive.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Turns a request body (JSON) into a response body (JSON).
pub type Handler = fn(&[u8]) -> Vec<u8>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to make the callback endpoint's certificate")]
    Certificate(#[source] rcgen::Error),
    #[error("failed to set up the callback endpoint's TLS")]
    Tls(#[source] rustls::Error),
    #[error("failed to start the callback endpoint")]
    Start(#[source] std::io::Error),
    #[error("the callback endpoint failed to start earlier in this process: {0}")]
    Earlier(String),
}

/// Where the endpoint listens and the authority the API server must trust.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `https://127.0.0.1:PORT`; every path is answered by the handler.
    pub base: String,
    /// The authority's certificate (PEM): a `clientConfig.caBundle`.
    pub ca_bundle: String,
}

impl Endpoint {
    /// The endpoint's URL with `path` (e.g. `/convert`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// The process's endpoint, started by the first call with `handler`; later calls get the
/// same endpoint (and the first handler: a process has one).
pub fn endpoint(handler: Handler) -> Result<&'static Endpoint, Error> {
    static STARTED: OnceLock<Result<Endpoint, String>> = OnceLock::new();
    STARTED
        .get_or_init(|| start(handler).map_err(|e| crate::error_chain(&e)))
        .as_ref()
        .map_err(|e| Error::Earlier(e.clone()))
}

fn start(handler: Handler) -> Result<Endpoint, Error> {
    let (ca_bundle, config) = tls()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(Error::Start)?;
    listener.set_nonblocking(true).map_err(Error::Start)?;
    let address: SocketAddr = listener.local_addr().map_err(Error::Start)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Start)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    std::thread::Builder::new()
        .name("testenv-callback".into())
        .spawn(move || runtime.block_on(serve(listener, acceptor, handler)))
        .map_err(Error::Start)?;
    Ok(Endpoint {
        base: format!("https://{address}"),
        ca_bundle,
    })
}

/// An authority and a serving certificate for 127.0.0.1 it signed.
fn tls() -> Result<(String, rustls::ServerConfig), Error> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate().map_err(Error::Certificate)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(Error::Certificate)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "testenv callback authority");
    let ca_cert = ca.self_signed(&ca_key).map_err(Error::Certificate)?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = KeyPair::generate().map_err(Error::Certificate)?;
    let mut leaf = CertificateParams::new(Vec::<String>::new()).map_err(Error::Certificate)?;
    leaf.subject_alt_names = vec![SanType::IpAddress(std::net::IpAddr::V4(
        std::net::Ipv4Addr::LOCALHOST,
    ))];
    let cert = leaf.signed_by(&key, &issuer).map_err(Error::Certificate)?;
    let key_der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(Error::Tls)?
    .with_no_client_auth()
    .with_single_cert(vec![cert.der().clone()], key_der)
    .map_err(Error::Tls)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((ca_cert.pem(), config))
}

async fn serve(
    listener: std::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    handler: Handler,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(error = %e, "the callback endpoint cannot listen");
            return;
        }
    };
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            if let Ok(stream) = acceptor.accept(stream).await {
                connection(stream, handler).await;
            }
        });
    }
}

/// The longest request head and body read.
const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Answers the requests of one connection until it closes or sends what is not understood.
async fn connection<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    handler: Handler,
) {
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if buffer.len() > MAX_HEAD {
                return;
            }
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
        let Some(length) = content_length(&head) else {
            let _ = stream
                .write_all(b"HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
            return;
        };
        if length > MAX_BODY {
            return;
        }
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 65536];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let body = handler(&buffer[head_end..head_end + length]);
        buffer.drain(..head_end + length);
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err()
            || stream.write_all(&body).await.is_err()
            || stream.flush().await.is_err()
        {
            return;
        }
    }
}

/// The `Content-Length` of a request head; `None` without one (or chunked).
fn content_length(head: &str) -> Option<usize> {
    head.lines().skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_of_a_request_is_read_from_its_head_in_any_case() {
        let head = "POST /convert HTTP/1.1\r\nHost: x\r\ncontent-LENGTH: 42\r\n\r\n";
        assert_eq!(content_length(head), Some(42));
        assert_eq!(content_length("POST / HTTP/1.1\r\nHost: x\r\n\r\n"), None);
    }

    #[tokio::test]
    async fn requests_on_one_connection_are_answered_by_the_handler_in_turn() {
        fn echo(body: &[u8]) -> Vec<u8> {
            [b"got ".as_slice(), body].concat()
        }
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(connection(server, echo));
        client
            .write_all(b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\none")
            .await
            .expect("write");
        client
            .write_all(b"POST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\ntwo")
            .await
            .expect("write");
        client.shutdown().await.expect("shutdown");
        let mut answers = String::new();
        client.read_to_string(&mut answers).await.expect("read");
        served.await.expect("served");
        let bodies: Vec<&str> = answers
            .split("HTTP/1.1 200 OK\r\n")
            .filter(|a| !a.is_empty())
            .map(|a| a.split("\r\n\r\n").nth(1).unwrap_or_default())
            .collect();
        assert_eq!(bodies, ["got one", "got two"]);
    }
}
