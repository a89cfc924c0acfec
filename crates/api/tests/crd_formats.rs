//! Every format the CRD checks with a pattern (quantity, cron, time zone, names, bucket,
//! URL, time, LSN, pg_hba line, identifier) is judged alike by the real API server (dry-run
//! creates) and by the Rust checks in `pgop_api::formats` and `validate`.

mod common;

use common::{Result, dynamic_api, setup};

use kube::api::{DynamicObject, PostParams};
use pgop_api::{PostgresCluster, formats};
use serde_json::{Value, json};

/// Where a sample goes in a valid spec, and the Rust function that judges it.
struct Format {
    name: &'static str,
    set: fn(&mut Value, &str),
    rust: fn(&str) -> bool,
    samples: &'static [&'static str],
}

/// A valid spec with a slot for every format.
fn format_base() -> Value {
    json!({
        "replicas": 3,
        "storage": {"size": "1Gi"},
        "backup": {
            "schedule": "0 2 * * *",
            "timezone": "UTC",
            "store": {"volume": {"claimName": "backups"}},
        },
        "bootstrap": {"recovery": {"store": {"s3": {
            "bucket": "pg-backups",
            "endpoint": "https://minio:9000",
            "credentialsSecret": {"name": "s3"},
        }}, "sourceCluster": "old"}},
    })
}

const FORMATS: &[Format] = &[
    Format {
        name: "quantity",
        set: |s, v| s["storage"]["size"] = json!(v),
        rust: formats::is_quantity,
        samples: &[
            "1", "10Gi", "500M", "1.5Ti", "0.5Gi", "100k", "0", "0Gi", "0.0", "01Gi", "1.", ".5",
            "1e9", "100m", "10 Gi", "10gi", "1Gib", "-1Gi",
        ],
    },
    Format {
        name: "cron",
        set: |s, v| s["backup"]["schedule"] = json!(v),
        rust: formats::is_cron,
        samples: &[
            "0 2 * * *",
            "*/15 * * * *",
            "0,30 8-18 * * 1-5",
            "59 23 31 12 7",
            "05 04 01 01 0",
            "0 0 1-31/2 * *",
            "0 2 * *",
            "0 2 * * * *",
            "0  2 * * *",
            "60 2 * * *",
            "0 24 * * *",
            "0 2 0 * *",
            "0 2 * 13 *",
            "0 2 * * 8",
            "0 2 * * 01",
            "*/0 * * * *",
            "*/100 * * * *",
            "0 2 * * MON",
            "@daily",
            "1- 2 * * *",
        ],
    },
    Format {
        name: "timezone",
        set: |s, v| s["backup"]["timezone"] = json!(v),
        rust: formats::is_timezone,
        samples: &[
            "UTC",
            "Europe/Berlin",
            "America/Argentina/Buenos_Aires",
            "Etc/GMT+5",
            "/UTC",
            "Europe/",
            "Europe//Berlin",
            "1UTC",
            "Europe Berlin",
        ],
    },
    Format {
        name: "claim name",
        set: |s, v| s["backup"]["store"]["volume"]["claimName"] = json!(v),
        rust: formats::is_dns_subdomain,
        samples: &["backups", "my-pvc.v1", "a", "-a", "a-", "A", "a..b", "a_b"],
    },
    Format {
        name: "bucket",
        set: |s, v| s["bootstrap"]["recovery"]["store"]["s3"]["bucket"] = json!(v),
        rust: formats::is_bucket,
        samples: &["pg-backups.eu", "abc", "ab", "-abc", "abc-", "ABC", "a_b_c"],
    },
    Format {
        name: "endpoint",
        set: |s, v| s["bootstrap"]["recovery"]["store"]["s3"]["endpoint"] = json!(v),
        rust: formats::is_url,
        samples: &[
            "https://minio.storage:9000",
            "http://127.0.0.1:9000/",
            "https://s3.example.com/a/b",
            "minio:9000",
            "https://",
            "https:///x",
            "ftp://x",
            "https://a b",
        ],
    },
    Format {
        name: "target time",
        set: |s, v| s["bootstrap"]["recovery"]["targetTime"] = json!(v),
        rust: formats::is_timestamp,
        samples: &[
            "2025-01-31T12:00:00Z",
            "2025-01-31T23:59:59.123456+01:00",
            "2025-12-01T00:00:00-05:30",
            "2025-01-31",
            "2025-01-31 12:00:00Z",
            "2025-13-01T00:00:00Z",
            "2025-01-32T00:00:00Z",
            "2025-01-31T24:00:00Z",
            "2025-01-31T12:00:00",
            "2025-01-31T12:00:00.Z",
            "2025-01-31T12:00:00+1:00",
        ],
    },
    Format {
        name: "target LSN",
        set: |s, v| s["bootstrap"]["recovery"]["targetLsn"] = json!(v),
        rust: formats::is_lsn,
        samples: &[
            "0/3000060",
            "FFFFFFFF/ffffffff",
            "0",
            "0/",
            "/1",
            "0/123456789",
            "g/1",
        ],
    },
    Format {
        name: "pg_hba line",
        set: |s, v| s["postgresql"] = json!({"pgHba": [v]}),
        rust: formats::is_hba_line,
        samples: &["host all all 10.0.0.0/8 scram-sha-256", "", "a\nb", "a\rb"],
    },
    Format {
        name: "database name",
        set: |s, v| {
            s["bootstrap"] = json!({"initdb": {"database": v}});
        },
        rust: formats::is_identifier,
        samples: &["app", "_x1", "1app", "App", "my-app"],
    },
];

#[tokio::test]
async fn every_format_is_judged_alike_by_the_api_server_and_by_rust() -> Result {
    let (client, ns) = setup("api-formats").await?;
    let api = dynamic_api(client, ns.name());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut disagreements = Vec::new();
    for format in FORMATS {
        for sample in format.samples {
            let mut spec = format_base();
            (format.set)(&mut spec, sample);
            let object: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "database.example.com/v1alpha1",
                "kind": "PostgresCluster",
                "metadata": {"name": "formats"},
                "spec": spec,
            }))?;
            let server = match api.create(&dry_run, &object).await {
                Ok(_) => true,
                Err(kube::Error::Api(status)) if status.code == 422 => false,
                Err(other) => return Err(other.into()),
            };
            let rust = (format.rust)(sample);
            if server != rust {
                disagreements.push(format!(
                    "{} {sample:?}: API server accepts: {server}, Rust accepts: {rust}",
                    format.name
                ));
            }
            // The whole spec must be judged alike too, not only the format function.
            let typed: PostgresCluster = serde_json::from_value(serde_json::to_value(&object)?)?;
            let validated = pgop_api::validate(&typed.spec).is_ok();
            if server != validated {
                disagreements.push(format!(
                    "{} {sample:?}: API server accepts: {server}, validate accepts: {validated}",
                    format.name
                ));
            }
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    ns.delete().await?;
    Ok(())
}
