//! `deploy/crds/crds.yaml` is generated, never hand-edited: it must equal `pgop crd`.

use std::path::Path;

const REGENERATE: &str = "cargo run -p pgop -- crd > deploy/crds/crds.yaml";

#[test]
fn deploy_crds_yaml_is_up_to_date() -> Result<(), Box<dyn std::error::Error>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds/crds.yaml");
    let generated = pgop_api::crds_yaml()?;
    let committed = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "failed to read {}: {e}; generate it with `{REGENERATE}`",
            path.display()
        )
    })?;
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || "the files differ in length".to_string(),
                |i| format!("first difference at line {}", i + 1),
            );
        panic!(
            "deploy/crds/crds.yaml is out of date with the API types ({line}); regenerate it with `{REGENERATE}`"
        );
    }
    Ok(())
}

#[test]
fn the_crds_are_parseable_yaml_of_both_kinds() -> Result<(), Box<dyn std::error::Error>> {
    let crds = pgop_testenv::crds::from_yaml(&pgop_api::crds_yaml()?)?;
    let names: Vec<String> = crds
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(
        names,
        [
            "postgresclusters.database.example.com",
            "postgresbackups.database.example.com"
        ]
    );
    Ok(())
}
