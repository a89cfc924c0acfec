//! HTTP probes as kubelet runs them: GET, success on a 2xx or 3xx status, within a timeout.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Whether `GET http://ip:port/path` answers 200–399 within `timeout`.
pub async fn http_get(ip: &str, port: u16, path: &str, timeout: Duration) -> bool {
    tokio::time::timeout(timeout, get(ip, port, path))
        .await
        .ok()
        .flatten()
        .is_some_and(|code| (200..400).contains(&code))
}

async fn get(ip: &str, port: u16, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect((ip, port)).await.ok()?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\nUser-Agent: pgop-local-node\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut head = [0u8; 64];
    let mut read = 0;
    while read < 12 {
        let n = stream.read(&mut head[read..]).await.ok()?;
        if n == 0 {
            break;
        }
        read += n;
    }
    // "HTTP/1.1 200 OK"
    let line = std::str::from_utf8(&head[..read]).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}
