//! Real nodes (containerd, runc, kubelet, kube-proxy in namespaces of their own) against
//! a testenv control plane. Needs root and the packages in `real_nodes::NODE_PACKAGES`.

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, PostParams};
use pgop_testenv::real_nodes::{Cut, NodesOptions, RealNodes};
use pgop_testenv::{ControlPlane, Options};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A control plane (with controller manager and scheduler) ready for real nodes.
async fn plane() -> ControlPlane {
    ControlPlane::start(
        Options::default()
            .with_controller_manager()
            .with_scheduler()
            .with_real_nodes(),
    )
    .await
    .expect("control plane")
}

fn images() -> pgop_testenv::images::Images {
    pgop_testenv::images::built().unwrap_or_else(|e| panic!("{e}"))
}

fn options(count: usize, images: &pgop_testenv::images::Images, dns: bool) -> NodesOptions {
    NodesOptions {
        count,
        images: images.archives(),
        sandbox_image: images.pause.name.clone(),
        bin_dir: None,
        dns_image: dns.then(|| images.coredns.name.clone()),
        infra_node: false,
    }
}

/// A Pod of the pgop image (Debian: bash, perl) running `script` with bash.
fn pod(image: &str, name: &str, node: &str, script: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{
                "name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["bash", "-c", script],
                "terminationMessagePolicy": "FallbackToLogsOnError"
            }]
        }
    }))
    .expect("pod")
}

