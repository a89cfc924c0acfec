//! The `v1beta1` PostgresCluster spec, and its conversions to and from `v1alpha1`.
//!
//! Not served yet (docs/api.md, "Plan: v1beta1"): these are the types the CRD's second
//! version and its conversion webhook will use. Every change from `v1alpha1` is a move or a
//! rename, so both versions hold the same information and each conversion is the other's
//! inverse; the tests convert generated specs of each version there and back.
//!
//! | `v1alpha1` | `v1beta1` |
//! |---|---|
//! | `replicas` | `instances` |
//! | `failoverDelay`, `switchoverTimeout` | `ha.failoverDelay`, `ha.switchoverTimeout` |
//! | `replication.synchronous`, `replication.dataDurability` | `ha.synchronous.standbys`, `ha.synchronous.dataDurability` |
//! | `postgresVersion`, `postgresql.parameters`, `postgresql.pgHba` | `postgresql.version`, `postgresql.parameters`, `postgresql.pgHba` |
//! | `backup.schedule`, `backup.verify` | `backup.base.schedule`, `backup.base.verify` |
//! | `backup.logicalSchedule` | `backup.logical.schedule` |
//! | `backup.retentionDays` | `backup.retention.days` |
//! | `affinity` | `scheduling` |

use crate::affinity::AffinitySpec;
use crate::cluster::{
    self as v1alpha1, BackupStore, BootstrapSpec, DataDurability, StorageSpec, TlsSpec,
};
use crate::credentials::CredentialsSpec;
use crate::network::NetworkPolicySpec;
use k8s_openapi::api::core::v1::ResourceRequirements;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A highly available PostgreSQL cluster, `v1beta1`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PostgresClusterSpec {
    /// Instances: one primary and `instances - 1` streaming standbys.
    #[serde(default = "default_instances")]
    pub instances: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    pub storage: StorageSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default)]
    pub postgresql: PostgresqlSpec,
    #[serde(default)]
    pub scheduling: AffinitySpec,
    #[serde(default)]
    pub ha: HaSpec,
    #[serde(default)]
    pub tls: TlsSpec,
    #[serde(default)]
    pub credentials: CredentialsSpec,
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapSpec>,
    #[serde(default)]
    pub paused: bool,
}

fn default_instances() -> i32 {
    1
}

/// PostgreSQL itself: its major version and configuration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PostgresqlSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pg_hba: Vec<String>,
}

/// High availability: when to fail over, how long a switchover may take, and the
/// synchronous standbys.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HaSpec {
    #[serde(default)]
    pub failover_delay: i32,
    #[serde(default = "default_switchover_timeout")]
    pub switchover_timeout: i32,
    #[serde(default)]
    pub synchronous: SynchronousSpec,
}

impl Default for HaSpec {
    fn default() -> Self {
        Self {
            failover_delay: 0,
            switchover_timeout: default_switchover_timeout(),
            synchronous: SynchronousSpec::default(),
        }
    }
}

fn default_switchover_timeout() -> i32 {
    60
}

/// Synchronous replication.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SynchronousSpec {
    /// Standbys that confirm each commit (0: asynchronous replication).
    #[serde(default)]
    pub standbys: i32,
    #[serde(default)]
    pub data_durability: DataDurability,
}

/// Backups: where they go, how long they are kept, and each method's schedule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<BackupStore>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default)]
    pub retention: RetentionSpec,
    #[serde(default)]
    pub base: BaseBackupSpec,
    #[serde(default)]
    pub logical: LogicalBackupSpec,
}

/// How long backups are kept.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSpec {
    #[serde(default = "default_retention_days")]
    pub days: i32,
}

impl Default for RetentionSpec {
    fn default() -> Self {
        Self {
            days: default_retention_days(),
        }
    }
}

fn default_retention_days() -> i32 {
    30
}

/// Base backups.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BaseBackupSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    #[serde(default)]
    pub verify: bool,
}

/// Logical backups.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LogicalBackupSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
}

