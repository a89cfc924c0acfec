//! Pod IPs: each pod gets its own loopback address, so PostgreSQL and the instance
//! manager listen on podIP:5432 and podIP:8000 as they would in a real cluster.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// Hands out addresses in 127.0.0.0/8, skipping 127.0.0.x and any address where the
/// pod ports are already taken (another node, another test process).
#[derive(Debug)]
pub struct IpPool {
    next: Mutex<u32>,
    in_use: Mutex<HashSet<Ipv4Addr>>,
    ports: Vec<u16>,
}

impl IpPool {
    /// `ports`: ports a pod will listen on, checked free before an address is handed out.
    pub fn new(ports: Vec<u16>) -> Self {
        // Start somewhere that depends on the process, so parallel test processes rarely
        // probe the same addresses first, and on how many pools this process made: two
        // nodes of one test (two sites) never hand out one address to two pods, even
        // before either pod listens on it.
        static POOLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let made = POOLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 64;
        let seed = ((std::process::id() % 200 + 20) << 16) + (made << 10);
        Self {
            next: Mutex::new(seed),
            in_use: Mutex::new(HashSet::new()),
            ports,
        }
    }

    pub fn allocate(&self) -> Option<Ipv4Addr> {
        let mut next = self.next.lock().ok()?;
        let mut in_use = self.in_use.lock().ok()?;
        for _ in 0..100_000 {
            *next = (*next + 1) % (1 << 24);
            let [_, a, b, c] = next.to_be_bytes();
            if a == 0 || c == 0 || c == 255 {
                continue;
            }
            let ip = Ipv4Addr::new(127, a, b, c);
            if in_use.contains(&ip) {
                continue;
            }
            if self
                .ports
                .iter()
                .all(|p| TcpListener::bind((ip, *p)).is_ok())
            {
                in_use.insert(ip);
                return Some(ip);
            }
        }
        None
    }

    pub fn release(&self, ip: Ipv4Addr) {
        if let Ok(mut in_use) = self.in_use.lock() {
            in_use.remove(&ip);
        }
    }
}
