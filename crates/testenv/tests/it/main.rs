//! The test harness's own tests, in one test binary: `harness` (control planes, CRDs,
//! namespaces), `images` (the built images), `local_node` (the local node's Pods),
//! `real_nodes` (containerd, runc, kubelet and kube-proxy nodes). `hack/run-tests.py` runs
//! each module in a process of its own; `cargo test -p pgop-testenv --test it -- MODULE::`
//! runs one module.

mod harness;
mod images;
mod local_node;
mod real_nodes;