impl From<v1alpha1::PostgresClusterSpec> for PostgresClusterSpec {
    fn from(s: v1alpha1::PostgresClusterSpec) -> Self {
        Self {
            instances: s.replicas,
            image: s.image,
            storage: s.storage,
            resources: s.resources,
            postgresql: PostgresqlSpec {
                version: s.postgres_version,
                parameters: s.postgresql.parameters,
                pg_hba: s.postgresql.pg_hba,
            },
            scheduling: s.affinity,
            ha: HaSpec {
                failover_delay: s.failover_delay,
                switchover_timeout: s.switchover_timeout,
                synchronous: SynchronousSpec {
                    standbys: s.replication.synchronous,
                    data_durability: s.replication.data_durability,
                },
            },
            tls: s.tls,
            credentials: s.credentials,
            network_policy: s.network_policy,
            backup: s.backup.map(|b| BackupSpec {
                store: b.store,
                timezone: b.timezone,
                retention: RetentionSpec {
                    days: b.retention_days,
                },
                base: BaseBackupSpec {
                    schedule: b.schedule,
                    verify: b.verify,
                },
                logical: LogicalBackupSpec {
                    schedule: b.logical_schedule,
                },
            }),
            bootstrap: s.bootstrap,
            paused: s.paused,
        }
    }
}

impl From<PostgresClusterSpec> for v1alpha1::PostgresClusterSpec {
    fn from(s: PostgresClusterSpec) -> Self {
        Self {
            replicas: s.instances,
            image: s.image,
            postgres_version: s.postgresql.version,
            storage: s.storage,
            resources: s.resources,
            postgresql: v1alpha1::PostgresqlSpec {
                parameters: s.postgresql.parameters,
                pg_hba: s.postgresql.pg_hba,
            },
            affinity: s.scheduling,
            replication: v1alpha1::ReplicationSpec {
                synchronous: s.ha.synchronous.standbys,
                data_durability: s.ha.synchronous.data_durability,
            },
            tls: s.tls,
            credentials: s.credentials,
            network_policy: s.network_policy,
            failover_delay: s.ha.failover_delay,
            switchover_timeout: s.ha.switchover_timeout,
            backup: s.backup.map(|b| v1alpha1::BackupSpec {
                schedule: b.base.schedule,
                logical_schedule: b.logical.schedule,
                timezone: b.timezone,
                retention_days: b.retention.days,
                store: b.store,
                verify: b.base.verify,
            }),
            bootstrap: s.bootstrap,
            paused: s.paused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A small deterministic generator (xorshift64*): the same seed, the same specs.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn coin(&mut self) -> bool {
            self.below(2) == 0
        }
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            let i = usize::try_from(self.below(from.len() as u64)).unwrap_or(0);
            from[i]
        }
        fn int(&mut self, lo: i64, hi: i64) -> i64 {
            lo + i64::try_from(self.below(u64::try_from(hi - lo + 1).unwrap_or(1))).unwrap_or(0)
        }
        /// A value made by `value` under `key` in `object`, or nothing, by a coin.
        fn maybe(&mut self, object: &mut Value, key: &str, value: impl FnOnce(&mut Self) -> Value) {
            if self.coin() {
                object[key] = value(self);
            }
        }
    }

    fn store(g: &mut Gen) -> Value {
        if g.coin() {
            json!({"volume": {"claimName": g.pick(&["backups", "archive-1"])}})
        } else {
            json!({"s3": {
                "bucket": g.pick(&["backups", "pg.archive"]),
                "endpoint": g.pick(&["https://minio.storage:9000", "http://10.0.0.1"]),
                "path": g.pick(&["clusters/prod", "a/b"]),
                "credentialsSecret": {"name": "s3", "accessKeyIdKey": g.pick(&["AWS_ACCESS_KEY_ID", "id"])}
            }})
        }
    }

