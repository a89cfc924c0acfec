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