/// Waits until the pod has terminated; returns (exit code, termination message).
async fn finished(pods: &Api<Pod>, name: &str) -> (i32, String) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = pods.get(name).await.expect("get pod");
        let terminated = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.clone());
        if let Some(t) = terminated {
            return (t.exit_code, t.message.unwrap_or_default());
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not finish: {:?}",
            p.status
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn running_ip(pods: &Api<Pod>, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = pods.get(name).await.expect("get pod");
        let status = p.status.clone().unwrap_or_default();
        let ready = status
            .container_statuses
            .as_ref()
            .and_then(|c| c.first())
            .is_some_and(|c| c.ready);
        if let (true, Some(ip)) = (ready, status.pod_ip.clone()) {
            return ip;
        }
        assert!(
            Instant::now() < deadline,
            "{name} is not running: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_two_nodes_reach_each_other_through_services_and_dns_only_until_partitioned() {
    let plane = plane().await;
    let images = images();
    let started = Instant::now();
    let nodes = RealNodes::start(&plane, options(2, &images, true))
        .await
        .expect("real nodes");
    println!("2 nodes and CoreDNS ready in {:?}", started.elapsed());
    let client = plane.client().expect("client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let services: Api<Service> = Api::namespaced(client, "default");

    let web = pod(
        &images.pgop.name,
        "web",
        "node-0",
        "exec perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalPort => 8080, \
         Listen => 16, ReuseAddr => 1) or die $!; \
         while ($c = $s->accept) { print $c \"pgop-ok\\n\"; close $c }'",
        json!({"app": "web"}),
    );
    pods.create(&PostParams::default(), &web)
        .await
        .expect("web");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
    }))
    .expect("service");
    let svc = services
        .create(&PostParams::default(), &svc)
        .await
        .expect("create service");
    let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).expect("cluster IP");
    let web_ip = running_ip(&pods, "web").await;

    // From the other node and from the same node: by Pod IP, by ClusterIP, by DNS name.
    // Then the guard: nothing off the machine answers, not even the machine's gateway.
    let script = format!(
        "set -e
get() {{ timeout 5 bash -c \"exec 3<>/dev/tcp/$1/$2 && head -n1 <&3\"; }}
[ \"$(get {web_ip} 8080)\" = pgop-ok ]; echo pod-ip-ok
[ \"$(get {cluster_ip} 80)\" = pgop-ok ]; echo cluster-ip-ok
[ \"$(get web.default.svc.cluster.local 80)\" = pgop-ok ]; echo dns-ok
for target in 192.0.2.1 1.1.1.1 10.0.0.99; do
  if timeout 3 bash -c \"exec 3<>/dev/tcp/$target/80\" 2>/dev/null; then
    echo escaped-to-$target; exit 3
  fi
done
echo pod-ip-ok cluster-ip-ok dns-ok contained > /dev/termination-log"
    );
    for (name, node) in [("client-far", "node-1"), ("client-near", "node-0")] {
        pods.create(
            &PostParams::default(),
            &pod(&images.pgop.name, name, node, &script, json!({})),
        )
        .await
        .expect("client");
    }
    for name in ["client-far", "client-near"] {
        let (code, message) = finished(&pods, name).await;
        assert_eq!(
            (code, message.trim()),
            (0, "pod-ip-ok cluster-ip-ok dns-ok contained"),
            "{name}: {message}"
        );
    }
    nodes.check_containment().expect("still contained");
    // The guard itself: a way off the node is found, then closed again.
    nodes
        .ip(0, "route add default via 10.250.0.1")
        .expect("add a default route");
    let breach = nodes
        .check_containment()
        .expect_err("a default route is a breach");
    assert!(breach.to_string().contains("default route"), "{breach}");
    nodes
        .ip(0, "route del default")
        .expect("remove the default route");
    nodes.check_containment().expect("contained again");

    // Partitions: node-1 cut off from node-0 but not from the API server, then from
    // everything, then healed.
    let api = format!("{}", plane.api_port());
    let reaches = |node: usize, address: &str, port: &str| {
        nodes
            .exec_in_network(
                node,
                &[
                    "timeout",
                    "3",
                    "bash",
                    "-c",
                    &format!("exec 3<>/dev/tcp/{address}/{port}"),
                ],
            )
            .is_ok()
    };
    let api_address = "10.250.0.1";
    assert!(reaches(1, &web_ip, "8080") && reaches(1, api_address, &api));
    nodes.partition(1, Cut::FromNodes).expect("partition");
    assert!(
        !reaches(1, &web_ip, "8080"),
        "node-1 still reaches a Pod on node-0"
    );
    assert!(reaches(1, api_address, &api), "node-1 lost the API server");
    assert!(reaches(0, &web_ip, "8080"), "node-0 lost its own Pod");
    nodes.partition(1, Cut::Isolated).expect("isolate");
    assert!(!reaches(1, &web_ip, "8080") && !reaches(1, api_address, &api));
    nodes.heal(1).expect("heal");
    assert!(reaches(1, &web_ip, "8080") && reaches(1, api_address, &api));
    let prefix = nodes.cgroup_prefix();
    let pids = nodes.pids();
    let dir = nodes.dir().to_path_buf();
    drop(nodes);
    assert_nothing_left(&prefix, &pids, &dir);
}

/// No cgroup tree of the run, no process of its nodes and no directory is left.
fn assert_nothing_left(prefix: &str, pids: &[u32], dir: &std::path::Path) {
    let cgroups = pgop_testenv::real_nodes::cgroup::existing(prefix);
    assert!(
        cgroups.is_empty(),
        "cgroups left: {}",
        cgroups
            .iter()
            .map(|c| pgop_testenv::real_nodes::cgroup::describe(c))
            .collect::<Vec<_>>()
            .join("; ")
    );
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} outlived its node"
        );
    }
    assert!(!dir.exists(), "{} is left", dir.display());
}

/// Set in the child process of the kill test: it plays the run that gets killed.
const VICTIM_ENV: &str = "PGOP_TESTENV_REAL_NODES_VICTIM";

/// Starts a plane, one node and a Pod, prints what the parent needs, then waits to be
/// killed.
async fn victim() {
    let plane = plane().await;
    let images = images();
    let nodes = RealNodes::start(&plane, options(1, &images, false))
        .await
        .expect("real nodes");
    let pods: Api<Pod> = Api::namespaced(plane.client().expect("client"), "default");
    pods.create(
        &PostParams::default(),
        &pod(
            &images.pgop.name,
            "sleeper",
            "node-0",
            "exec sleep 3600",
            json!({}),
        ),
    )
    .await
    .expect("pod");
    running_ip(&pods, "sleeper").await;
    println!(
        "VICTIM-READY {} {} {}",
        nodes.dir().display(),
        nodes.cgroup_prefix(),
        nodes
            .pids()
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// Runs `test` (this same test) as a victim in a child process, sends it `signal` once
/// its node runs a Pod, and checks that nothing of the node is left.
async fn killed_run_leaves_nothing(test: &str, signal: libc::c_int) {
    if std::env::var_os(VICTIM_ENV).is_some() {
        return victim().await;
    }
    use std::io::BufRead;
    let host_before = host_sysctls();
    let exe = std::env::current_exe().expect("test binary");
    let mut child = std::process::Command::new(exe)
        .args(["--exact", &format!("real_nodes::{test}"), "--nocapture"])
        .env(VICTIM_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("victim");
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("VICTIM-READY "))
    })
    .await
    .expect("reader")
    .expect("the victim started its node and Pod");
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (dir, prefix) = (PathBuf::from(fields[1]), fields[2].to_string());
    let pids: Vec<u32> = fields[3]
        .split(',')
        .filter_map(|p| p.parse().ok())
        .collect();
    assert!(!pgop_testenv::real_nodes::cgroup::existing(&prefix).is_empty());
    // The kubelet has set its kernel tunables (it does before its node is Ready): in the
    // node's own copies, the machine's are as they were.
    for (key, kubelet) in pgop_testenv::real_nodes::KEPT_SYSCTLS {
        let copy = dir
            .join("node-0")
            .join(pgop_testenv::real_nodes::kept_sysctl_file(key));
        let set = std::fs::read_to_string(&copy).expect("the node's copy of a kernel tunable");
        assert_eq!(set.trim(), kubelet, "{key} as the kubelet saw it");
    }
    assert_eq!(
        host_sysctls(),
        host_before,
        "the machine's kernel tunables while the node runs"
    );

    // SIGKILL: no cleanup code of the victim runs. SIGINT: what Ctrl-C sends the test
    // process (its children lead process groups of their own, so only it gets it), whose
    // default action ends it without running destructors or exit hooks either.
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, signal) };
    child.wait().expect("reap");
    // The holders clean up on their own (the kernel sends them SIGTERM when the victim
    // dies): no sweep by a later run is needed for the containers to go. They keep at it
    // for up to DESTROY_LIMIT; this waits a little longer.
    let deadline =
        Instant::now() + pgop_testenv::real_nodes::cgroup::DESTROY_LIMIT + Duration::from_secs(30);
    loop {
        let cgroups = pgop_testenv::real_nodes::cgroup::existing(&prefix);
        let alive: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
            .collect();
        let node_dir = dir.join("node-0");
        if cgroups.is_empty() && alive.is_empty() && !node_dir.exists() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left after the kill: cgroups {cgroups:?} ({}), processes {alive:?}, {} exists: {}; \
             the holder's account of what it gave up on: {:?}",
            cgroups
                .iter()
                .map(|c| pgop_testenv::real_nodes::cgroup::describe(c))
                .collect::<Vec<_>>()
                .join("; "),
            node_dir.display(),
            node_dir.exists(),
            std::fs::read_to_string(dir.join("node-0.cleanup-left")).ok()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        host_sysctls(),
        host_before,
        "the machine's kernel tunables after the kill"
    );
}

