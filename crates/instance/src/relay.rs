//! The Pod's loopback relayed to a server that listens on the Pod's address only
//! (PostgreSQL in instance Pods, PgBouncer in pooler Pods): `kubectl port-forward` (so
//! `kubectl pgop psql`) connects to the Pod's loopback. Plain TCP: TLS and authentication
//! stay the server's, end to end; the server sees the connection come from the Pod's own
//! address.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use tokio::net::{TcpListener, TcpStream};

/// Relays `127.0.0.1:<port>` to `<pod_ip>:<port>` until the process exits. Nothing for a
/// loopback or unspecified Pod address (the local node, whose Pods share the host's
/// network), nor when the port is taken (a warning).
pub async fn loopback_relay(pod_ip: IpAddr, port: u16) {
    if pod_ip.is_loopback() || pod_ip.is_unspecified() {
        return;
    }
    let listener = match TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
        Ok(l) => l,
        Err(error) => {
            tracing::warn!(%error, port, "no relay from the Pod's loopback to the server (kubectl port-forward will not reach it)");
            return;
        }
    };
    relay(listener, SocketAddr::new(pod_ip, port)).await;
}

/// Every connection `listener` accepts, copied both ways to a new connection to `to`.
pub async fn relay(listener: TcpListener, to: SocketAddr) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            if let Ok(mut outbound) = TcpStream::connect(to).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_go_both_ways_through_the_relay() {
        let server = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let server_addr = server.local_addr().expect("addr");
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let front_addr = front.local_addr().expect("addr");
        tokio::spawn(relay(front, server_addr));
        let echo = tokio::spawn(async move {
            let (mut s, _) = server.accept().await.expect("accept");
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).await.expect("read");
            buf.reverse();
            s.write_all(&buf).await.expect("write");
        });
        let mut client = TcpStream::connect(front_addr).await.expect("connect");
        client.write_all(b"hello").await.expect("write");
        let mut back = [0u8; 5];
        client.read_exact(&mut back).await.expect("read");
        assert_eq!(&back, b"olleh");
        echo.await.expect("echo");
    }

    #[tokio::test]
    async fn no_relay_for_a_loopback_pod_address() {
        // Returns at once instead of binding 127.0.0.1:<port> (the local node's Pods share it).
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            loopback_relay("127.0.0.1".parse().expect("ip"), 1),
        )
        .await
        .expect("returned");
    }
}
