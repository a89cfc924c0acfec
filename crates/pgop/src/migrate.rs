//! `pgop migrate-storage`: writes every PostgresCluster and PostgresBackup again in its
//! CRD's storage version, then drops the other versions from the CRD's
//! `status.storedVersions` (`pgop_operator::migrate`). Safe to run twice, and while the
//! operator runs; the operator's conversion webhook must be up. Then it counts the
//! ownerReferences that still name a PostgresCluster in another version than `v1beta1`
//! (`pgop_api::owner`): with storedVersions `[v1beta1]`, what decides whether `v1alpha1`
//! may stop being served.

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
    if crds.iter().any(|c| c == CRDS[0]) {
        let scan = pgop_operator::migrate::outdated_owner_references(&client).await;
        writeln!(stdout, "{}", owner_line(&scan))?;
    }
    Ok(())
}

/// How many ownerReferences still name a PostgresCluster in another version (at most
/// [`SHOWN`] of them by name), and what could not be checked.
fn owner_line(scan: &pgop_operator::migrate::OwnerScan) -> String {
    let version = pgop_api::constants::CLUSTER_OWNER_API_VERSION;
    let mut line = format!(
        "ownerReferences naming PostgresCluster in another version than {version}: {}",
        scan.outdated.len()
    );
    if !scan.outdated.is_empty() {
        let shown: Vec<&str> = scan
            .outdated
            .iter()
            .take(SHOWN)
            .map(String::as_str)
            .collect();
        let more = scan.outdated.len().saturating_sub(SHOWN);
        line.push_str(&format!(" ({}", shown.join(", ")));
        if more > 0 {
            line.push_str(&format!(", and {more} more"));
        }
        line.push_str("; the operator renames them on its next pass of their cluster)");
    }
    for unreadable in &scan.unreadable {
        line.push_str(&format!("\nnot checked: {unreadable}"));
    }
    line
}

/// How many objects [`owner_line`] names.
const SHOWN: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;
    use pgop_operator::migrate::OwnerScan;

    #[test]
    fn the_owner_line_counts_names_a_few_and_says_what_was_not_checked() {
        let none = owner_line(&OwnerScan::default());
        assert!(none.ends_with(": 0"), "{none}");
        let many = OwnerScan {
            outdated: (1..=12).map(|i| format!("Pod ns/db-{i}")).collect(),
            unreadable: vec!["Secret: forbidden".into()],
        };
        let line = owner_line(&many);
        assert!(line.contains(": 12 (Pod ns/db-1, "), "{line}");
        assert!(line.contains("Pod ns/db-10, and 2 more;"), "{line}");
        assert!(!line.contains("db-11"), "{line}");
        assert!(line.ends_with("\nnot checked: Secret: forbidden"), "{line}");
    }
}
