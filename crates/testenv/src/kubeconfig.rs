//! Kubeconfigs that name certificate files (no inline secrets to copy around): the admin's,
//! so that `kubectl --kubeconfig` works against the harness, and the real nodes' kubelets
//! and kube-proxies.

use crate::pki::Pki;
use std::path::Path;

/// A kubeconfig for `server`, trusting `ca`, authenticating with `cert` and `key`.
pub fn render_with(server: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: testenv-user
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: testenv
  context:
    cluster: testenv
    user: testenv-user
    namespace: default
current-context: testenv
",
        ca = ca.display(),
        cert = cert.display(),
        key = key.display(),
    )
}

/// The admin kubeconfig.
pub fn render(server: &str, pki: &Pki) -> String {
    render_with(server, &pki.ca_cert, &pki.admin_cert, &pki.admin_key)
}

pub fn write(path: &Path, server: &str, pki: &Pki) -> std::io::Result<()> {
    std::fs::write(path, render(server, pki))
}