    fn scheduling(g: &mut Gen) -> Value {
        let mut v = json!({});
        g.maybe(&mut v, "podAntiAffinityType", |g| {
            json!(g.pick(&["preferred", "required"]))
        });
        g.maybe(&mut v, "topologyKey", |g| {
            json!(g.pick(&["kubernetes.io/hostname", "topology.kubernetes.io/zone"]))
        });
        g.maybe(
            &mut v,
            "nodeSelector",
            |g| json!({"disk": g.pick(&["ssd", "hdd"])}),
        );
        g.maybe(&mut v, "tolerations", |_| json!([{"key": "dedicated", "operator": "Equal", "value": "pg", "effect": "NoSchedule"}]));
        v
    }

    fn common(g: &mut Gen, v: &mut Value) {
        v["storage"] = json!({"size": g.pick(&["1Gi", "10Gi", "1.5Ti", "500M"])});
        if g.coin() {
            v["storage"]["storageClassName"] = json!(g.pick(&["fast", "local-path"]));
        }
        g.maybe(v, "image", |g| {
            json!(g.pick(&["pgop:0.1.0", "registry.example.com:5000/pgop:0.2.0"]))
        });
        g.maybe(
            v,
            "resources",
            |_| json!({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}),
        );
        g.maybe(
            v,
            "tls",
            |g| json!({"allowPlaintext": g.coin(), "serverSecret": "tls-server"}),
        );
        g.maybe(
            v,
            "credentials",
            |g| json!({"appSecret": "app", "superuserAccess": g.coin()}),
        );
        g.maybe(
            v,
            "networkPolicy",
            |g| json!({"enabled": g.coin(), "clients": [{"podLabels": {"app": "web"}}]}),
        );
        match g.below(3) {
            0 => {}
            1 => v["bootstrap"] = json!({"initdb": {"database": "shop", "owner": "shop"}}),
            _ => {
                v["bootstrap"] =
                    json!({"recovery": {"backup": "nightly", "targetTime": "2026-01-31T12:00:00Z"}})
            }
        }
        g.maybe(v, "paused", |g| json!(g.coin()));
    }

    fn alpha(g: &mut Gen) -> v1alpha1::PostgresClusterSpec {
        let replicas = g.int(1, 9);
        let mut v = json!({});
        common(g, &mut v);
        g.maybe(&mut v, "replicas", |_| json!(replicas));
        g.maybe(&mut v, "postgresVersion", |_| json!(15));
        g.maybe(&mut v, "postgresql", |_| json!({"parameters": {"work_mem": "8MB"}, "pgHba": ["host all all 10.0.0.0/8 scram-sha-256"]}));
        g.maybe(&mut v, "affinity", scheduling);
        g.maybe(&mut v, "replication", |g| json!({"synchronous": g.int(0, 8), "dataDurability": g.pick(&["preferred", "required"])}));
        g.maybe(&mut v, "failoverDelay", |g| json!(g.int(0, 30)));
        g.maybe(&mut v, "switchoverTimeout", |g| json!(g.int(1, 600)));
        if g.coin() {
            let mut b = json!({});
            g.maybe(&mut b, "schedule", |_| json!("0 2 * * *"));
            g.maybe(&mut b, "logicalSchedule", |_| json!("30 3 * * 0"));
            g.maybe(&mut b, "timezone", |g| {
                json!(g.pick(&["UTC", "Europe/Berlin"]))
            });
            g.maybe(&mut b, "retentionDays", |g| json!(g.int(1, 365)));
            g.maybe(&mut b, "verify", |g| json!(g.coin()));
            g.maybe(&mut b, "store", store);
            v["backup"] = b;
        }
        serde_json::from_value(v).expect("a generated v1alpha1 spec")
    }

