//! Start-up time and memory of real nodes: starts a control plane and N real nodes
//! (default 2) with CoreDNS, and prints a table of the time to Ready and the resident
//! memory of every node's processes, grouped by program; then stops them and prints how
//! long that took. Needs root and the images from `hack/build-images.sh`.
//!
//!     cargo run --release -p pgop-testenv --example real_nodes_footprint [N]

use pgop_testenv::real_nodes::{NodesOptions, RealNodes};
use pgop_testenv::{ControlPlane, Options};
use std::collections::BTreeMap;
use std::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let count: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(2);
    let images = pgop_testenv::images::built()?;
    let t = Instant::now();
    let plane = ControlPlane::start(
        Options::default()
            .with_controller_manager()
            .with_scheduler()
            .with_real_nodes(),
    )
    .await?;
    let plane_ready = t.elapsed();
    let t = Instant::now();
    let nodes = RealNodes::start(
        &plane,
        NodesOptions {
            count,
            images: images.archives(),
            sandbox_image: images.pause.name.clone(),
            bin_dir: None,
            dns_image: None,
            infra_node: false,
        },
    )
    .await?;
    let nodes_ready = t.elapsed();
    // Let the kubelets settle (first status updates, image GC scan) before measuring.
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;

    println!("control plane ready: {:.1} s", plane_ready.as_secs_f64());
    println!(
        "{count} nodes Ready (each on a copy of the images unpacked once): {:.1} s",
        nodes_ready.as_secs_f64()
    );
    println!();
    println!("| node | program | processes | RSS (MiB) |");
    println!("|---|---|---|---|");
    for (index, name) in nodes.names().iter().enumerate() {
        let mut by_program: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        for (_, comm, rss) in nodes.processes(index) {
            let e = by_program.entry(comm).or_default();
            e.0 += 1;
            e.1 += rss;
        }
        let mut total = 0;
        for (program, (n, rss)) in &by_program {
            total += rss;
            println!("| {name} | {program} | {n} | {:.1} |", *rss as f64 / 1024.0);
        }
        println!(
            "| {name} | **total** | | **{:.1}** |",
            total as f64 / 1024.0
        );
    }
    let t = Instant::now();
    drop(nodes);
    println!();
    println!(
        "nodes stopped and removed: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
