//! The admin kubeconfig, written so that `kubectl --kubeconfig` works against the harness.

use crate::pki::Pki;
use std::path::Path;

/// Renders a kubeconfig that names the certificate files (no inline secrets to copy around).
pub fn render(server: &str, pki: &Pki) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: testenv-admin
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: testenv
  context:
    cluster: testenv
    user: testenv-admin
    namespace: default
current-context: testenv
",
        ca = pki.ca_cert.display(),
        cert = pki.admin_cert.display(),
        key = pki.admin_key.display(),
    )
}

pub fn write(path: &Path, server: &str, pki: &Pki) -> std::io::Result<()> {
    std::fs::write(path, render(server, pki))
}
