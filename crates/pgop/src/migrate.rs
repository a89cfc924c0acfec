//! `pgop migrate-storage`: writes every PostgresCluster and PostgresBackup again in its
//! CRD's storage version, then drops the other versions from the CRD's
//! `status.storedVersions` (`pgop_operator::migrate`). Safe to run twice, and while the
//! operator runs; the operator's conversion webhook must be up.

use std::io::Write;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The CRDs `pgop migrate-storage` migrates by default.
const CRDS: &[&str] = &[
    "postgresclusters.database.example.com",
    "postgresbackups.database.example.com",
];

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A CustomResourceDefinition to migrate; repeat the flag or separate by commas
    /// [default: postgresclusters.database.example.com and
    /// postgresbackups.database.example.com].
    #[arg(long = "crd", value_name = "NAME", value_delimiter = ',')]
    crds: Vec<String>,
}

pub async fn run(args: Args) -> Result<(), Error> {
    let crds: Vec<String> = if args.crds.is_empty() {
        CRDS.iter().map(|c| c.to_string()).collect()
    } else {
        args.crds
            .iter()
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect()
    };
    for crd in &crds {
        if !(crd.len() <= 253 && pgop_api::formats::is_dns_subdomain(crd)) {
            return Err(format!("--crd {crd:?} is not a CustomResourceDefinition name").into());
        }
    }
    let client = crate::kube_client("migrate-storage").await?;
    let mut stdout = std::io::stdout().lock();
    for crd in &crds {
        let report = pgop_operator::migrate::storage(&client, crd).await?;
        writeln!(
            stdout,
            "{crd}: {} objects written in {}, {} changed by others meanwhile; storedVersions [{}] -> [{}]",
            report.rewritten,
            report.storage_version,
            report.changed_meanwhile,
            report.stored_before.join(", "),
            report.storage_version,
        )?;
    }
    Ok(())
}