    fn beta(g: &mut Gen) -> PostgresClusterSpec {
        let mut v = json!({});
        common(g, &mut v);
        g.maybe(&mut v, "instances", |g| json!(g.int(1, 9)));
        let mut pg = json!({});
        g.maybe(&mut pg, "version", |_| json!(15));
        g.maybe(
            &mut pg,
            "parameters",
            |_| json!({"shared_buffers": "256MB"}),
        );
        g.maybe(&mut pg, "pgHba", |_| {
            json!(["hostssl all all 0.0.0.0/0 cert"])
        });
        g.maybe(&mut v, "postgresql", move |_| pg);
        g.maybe(&mut v, "scheduling", scheduling);
        let mut ha = json!({});
        g.maybe(&mut ha, "failoverDelay", |g| json!(g.int(0, 30)));
        g.maybe(&mut ha, "switchoverTimeout", |g| json!(g.int(1, 600)));
        g.maybe(&mut ha, "synchronous", |g| json!({"standbys": g.int(0, 8), "dataDurability": g.pick(&["preferred", "required"])}));
        g.maybe(&mut v, "ha", move |_| ha);
        if g.coin() {
            let mut b = json!({});
            g.maybe(&mut b, "store", store);
            g.maybe(&mut b, "timezone", |_| json!("Asia/Tokyo"));
            g.maybe(&mut b, "retention", |g| json!({"days": g.int(1, 365)}));
            g.maybe(
                &mut b,
                "base",
                |g| json!({"schedule": "15 1 * * *", "verify": g.coin()}),
            );
            g.maybe(&mut b, "logical", |_| json!({"schedule": "0 4 1 * *"}));
            v["backup"] = b;
        }
        serde_json::from_value(v).expect("a generated v1beta1 spec")
    }

    #[test]
    fn v1alpha1_to_v1beta1_and_back_is_the_identity() {
        let mut g = Gen(0x5eed_1234_abcd_0001);
        for _ in 0..2000 {
            let a = alpha(&mut g);
            let b = PostgresClusterSpec::from(a.clone());
            assert_eq!(v1alpha1::PostgresClusterSpec::from(b), a);
        }
    }

    #[test]
    fn v1beta1_to_v1alpha1_and_back_is_the_identity() {
        let mut g = Gen(0x5eed_1234_abcd_0002);
        for _ in 0..2000 {
            let b = beta(&mut g);
            let a = v1alpha1::PostgresClusterSpec::from(b.clone());
            assert_eq!(PostgresClusterSpec::from(a), b);
        }
    }

    #[test]
    fn the_defaults_agree_and_each_field_lands_where_the_table_says() {
        let a: v1alpha1::PostgresClusterSpec =
            serde_json::from_value(json!({"storage": {"size": "1Gi"}})).expect("minimal");
        let b: PostgresClusterSpec =
            serde_json::from_value(json!({"storage": {"size": "1Gi"}})).expect("minimal");
        assert_eq!(PostgresClusterSpec::from(a), b, "the same defaults in both");

        let a: v1alpha1::PostgresClusterSpec = serde_json::from_value(json!({
            "replicas": 3, "postgresVersion": 15, "storage": {"size": "1Gi"},
            "replication": {"synchronous": 1, "dataDurability": "required"},
            "failoverDelay": 5, "switchoverTimeout": 90,
            "affinity": {"podAntiAffinityType": "required"},
            "backup": {"schedule": "0 2 * * *", "logicalSchedule": "0 3 * * *",
                       "retentionDays": 7, "verify": true}
        }))
        .expect("a v1alpha1 spec");
        let b = serde_json::to_value(PostgresClusterSpec::from(a)).expect("json");
        assert_eq!(b["instances"], 3);
        assert_eq!(b["postgresql"]["version"], 15);
        assert_eq!(
            b["ha"],
            json!({"failoverDelay": 5, "switchoverTimeout": 90, "synchronous": {"standbys": 1, "dataDurability": "required"}})
        );
        assert_eq!(b["scheduling"]["podAntiAffinityType"], "required");
        assert_eq!(
            b["backup"]["base"],
            json!({"schedule": "0 2 * * *", "verify": true})
        );
        assert_eq!(b["backup"]["logical"], json!({"schedule": "0 3 * * *"}));
        assert_eq!(b["backup"]["retention"], json!({"days": 7}));
    }
}
