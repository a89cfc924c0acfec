//! The only way out of the nodes' network: a TCP proxy that listens inside the switch's
//! network namespace at [`crate::pki::NODE_FACING_API_ADDRESS`] and forwards every
//! connection to the API server's loopback port in the harness's own namespace. The
//! nodes get no route to the machine's network, and the API server stays on loopback.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;

/// Binds a listener inside the network namespace of process `pid`. A thread enters the
/// namespace, binds and exits; the socket stays in that namespace.
pub fn listen_in(pid: u32, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    in_netns(pid, move || {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })
}

/// Runs `f` on a short-lived thread that entered the network namespace of process `pid`:
/// the sockets it creates belong to that namespace.
pub fn in_netns<T: Send>(pid: u32, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns(2) on this short-lived thread only; the fd is valid for
                // the call (the File outlives the scope).
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                f()
            })
            .join()
            .map_err(|_| io::Error::other("the namespace thread panicked"))?
    })
}

/// A running proxy; dropping it closes the listener and every forwarded connection.
#[derive(Debug)]
pub struct ApiProxy {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ApiProxy {
    /// Forwards every connection accepted on `listener` to `127.0.0.1:<port>`, on a
    /// thread and runtime of its own (so that it outlives any test's runtime).
    pub fn start(listener: std::net::TcpListener, port: u16) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("testenv-api-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let serve = async {
                        loop {
                            let Ok((mut inbound, _)) = listener.accept().await else {
                                continue;
                            };
                            tokio::spawn(async move {
                                let Ok(mut outbound) =
                                    tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                                else {
                                    return;
                                };
                                let _ = inbound.set_nodelay(true);
                                let _ = outbound.set_nodelay(true);
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound)
                                    .await;
                            });
                        }
                    };
                    tokio::select! {
                        _ = serve => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime cancels every forwarding task: connections close.
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The API server's way into the nodes' network (its egress selection `cluster`: webhooks,
/// conversion webhooks, kubelets): an HTTP CONNECT proxy on a Unix socket of the
/// harness's that opens each tunnel from inside the switch's network namespace, to a Pod
/// or node address only. Until the nodes exist (the API server starts first) it refuses
/// every tunnel.
#[derive(Debug)]
pub struct ClusterEgress {
    switch: std::sync::Arc<std::sync::Mutex<Option<u32>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// The networks a tunnel may reach: the Pods' and the nodes'.
fn reachable(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            (a, b) == (10, 244) || (a, b, c) == (10, 250, 0)
        }
        std::net::IpAddr::V6(_) => false,
    }
}

/// Reads a CONNECT request's head (up to the blank line) and returns its target.
async fn connect_target(inbound: &mut tokio::net::UnixStream) -> io::Result<SocketAddr> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || inbound.read(&mut byte).await? == 0 {
            return Err(io::Error::other("no complete CONNECT request"));
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    match (words.next(), words.next()) {
        (Some("CONNECT"), Some(target)) => target
            .parse()
            .map_err(|_| io::Error::other(format!("not an IP:port target: {target}"))),
        _ => Err(io::Error::other("not a CONNECT request")),
    }
}

impl ClusterEgress {
    /// Listens on the Unix socket `path`, on a thread and runtime of its own.
    pub fn start(path: &std::path::Path) -> io::Result<Self> {
        let listener = std::os::unix::net::UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        let switch = std::sync::Arc::new(std::sync::Mutex::new(None::<u32>));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = switch.clone();
        let thread = std::thread::Builder::new()
            .name("testenv-cluster-egress".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::UnixListener::from_std(listener) else {
                        return;
                    };
                    let serve = async {
                        loop {
                            let Ok((mut inbound, _)) = listener.accept().await else {
                                continue;
                            };
                            let switch = shared.lock().ok().and_then(|s| *s);
                            tokio::spawn(async move {
                                use tokio::io::AsyncWriteExt;
                                let target = match connect_target(&mut inbound).await {
                                    Ok(target) if reachable(target.ip()) => target,
                                    _ => {
                                        let _ = inbound
                                            .write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n")
                                            .await;
                                        return;
                                    }
                                };
                                let Some(pid) = switch else {
                                    let _ = inbound
                                        .write_all(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")
                                        .await;
                                    return;
                                };
                                let dialed = tokio::task::spawn_blocking(move || {
                                    in_netns(pid, || {
                                        std::net::TcpStream::connect_timeout(
                                            &target,
                                            std::time::Duration::from_secs(5),
                                        )
                                    })
                                })
                                .await;
                                let outbound = match dialed {
                                    Ok(Ok(stream)) => stream
                                        .set_nonblocking(true)
                                        .and_then(|()| tokio::net::TcpStream::from_std(stream)),
                                    Ok(Err(e)) => Err(e),
                                    Err(e) => Err(io::Error::other(e)),
                                };
                                let Ok(mut outbound) = outbound else {
                                    let _ = inbound
                                        .write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
                                        .await;
                                    return;
                                };
                                if inbound
                                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                                let _ = outbound.set_nodelay(true);
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound)
                                    .await;
                            });
                        }
                    };
                    tokio::select! {
                        _ = serve => {}
                        _ = stopped => {}
                    }
                });
            })?;
        Ok(Self {
            switch,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Tunnels open from the network namespace of process `pid` (the switch) from now on.
    pub fn route_through(&self, pid: u32) {
        if let Ok(mut switch) = self.switch.lock() {
            *switch = Some(pid);
        }
    }
}

impl Drop for ClusterEgress {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn tunnels_reach_pods_and_nodes_only() {
        for (ip, ok) in [
            ("10.244.0.5", true),
            ("10.244.3.1", true),
            ("10.250.0.11", true),
            ("10.250.1.11", false),
            ("10.0.0.10", false),
            ("127.0.0.1", false),
            ("8.8.8.8", false),
            ("::1", false),
        ] {
            let parsed: std::net::IpAddr = ip.parse().expect("an address");
            assert_eq!(reachable(parsed), ok, "{ip}");
        }
    }

    async fn ask(socket: &std::path::Path, request: &str) -> String {
        let mut stream = tokio::net::UnixStream::connect(socket)
            .await
            .expect("connects");
        stream.write_all(request.as_bytes()).await.expect("writes");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer).await;
        answer
    }

    #[tokio::test]
    async fn other_targets_are_refused_and_nothing_is_tunnelled_before_the_nodes() {
        let dir = crate::workdir::WorkDir::create().expect("a directory");
        let socket = dir.path().join("egress.sock");
        let egress = ClusterEgress::start(&socket).expect("starts");
        let answer = ask(&socket, "CONNECT 93.184.216.34:443 HTTP/1.1\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        let answer = ask(&socket, "CONNECT node-1:10250 HTTP/1.1\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        let answer = ask(&socket, "GET / HTTP/1.1\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        let answer = ask(&socket, "CONNECT 10.244.0.5:9443 HTTP/1.1\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        drop(egress);
    }
}
