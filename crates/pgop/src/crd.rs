//! `pgop crd`: prints the CustomResourceDefinitions, the source of `deploy/crds/crds.yaml`.

use std::io::Write;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Writes every CRD as multi-document YAML to stdout.
pub fn run() -> Result<(), Error> {
    let yaml =
        pgop_api::crds_yaml().map_err(|e| format!("failed to render the CRDs as YAML: {e}"))?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(yaml.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("failed to write the CRDs to stdout: {e}"))?;
    Ok(())
}