/// The machine's values of the kernel tunables a kubelet sets.
fn host_sysctls() -> Vec<(&'static str, String)> {
    pgop_testenv::real_nodes::KEPT_SYSCTLS
        .iter()
        .map(|(key, _)| {
            let value = std::fs::read_to_string(format!("/proc/sys/{key}"))
                .unwrap_or_else(|e| panic!("/proc/sys/{key}: {e}"));
            (*key, value.trim().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_run_leaves_no_container_process_cgroup_or_directory() {
    killed_run_leaves_nothing(
        "a_killed_run_leaves_no_container_process_cgroup_or_directory",
        libc::SIGKILL,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_run_ctrl_c_leaves_no_container_process_cgroup_or_directory() {
    killed_run_leaves_nothing(
        "an_interrupted_run_ctrl_c_leaves_no_container_process_cgroup_or_directory",
        libc::SIGINT,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_that_panics_while_holding_nodes_leaves_nothing_behind() {
    let plane = plane().await;
    let images = images();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = {
        let options = options(1, &images, false);
        let plane = &plane;
        async move {
            let nodes = RealNodes::start(plane, options).await.expect("real nodes");
            let _ = tx.send((
                nodes.cgroup_prefix(),
                nodes.pids(),
                nodes.dir().to_path_buf(),
            ));
            panic!("a test failing while it holds real nodes");
        }
    };
    let panicked = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(task)).await;
    assert!(panicked.is_err(), "the task panicked");
    let (prefix, pids, dir) = rx.await.expect("the nodes started");
    assert_nothing_left(&prefix, &pids, &dir);
}

#[test]
fn the_sweep_kills_and_removes_the_cgroup_trees_of_dead_runs() {
    use pgop_testenv::real_nodes::cgroup;
    // A run that is gone: its pid no longer exists.
    let mut gone = std::process::Command::new("true").spawn().expect("true");
    let dead = gone.id();
    gone.wait().expect("reap");
    let name = format!("{}{dead}-0-node-0", cgroup::PREFIX);
    let tree = cgroup::Tree::create(&name).expect("a cgroup tree");
    // A container process it left behind, in the tree.
    let mut orphan = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("sleep");
    for entry in std::fs::read_dir("/sys/fs/cgroup")
        .expect("cgroup root")
        .flatten()
    {
        let procs = entry.path().join(&name).join("system/cgroup.procs");
        if procs.exists() {
            std::fs::write(&procs, orphan.id().to_string()).expect("join the tree");
        }
    }
    std::mem::forget(tree); // as if the run had died without cleaning up
    assert_eq!(cgroup::existing(&name), vec![name.clone()]);
    cgroup::sweep_dead();
    assert!(cgroup::existing(&name).is_empty(), "the sweep left {name}");
    let status = orphan.wait().expect("the orphan ended");
    assert!(!status.success(), "killed, not exited: {status}");

    // What a holder killed half-way through its own clean-up leaves: the tree in one
    // hierarchy only (the first it tried, where rmdir answered EBUSY), not in `freezer/`.
    let partial = format!("{}{dead}-0-node-1", cgroup::PREFIX);
    let tree = cgroup::Tree::create(&partial).expect("a cgroup tree");
    std::mem::forget(tree);
    let mut kept = None;
    for entry in std::fs::read_dir("/sys/fs/cgroup")
        .expect("cgroup root")
        .flatten()
    {
        let dir = entry.path().join(&partial);
        if entry.path().is_symlink() || !dir.exists() {
            continue;
        }
        if kept.is_none() && !entry.path().ends_with("freezer") {
            kept = Some(dir);
            continue;
        }
        std::fs::remove_dir(dir.join("system")).expect("rmdir system");
        std::fs::remove_dir(&dir).expect("rmdir");
    }
    let kept = kept.expect("a hierarchy other than the freezer");
    assert!(kept.exists());
    assert_eq!(cgroup::existing(&partial), vec![partial.clone()]);
    cgroup::sweep_dead();
    assert!(
        cgroup::existing(&partial).is_empty(),
        "the sweep left {}",
        kept.display()
    );
}
