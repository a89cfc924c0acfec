//! The CRDs against a real API server (testenv): they are accepted, `kubectl explain` shows
//! the field docs, bad manifests are refused with a message naming the field, and the Rust
//! validation refuses the same manifests naming the same field — the layers agree.
//!
//! Why this file stays whole: it is one subject, the CRDs as a real API server serves them,
//! and more than half of its length is one table, `BAD`, of the manifests both the API
//! server and the Rust validation must refuse.

use crate::common;

use common::{Result, dynamic_api, setup};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use pgop_api::cluster::{ClusterPhase, InstanceRole, InstanceStatus};
use pgop_api::{PostgresBackup, PostgresCluster, PostgresClusterStatus, conditions};
use pgop_testenv::shared;
use serde_json::{Value, json};
use std::time::Duration;

/// One manifest that must be refused. `spec` is created as is, or — when `before` is set —
/// written as an update of an object created with `before` (for transition rules).
struct Case {
    what: &'static str,
    name: &'static str,
    before: Option<&'static str>,
    spec: &'static str,
    /// Both the API server's message and the Rust error must name this field.
    field: &'static str,
}

const fn case(what: &'static str, spec: &'static str, field: &'static str) -> Case {
    Case {
        what,
        name: "bad",
        before: None,
        spec,
        field,
    }
}

const BAD: &[Case] = &[
    case(
        "no instances",
        "replicas: 0\nstorage: {size: 1Gi}",
        "spec.replicas",
    ),
    case(
        "too many instances",
        "replicas: 10\nstorage: {size: 1Gi}",
        "spec.replicas",
    ),
    case(
        "retention of zero days",
        "storage: {size: 1Gi}\nbackup: {retentionDays: 0}",
        "spec.backup.retentionDays",
    ),
    case(
        "retention over a year",
        "storage: {size: 1Gi}\nbackup: {retentionDays: 366}",
        "spec.backup.retentionDays",
    ),
    case(
        "cron with four fields",
        "storage: {size: 1Gi}\nbackup: {schedule: '0 2 * *', store: {volume: {claimName: backups}}}",
        "spec.backup.schedule",
    ),
    case(
        "cron minute 60",
        "storage: {size: 1Gi}\nbackup: {schedule: '60 2 * * *', store: {volume: {claimName: backups}}}",
        "spec.backup.schedule",
    ),
    case(
        "size that is no quantity",
        "storage: {size: ten gigabytes}",
        "spec.storage.size",
    ),
    case("size of zero", "storage: {size: 0Gi}", "spec.storage.size"),
    case(
        "unknown dataDurability",
        "storage: {size: 1Gi}\nreplicas: 3\nreplication: {synchronous: 1, dataDurability: sometimes}",
        "spec.replication.dataDurability",
    ),
    Case {
        what: "storage class changed",
        name: "bad-class-change",
        before: Some("storage: {size: 1Gi, storageClassName: fast}"),
        spec: "storage: {size: 1Gi, storageClassName: slow}",
        field: "spec.storage.storageClassName",
    },
    Case {
        what: "storage class removed",
        name: "bad-class-removal",
        before: Some("storage: {size: 1Gi, storageClassName: fast}"),
        spec: "storage: {size: 1Gi}",
        field: "spec.storage.storageClassName",
    },
    Case {
        what: "WAL storage class changed",
        name: "bad-wal-class-change",
        before: Some("storage: {size: 1Gi}\nwalStorage: {size: 1Gi, storageClassName: fast}"),
        spec: "storage: {size: 1Gi}\nwalStorage: {size: 1Gi, storageClassName: slow}",
        field: "spec.walStorage.storageClassName",
    },
    case(
        "WAL volume of no size",
        "storage: {size: 1Gi}\nwalStorage: {size: 0}",
        "spec.walStorage.size",
    ),
    case(
        "pgop-owned parameter",
        "storage: {size: 1Gi}\npostgresql: {parameters: {port: '5433', work_mem: 8MB}}",
        "spec.postgresql.parameters",
    ),
    case(
        "pgop-owned parameter in another case",
        "storage: {size: 1Gi}\npostgresql: {parameters: {Wal_Level: logical}}",
        "spec.postgresql.parameters",
    ),
    case(
        "pg_hba rule of two lines",
        "storage: {size: 1Gi}\npostgresql: {pgHba: [\"host all all 0.0.0.0/0 md5\\nlocal all all trust\"]}",
        "spec.postgresql.pgHba[0]",
    ),
    case(
        "storage without size",
        "storage: {storageClassName: fast}",
        "spec.storage.size",
    ),
    case("no storage", "replicas: 1", "spec.storage"),
    case(
        "as many synchronous standbys as instances",
        "replicas: 2\nstorage: {size: 1Gi}\nreplication: {synchronous: 2}",
        "spec.replication.synchronous",
    ),
    case(
        "more synchronous standbys than possible",
        "replicas: 9\nstorage: {size: 1Gi}\nreplication: {synchronous: 9}",
        "spec.replication.synchronous",
    ),
    case(
        "required durability without synchronous standbys",
        "replicas: 3\nstorage: {size: 1Gi}\nreplication: {dataDurability: required}",
        "spec.replication.dataDurability",
    ),
    case(
        "negative failover delay",
        "storage: {size: 1Gi}\nfailoverDelay: -1",
        "spec.failoverDelay",
    ),
    case(
        "schedule without store",
        "storage: {size: 1Gi}\nbackup: {schedule: '0 2 * * *'}",
        "spec.backup.store",
    ),
    case(
        "logical schedule without store",
        "storage: {size: 1Gi}\nbackup: {logicalSchedule: '0 3 * * *'}",
        "spec.backup.store",
    ),
    case(
        "logical schedule with six fields",
        "storage: {size: 1Gi}\nbackup: {logicalSchedule: '0 0 3 * * *', store: {volume: {claimName: backups}}}",
        "spec.backup.logicalSchedule",
    ),
    case(
        "schedule with a null store",
        "storage: {size: 1Gi}\nbackup: {schedule: '0 2 * * *', store: null}",
        "spec.backup.store",
    ),
    case(
        "store with s3 and volume",
        "storage: {size: 1Gi}\nbackup: {store: {volume: {claimName: backups}, s3: {bucket: pg-backups, credentialsSecret: {name: s3}}}}",
        "spec.backup.store",
    ),
    case(
        "store with neither s3 nor volume",
        "storage: {size: 1Gi}\nbackup: {store: {}}",
        "spec.backup.store",
    ),
    case(
        "bucket name in capitals",
        "storage: {size: 1Gi}\nbackup: {store: {s3: {bucket: PG, credentialsSecret: {name: s3}}}}",
        "spec.backup.store.s3.bucket",
    ),
    case(
        "both initdb and recovery",
        "storage: {size: 1Gi}\nbootstrap: {initdb: {database: app}, recovery: {backup: nightly}}",
        "spec.bootstrap",
    ),
    case(
        "recovery without a source",
        "storage: {size: 1Gi}\nbootstrap: {recovery: {targetLsn: '0/3000060'}}",
        "spec.bootstrap.recovery",
    ),
    case(
        "recovery from a store without the source cluster",
        "storage: {size: 1Gi}\nbootstrap: {recovery: {store: {s3: {bucket: pg, credentialsSecret: {name: s3}}}}}",
        "spec.bootstrap.recovery",
    ),
    case(
        "recovery to a time and an LSN",
        "storage: {size: 1Gi}\nbootstrap: {recovery: {backup: nightly, targetLsn: '0/3000060', targetTime: '2025-01-31T12:00:00Z'}}",
        "spec.bootstrap.recovery",
    ),
    case(
        "recovery target time that is no time",
        "storage: {size: 1Gi}\nbootstrap: {recovery: {backup: nightly, targetTime: yesterday}}",
        "spec.bootstrap.recovery.targetTime",
    ),
    case(
        "recovery target LSN that is no LSN",
        "storage: {size: 1Gi}\nbootstrap: {recovery: {backup: nightly, targetLsn: 'zz'}}",
        "spec.bootstrap.recovery.targetLsn",
    ),
    case(
        "parameter name carrying a second line that sets an owned parameter",
        "storage: {size: 1Gi}\npostgresql: {parameters: {\"pgop.x = 'y'\\narchive_cleanup_command\": \"id > /tmp/pwned\"}}",
        "spec.postgresql.parameters",
    ),
    case(
        "parameter name with '='",
        "storage: {size: 1Gi}\npostgresql: {parameters: {\"work_mem = 1\": '1'}}",
        "spec.postgresql.parameters",
    ),
    case(
        "empty parameter name",
        "storage: {size: 1Gi}\npostgresql: {parameters: {\"\": '1'}}",
        "spec.postgresql.parameters",
    ),
    case(
        "include directive as a parameter",
        "storage: {size: 1Gi}\npostgresql: {parameters: {include_if_exists: /etc/passwd}}",
        "spec.postgresql.parameters",
    ),
    case(
        "ssl, which pgop cannot honour yet",
        "storage: {size: 1Gi}\npostgresql: {parameters: {ssl: 'on'}}",
        "spec.postgresql.parameters",
    ),
    case(
        "ssl_passphrase_command, which runs a shell command",
        "storage: {size: 1Gi}\npostgresql: {parameters: {ssl_passphrase_command: 'id'}}",
        "spec.postgresql.parameters",
    ),
    case(
        "parameter value with a newline",
        "storage: {size: 1Gi}\npostgresql: {parameters: {application_name: \"x\\nport = '5433'\"}}",
        "spec.postgresql.parameters.application_name",
    ),
    case(
        "pg_hba rule that includes a file",
        "storage: {size: 1Gi}\npostgresql: {pgHba: [\"host @/etc/dbs all all md5\"]}",
        "spec.postgresql.pgHba[0]",
    ),
    case(
        "cert on a host rule (PostgreSQL takes it only with hostssl)",
        "storage: {size: 1Gi}\npostgresql: {pgHba: [\"host all all 10.0.0.0/8 cert\"]}",
        "spec.postgresql.pgHba[0]",
    ),
    case(
        "owner postgres (the superuser)",
        "storage: {size: 1Gi}\nbootstrap: {initdb: {owner: postgres}}",
        "spec.bootstrap.initdb.owner",
    ),
    case(
        "owner streaming_replica (the replication role)",
        "storage: {size: 1Gi}\nbootstrap: {initdb: {owner: streaming_replica}}",
        "spec.bootstrap.initdb.owner",
    ),
    case(
        "owner pg_monitor (a predefined role)",
        "storage: {size: 1Gi}\nbootstrap: {initdb: {owner: pg_monitor}}",
        "spec.bootstrap.initdb.owner",
    ),
    case(
        "database template0",
        "storage: {size: 1Gi}\nbootstrap: {initdb: {database: template0}}",
        "spec.bootstrap.initdb.database",
    ),
    case(
        "PostgreSQL version pgop does not run",
        "storage: {size: 1Gi}\npostgresVersion: 99",
        "spec.postgresVersion",
    ),
    case(
        "target time on a day that does not exist",
        "storage: {size: 1Gi}\nbootstrap: {recovery: {backup: nightly, targetTime: '2026-02-30T00:00:00Z'}}",
        "spec.bootstrap.recovery.targetTime",
    ),
    case(
        "image with whitespace and ';'",
        "storage: {size: 1Gi}\nimage: 'pgop:1 ; rm -rf /'",
        "spec.image",
    ),
    case(
        "store path that escapes its prefix",
        "storage: {size: 1Gi}\nbackup: {store: {s3: {bucket: pg-backups, path: ../../other, credentialsSecret: {name: s3}}}}",
        "spec.backup.store.s3.path",
    ),
    case(
        "endpoint with a command substitution",
        "storage: {size: 1Gi}\nbackup: {store: {s3: {bucket: pg-backups, endpoint: 'https://x/$(id)', credentialsSecret: {name: s3}}}}",
        "spec.backup.store.s3.endpoint",
    ),
    case(
        "region with backticks",
        "storage: {size: 1Gi}\nbackup: {store: {s3: {bucket: pg-backups, region: 'eu`id`', credentialsSecret: {name: s3}}}}",
        "spec.backup.store.s3.region",
    ),
    case(
        "a system PriorityClass",
        "storage: {size: 1Gi}\naffinity: {priorityClassName: system-node-critical}",
        "spec.affinity.priorityClassName",
    ),
    case(
        "a PriorityClass name with a command substitution",
        "storage: {size: 1Gi}\naffinity: {priorityClassName: '$(id)'}",
        "spec.affinity.priorityClassName",
    ),
    case(
        "topology spread with maxSkew 0",
        "storage: {size: 1Gi}\naffinity: {topologySpread: [{topologyKey: kubernetes.io/hostname, maxSkew: 0}]}",
        "spec.affinity.topologySpread[0].maxSkew",
    ),
    case(
        "topology spread twice over one key",
        "storage: {size: 1Gi}\naffinity: {topologySpread: [{topologyKey: zone}, {topologyKey: zone, maxSkew: 2}]}",
        "spec.affinity.topologySpread[1]",
    ),
    case(
        "topology spread key with a newline",
        "storage: {size: 1Gi}\naffinity: {topologySpread: [{topologyKey: \"zone\\nx\"}]}",
        "spec.affinity.topologySpread[0].topologyKey",
    ),
    case(
        "node affinity In without values",
        "storage: {size: 1Gi}\naffinity: {nodeAffinity: {required: [{matchExpressions: [{key: disktype, operator: In}]}]}}",
        "spec.affinity.nodeAffinity.required[0].matchExpressions[0].values",
    ),
    case(
        "node affinity Gt with a word",
        "storage: {size: 1Gi}\naffinity: {nodeAffinity: {preferred: [{weight: 5, matchExpressions: [{key: cores, operator: Gt, values: [many]}]}]}}",
        "spec.affinity.nodeAffinity.preferred[0].matchExpressions[0].values",
    ),
    case(
        "node affinity Exists with a value",
        "storage: {size: 1Gi}\naffinity: {nodeAffinity: {required: [{matchExpressions: [{key: gpu, operator: Exists, values: ['yes']}]}]}}",
        "spec.affinity.nodeAffinity.required[0].matchExpressions[0].values",
    ),
    case(
        "node affinity value with a quote",
        "storage: {size: 1Gi}\naffinity: {nodeAffinity: {required: [{matchExpressions: [{key: disktype, operator: In, values: [\"ssd'\"]}]}]}}",
        "spec.affinity.nodeAffinity.required[0].matchExpressions[0].values",
    ),
    case(
        "node affinity key with a command substitution",
        "storage: {size: 1Gi}\naffinity: {nodeAffinity: {required: [{matchExpressions: [{key: '$(id)', operator: Exists}]}]}}",
        "spec.affinity.nodeAffinity.required[0].matchExpressions[0].key",
    ),
    case(
        "node affinity term without expressions",
        "storage: {size: 1Gi}\naffinity: {nodeAffinity: {required: [{matchExpressions: []}]}}",
        "spec.affinity.nodeAffinity.required[0].matchExpressions",
    ),
    case(
        "node affinity weight 0",
        "storage: {size: 1Gi}\naffinity: {nodeAffinity: {preferred: [{weight: 0, matchExpressions: [{key: a, operator: Exists}]}]}}",
        "spec.affinity.nodeAffinity.preferred[0].weight",
    ),
    case(
        "unknown podAntiAffinityType",
        "storage: {size: 1Gi}\naffinity: {podAntiAffinityType: always}",
        "spec.affinity.podAntiAffinityType",
    ),
    case(
        "empty topologyKey",
        "storage: {size: 1Gi}\naffinity: {topologyKey: ''}",
        "spec.affinity.topologyKey",
    ),
    case(
        "topologyKey with a newline",
        "storage: {size: 1Gi}\naffinity: {topologyKey: \"kubernetes.io/hostname\\nx\"}",
        "spec.affinity.topologyKey",
    ),
    case(
        "topologyKey with a command substitution",
        "storage: {size: 1Gi}\naffinity: {topologyKey: '$(id)'}",
        "spec.affinity.topologyKey",
    ),
    case(
        "topologyKey with a prefix longer than 253",
        "storage: {size: 1Gi}\naffinity: {topologyKey: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/zone}",
        "spec.affinity.topologyKey",
    ),
    case(
        "nodeSelector key with a space",
        "storage: {size: 1Gi}\naffinity: {nodeSelector: {\"disk type\": ssd}}",
        "spec.affinity.nodeSelector",
    ),
    case(
        "nodeSelector value with quotes",
        "storage: {size: 1Gi}\naffinity: {nodeSelector: {disktype: \"'ssd'\"}}",
        "spec.affinity.nodeSelector.disktype",
    ),
    case(
        "network policy client label key with a newline",
        "storage: {size: 1Gi}\nnetworkPolicy: {clients: [{podLabels: {\"app\\nx\": shop}}]}",
        "spec.networkPolicy.clients[0].podLabels",
    ),
    case(
        "network policy namespace label value with $( )",
        "storage: {size: 1Gi}\nnetworkPolicy: {clients: [{namespaceLabels: {team: \"$(id)\"}}]}",
        "spec.networkPolicy.clients[0].namespaceLabels.team",
    ),
    case(
        "server certificate Secret named with a path",
        "storage: {size: 1Gi}\ntls: {serverSecret: ../etc}",
        "spec.tls.serverSecret",
    ),
    case(
        "client CA Secret named with a quote",
        "storage: {size: 1Gi}\ntls: {clientCASecret: \"ca'\"}",
        "spec.tls.clientCASecret",
    ),
    case(
        "app Secret named with a command substitution",
        "storage: {size: 1Gi}\ncredentials: {appSecret: \"$(id)\"}",
        "spec.credentials.appSecret",
    ),
    case(
        "superuser Secret named with a newline",
        "storage: {size: 1Gi}\ncredentials: {superuserAccess: true, superuserSecret: \"su\\nx\"}",
        "spec.credentials.superuserSecret",
    ),
    case(
        "fenced instance of another cluster",
        "storage: {size: 1Gi}\nfencedInstances: [other-1]",
        "spec.fencedInstances",
    ),
    case(
        "fenced instance with a newline and a command",
        "storage: {size: 1Gi}\nfencedInstances: [\"bad-1\\n$(id)\"]",
        "spec.fencedInstances",
    ),
    case(
        "fenced instance named twice",
        "storage: {size: 1Gi}\nfencedInstances: [bad-1, bad-1]",
        "spec.fencedInstances[1]",
    ),
    case(
        "ten fenced instances",
        "storage: {size: 1Gi}\nfencedInstances: [bad-1, bad-2, bad-3, bad-4, bad-5, bad-6, bad-7, bad-8, bad-9, bad-10]",
        "spec.fencedInstances",
    ),
    case(
        "role named postgres",
        "storage: {size: 1Gi}\nroles: [{name: postgres}]",
        "spec.roles[0].name",
    ),
    case(
        "role name with a quote and a statement",
        "storage: {size: 1Gi}\nroles: [{name: \"x\\\"; drop role app; --\"}]",
        "spec.roles[0].name",
    ),
    case(
        "role a member of the superuser",
        "storage: {size: 1Gi}\nroles: [{name: reporting, inRoles: [postgres]}]",
        "spec.roles[0].inRoles",
    ),
    case(
        "role a member of itself",
        "storage: {size: 1Gi}\nroles: [{name: reporting, inRoles: [reporting]}]",
        "spec.roles[0].inRoles",
    ),
    case(
        "role declared twice",
        "storage: {size: 1Gi}\nroles: [{name: reporting}, {name: reporting}]",
        "spec.roles[1]",
    ),
    case(
        "role connection limit below -1",
        "storage: {size: 1Gi}\nroles: [{name: reporting, connectionLimit: -2}]",
        "spec.roles[0].connectionLimit",
    ),
    case(
        "role valid until a day that does not exist",
        "storage: {size: 1Gi}\nroles: [{name: reporting, validUntil: \"2026-02-30T00:00:00Z\"}]",
        "spec.roles[0].validUntil",
    ),
    case(
        "auto-grow threshold above 95",
        "storage: {size: 1Gi, autoGrow: {thresholdPercent: 99, maxSize: 2Gi}}",
        "spec.storage.autoGrow.thresholdPercent",
    ),
    case(
        "auto-grow increase of 0",
        "storage: {size: 1Gi, autoGrow: {increasePercent: 0, maxSize: 2Gi}}",
        "spec.storage.autoGrow.increasePercent",
    ),
    case(
        "auto-grow maximum with a command",
        "storage: {size: 1Gi, autoGrow: {maxSize: \"2Gi$(id)\"}}",
        "spec.storage.autoGrow.maxSize",
    ),
    case(
        "database named template1",
        "storage: {size: 1Gi}\ndatabases: [{name: template1, owner: app}]",
        "spec.databases[0].name",
    ),
    case(
        "database owned by the replication role",
        "storage: {size: 1Gi}\ndatabases: [{name: shop, owner: streaming_replica}]",
        "spec.databases[0].owner",
    ),
    case(
        "database without an owner",
        "storage: {size: 1Gi}\ndatabases: [{name: shop}]",
        "spec.databases[0].owner",
    ),
    case(
        "database encoding with a quote and a statement",
        "storage: {size: 1Gi}\ndatabases: [{name: shop, owner: app, encoding: \"UTF8'; drop database app; --\"}]",
        "spec.databases[0].encoding",
    ),
    case(
        "database locale with a newline",
        "storage: {size: 1Gi}\ndatabases: [{name: shop, owner: app, locale: \"C\\nlisten_addresses='*'\"}]",
        "spec.databases[0].locale",
    ),
    case(
        "database declared twice",
        "storage: {size: 1Gi}\ndatabases: [{name: shop, owner: app}, {name: shop, owner: app}]",
        "spec.databases[1]",
    ),
    case(
        "schema named information_schema",
        "storage: {size: 1Gi}\ndatabases: [{name: shop, owner: app, schemas: [{name: information_schema}]}]",
        "spec.databases[0].schemas[0].name",
    ),
    case(
        "schema owned by a predefined role",
        "storage: {size: 1Gi}\ndatabases: [{name: shop, owner: app, schemas: [{name: sales, owner: pg_monitor}]}]",
        "spec.databases[0].schemas[0].owner",
    ),
    case(
        "extension name with a command",
        "storage: {size: 1Gi}\ndatabases: [{name: shop, owner: app, extensions: [{name: \"x$(id)\"}]}]",
        "spec.databases[0].extensions[0].name",
    ),
    case(
        "extension version with a space and a statement",
        "storage: {size: 1Gi}\ndatabases: [{name: shop, owner: app, extensions: [{name: pgcrypto, version: \"1.3 ; drop\"}]}]",
        "spec.databases[0].extensions[0].version",
    ),
    case(
        "extension in a schema with a dot",
        "storage: {size: 1Gi}\ndatabases: [{name: shop, owner: app, extensions: [{name: pgcrypto, schema: a.b}]}]",
        "spec.databases[0].extensions[0].schema",
    ),
    case(
        "app Secret is the cluster's own app Secret",
        "storage: {size: 1Gi}\ncredentials: {appSecret: bad-app}",
        "spec.credentials.appSecret",
    ),
    case(
        "superuser Secret is the cluster's own superuser Secret",
        "storage: {size: 1Gi}\ncredentials: {superuserAccess: true, superuserSecret: bad-superuser}",
        "spec.credentials.superuserSecret",
    ),
    case(
        "server certificate Secret is the cluster's own",
        "storage: {size: 1Gi}\ntls: {serverSecret: bad-server-tls}",
        "spec.tls.serverSecret",
    ),
    case(
        "client CA Secret is the cluster's own authority",
        "storage: {size: 1Gi}\ntls: {clientCASecret: bad-postgres-ca}",
        "spec.tls.clientCASecret",
    ),
    case(
        "toleration without key or Exists",
        "storage: {size: 1Gi}\naffinity: {tolerations: [{value: x}]}",
        "spec.affinity.tolerations[0].operator",
    ),
    case(
        "toleration with a null key and operator Equal",
        "storage: {size: 1Gi}\naffinity: {tolerations: [{key: null, operator: Equal}]}",
        "spec.affinity.tolerations[0].operator",
    ),
    case(
        "toleration Exists with a value",
        "storage: {size: 1Gi}\naffinity: {tolerations: [{key: a, operator: Exists, value: x}]}",
        "spec.affinity.tolerations[0].value",
    ),
    case(
        "tolerationSeconds without NoExecute",
        "storage: {size: 1Gi}\naffinity: {tolerations: [{key: a, effect: NoSchedule, tolerationSeconds: 5}]}",
        "spec.affinity.tolerations[0].tolerationSeconds",
    ),
    case(
        "unknown taint effect",
        "storage: {size: 1Gi}\naffinity: {tolerations: [{key: a, effect: Sometimes}]}",
        "spec.affinity.tolerations[0].effect",
    ),
    case(
        "pooler name with a newline and a command",
        "storage: {size: 1Gi}\npoolers: [{name: \"rw\\n$(id)\"}]",
        "spec.poolers[0].name",
    ),
    case(
        "pooler declared twice",
        "storage: {size: 1Gi}\npoolers: [{name: rw}, {name: rw}]",
        "spec.poolers[1]",
    ),
    case(
        "pooler of unknown type",
        "storage: {size: 1Gi}\npoolers: [{name: rw, type: rwx}]",
        "spec.poolers[0].type",
    ),
    case(
        "statement pooling",
        "storage: {size: 1Gi}\npoolers: [{name: rw, poolMode: statement}]",
        "spec.poolers[0].poolMode",
    ),
    case(
        "pooler without pods",
        "storage: {size: 1Gi}\npoolers: [{name: rw, instances: 0}]",
        "spec.poolers[0].instances",
    ),
    case(
        "pool of zero server connections",
        "storage: {size: 1Gi}\npoolers: [{name: rw, defaultPoolSize: 0}]",
        "spec.poolers[0].defaultPoolSize",
    ),
    case(
        "a million clients",
        "storage: {size: 1Gi}\npoolers: [{name: rw, maxClientConnections: 1000000}]",
        "spec.poolers[0].maxClientConnections",
    ),
    case(
        "five poolers",
        "storage: {size: 1Gi}\npoolers: [{name: a}, {name: b}, {name: c}, {name: d}, {name: e}]",
        "spec.poolers",
    ),
    case(
        "an external cluster with neither a connection nor a store",
        "storage: {size: 1Gi}\nexternalClusters: [{name: site-a}]",
        "spec.externalClusters[0]",
    ),
    case(
        "two external clusters of one name",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: db, user: app, sslMode: require}}, {name: a, connection: {host: db2, user: app, sslMode: require}}]",
        "spec.externalClusters[1]",
    ),
    case(
        "an external cluster name that is no DNS label",
        "storage: {size: 1Gi}\nexternalClusters: [{name: \"site-a\\n$(id)\", connection: {host: db, user: app, sslMode: require}}]",
        "spec.externalClusters[0].name",
    ),
    case(
        "an external connection verifying TLS without an authority",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: db, user: app}}]",
        "spec.externalClusters[0].connection.caSecret",
    ),
    case(
        "an external connection without TLS",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: db, user: app, sslMode: disable}}]",
        "spec.externalClusters[0].connection.sslMode",
    ),
    case(
        "an external connection without a user",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: db, sslMode: require}}]",
        "spec.externalClusters[0].connection.user",
    ),
    case(
        "an external connection to port 0",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: db, port: 0, user: app, sslMode: require}}]",
        "spec.externalClusters[0].connection.port",
    ),
    case(
        "an external host with a shell substitution",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: \"db$(id)\", user: app, sslMode: require}}]",
        "spec.externalClusters[0].connection.host",
    ),
    case(
        "an external store of two kinds",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, store: {cluster: db, volume: {claimName: wal}, s3: {bucket: wal-archive, credentialsSecret: {name: s3}}}}]",
        "spec.externalClusters[0].store",
    ),
    case(
        "an external store without the source's name",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, store: {volume: {claimName: wal}}}]",
        "spec.externalClusters[0].store.cluster",
    ),
    case(
        "nine external clusters",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, store: {volume: {claimName: w}, cluster: c}}, {name: b, store: {volume: {claimName: w}, cluster: c}}, {name: c, store: {volume: {claimName: w}, cluster: c}}, {name: d, store: {volume: {claimName: w}, cluster: c}}, {name: e, store: {volume: {claimName: w}, cluster: c}}, {name: f, store: {volume: {claimName: w}, cluster: c}}, {name: g, store: {volume: {claimName: w}, cluster: c}}, {name: h, store: {volume: {claimName: w}, cluster: c}}, {name: i, store: {volume: {claimName: w}, cluster: c}}]",
        "spec.externalClusters",
    ),
    case(
        "a replica of no external cluster",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: db, user: app, sslMode: require}}]\nreplica: {source: b}",
        "spec.replica.source",
    ),
    case(
        "a replica of an entry with a volume store and no connection",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, store: {volume: {claimName: wal}, cluster: db}}]\nreplica: {source: a}",
        "spec.replica.source",
    ),
    case(
        "a replica source that is no DNS label",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: db, user: app, sslMode: require}}]\nreplica: {source: \"a'; $(id)\"}",
        "spec.replica.source",
    ),
    case(
        "a replica of an entry whose store is a volume",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: db, user: app, sslMode: require}, store: {volume: {claimName: wal}, cluster: db}}]\nreplica: {source: a}",
        "spec.replica.source",
    ),
    case(
        "a replica bound of 0 seconds",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: db, user: app, sslMode: require}}]\nreplica: {source: a, maxLagSeconds: 0}",
        "spec.replica.maxLagSeconds",
    ),
    case(
        "a replica cluster restored from a backup",
        "storage: {size: 1Gi}\nexternalClusters: [{name: a, connection: {host: db, user: app, sslMode: require}}]\nreplica: {source: a}\nbootstrap: {recovery: {backup: b}}",
        "spec.bootstrap.recovery",
    ),
    Case {
        what: "pooler Service name longer than a DNS label",
        name: "a-cluster-name-of-forty-five-characters-abcde",
        before: None,
        spec: "storage: {size: 1Gi}\npoolers: [{name: reporting-pooler-x}]",
        field: "spec.poolers",
    },
    Case {
        what: "cluster name too long for its children's names",
        name: "a-cluster-name-that-is-far-too-long-to-fit-in-pod-names",
        before: None,
        spec: "storage: {size: 1Gi}",
        field: "metadata.name",
    },
];

/// A spec that uses every section.
const VALID: &str = r#"
replicas: 3
postgresVersion: 15
image: registry.example.com:5000/pgop:0.1.0
storage: {size: 10Gi, storageClassName: fast}
resources:
  requests: {cpu: 500m, memory: 1Gi}
  limits: {memory: 1Gi}
postgresql:
  parameters: {shared_buffers: 256MB, work_mem: 8MB, pg_stat_statements.max: "5000", search_path: "'$user', public"}
  pgHba: ["host all all 10.0.0.0/8 scram-sha-256", "host \"my db\" app ::1/128 md5", "hostssl all app all cert"]
replication: {synchronous: 1, dataDurability: required}
tls: {allowPlaintext: true, serverSecret: db-server-cert, clientCASecret: app-client-ca}
credentials: {appSecret: shop-credentials, superuserAccess: true, superuserSecret: dba-credentials}
networkPolicy:
  clients:
    - {podLabels: {app: shop}}
    - {podLabels: {app: reports}, namespaceLabels: {team: analytics}}
    - {namespaceLabels: {}}
affinity:
  podAntiAffinityType: required
  topologyKey: topology.kubernetes.io/zone
  nodeSelector: {disktype: ssd, example.com/pool: ""}
  tolerations:
    - {key: dedicated, value: postgres, effect: NoSchedule}
    - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 30}
  topologySpread:
    - {topologyKey: topology.kubernetes.io/zone, maxSkew: 1, whenUnsatisfiable: DoNotSchedule}
    - {topologyKey: kubernetes.io/hostname, maxSkew: 2, whenUnsatisfiable: ScheduleAnyway}
  nodeAffinity:
    required:
      - matchExpressions:
          - {key: disktype, operator: In, values: [ssd, nvme]}
          - {key: example.com/spot, operator: DoesNotExist}
    preferred:
      - {weight: 50, matchExpressions: [{key: example.com/cores, operator: Gt, values: ["16"]}]}
  priorityClassName: databases
failoverDelay: 5
switchoverTimeout: 120
backup:
  schedule: "0 2 * * *"
  timezone: Europe/Berlin
  retentionDays: 14
  verify: true
  store:
    s3:
      bucket: pg-backups
      endpoint: https://minio.storage:9000
      region: eu-central-1
      path: clusters/main
      credentialsSecret: {name: s3-credentials}
bootstrap:
  initdb: {database: shop, owner: shop}
paused: false
poolers:
  - {name: rw, instances: 2, maxClientConnections: 500, defaultPoolSize: 10, resources: {requests: {cpu: 100m}}}
  - {name: reports, type: ro, poolMode: session}
externalClusters:
  - name: site-a
    connection: {host: db-rw.site-a.example.com, user: streaming_replica, passwordSecret: {name: site-a}, caSecret: {name: site-a-ca}, clientCertificateSecret: {name: site-a-client}}
    store: {s3: {bucket: site-a-backups, credentialsSecret: {name: site-a-s3}}, cluster: db}
  - name: old-vm
    connection: {host: 10.0.3.7, port: 5433, dbname: shop, user: app, sslMode: require}
replica: {source: site-a, maxLagSeconds: 60, promotionMaxLagSeconds: 30}
"#;

fn manifest(name: &str, spec_yaml: &str) -> Result<Value> {
    let spec: Value = serde_yaml::from_str(spec_yaml)?;
    Ok(json!({
        "apiVersion": "database.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": name},
        "spec": spec,
    }))
}

/// The API server's verdict on creating (or, with `before`, updating to) a manifest:
/// `Ok(())` when accepted, else the error message.
async fn server_verdict(api: &Api<DynamicObject>, case: &Case) -> Result<Result<(), String>> {
    let object: DynamicObject = serde_json::from_value(manifest(case.name, case.spec)?)?;
    let outcome = match case.before {
        None => api.create(&PostParams::default(), &object).await.map(drop),
        Some(before) => {
            let old: DynamicObject = serde_json::from_value(manifest(case.name, before)?)?;
            let mut current = api.create(&PostParams::default(), &old).await?;
            current.data["spec"] = object.data["spec"].clone();
            api.replace(case.name, &PostParams::default(), &current)
                .await
                .map(drop)
        }
    };
    match outcome {
        Ok(()) => Ok(Ok(())),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{}: {status:?}", case.what);
            Ok(Err(status.message))
        }
        Err(other) => Err(other.into()),
    }
}

/// The field a serde_yaml error names: `spec.storage: missing field `size`` names
/// `spec.storage.size`; other errors name the path in front of the colon.
fn serde_error_field(message: &str) -> String {
    let Some((path, rest)) = message.split_once(": ") else {
        return message.to_string();
    };
    match rest
        .strip_prefix("missing field `")
        .and_then(|r| r.split('`').next())
    {
        Some(missing) => format!("{path}.{missing}"),
        None => path.to_string(),
    }
}

/// The Rust layer's verdict: deserializing (what the operator's watcher does), then
/// `validate_cluster` or `validate_update`. Returns the fields it names.
fn rust_verdict(case: &Case) -> Result<Vec<String>> {
    let yaml = serde_yaml::to_string(&manifest(case.name, case.spec)?)?;
    let new: PostgresCluster = match serde_yaml::from_str(&yaml) {
        Ok(new) => new,
        Err(e) => return Ok(vec![serde_error_field(&e.to_string())]),
    };
    let result = match case.before {
        None => pgop_api::validation::validate_cluster(&new),
        Some(before) => {
            let old: PostgresCluster =
                serde_yaml::from_str(&serde_yaml::to_string(&manifest(case.name, before)?)?)?;
            pgop_api::validate_update(&old.spec, &new.spec, old.status.as_ref())
        }
    };
    Ok(result
        .err()
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.field)
        .collect())
}

#[tokio::test]
async fn crds_are_accepted_and_kubectl_explain_shows_the_field_docs() -> Result {
    let (_client, ns) = setup("api-explain").await?;
    let plane = shared().await?;
    let kubectl = pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Kubectl)?;
    let normalize = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let expected =
        "Each standby holds a WAL sender and a replication slot on the primary.".to_string();
    // The published OpenAPI document follows the CRD a moment after it is Established.
    // kubectl explains the preferred version, v1beta1 (v1alpha1's `replicas`).
    let explained = pgop_testenv::wait::until(
        "kubectl explain pgc.spec.instances to show the doc comment",
        Duration::from_secs(30),
        || {
            let kubectl = kubectl.clone();
            let expected = expected.clone();
            async move {
                let out = tokio::process::Command::new(&kubectl)
                    .arg("--kubeconfig")
                    .arg(plane.kubeconfig())
                    .args(["explain", "pgc.spec.instances"])
                    .output()
                    .await
                    .map_err(|e| e.to_string())?;
                let text = normalize(&String::from_utf8_lossy(&out.stdout));
                if out.status.success() && text.contains(&expected) {
                    Ok(text)
                } else {
                    Err(format!("{text} {}", String::from_utf8_lossy(&out.stderr)))
                }
            }
        },
    )
    .await?;
    assert!(
        explained.contains("FIELD: instances <integer>"),
        "{explained}"
    );
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn bad_manifests_are_refused_by_the_api_server_and_by_validate_naming_the_field() -> Result {
    let (client, ns) = setup("api-bad").await?;
    let api = dynamic_api(client, ns.name());
    assert!(BAD.len() >= 15);
    let mut failures = Vec::new();
    for case in BAD {
        match server_verdict(&api, case).await? {
            Ok(()) => failures.push(format!("{}: the API server accepted it", case.what)),
            Err(message) if !message.contains(case.field) => failures.push(format!(
                "{}: the API server's message does not name {}: {message}",
                case.what, case.field
            )),
            Err(message) => println!("{}: {message}", case.what),
        }
        let fields = rust_verdict(case)?;
        if !fields.iter().any(|f| f == case.field) {
            failures.push(format!(
                "{}: Rust validation does not name {} (it named {fields:?})",
                case.what, case.field
            ));
        }
        // Update cases leave their object behind; the next case may reuse the name.
        if case.before.is_some() {
            api.delete(case.name, &Default::default()).await?;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn a_valid_manifest_is_accepted_and_defaulted_as_serde_defaults_it() -> Result {
    let (client, ns) = setup("api-valid").await?;
    let api: Api<PostgresCluster> = Api::namespaced(client.clone(), ns.name());

    let full: PostgresCluster = serde_json::from_value(manifest("main", VALID)?)?;
    assert_eq!(pgop_api::validation::validate_cluster(&full), Ok(()));
    let created = api.create(&PostParams::default(), &full).await?;
    assert_eq!(created.spec, full.spec);
    // A replica cluster that follows a store alone (no connection).
    let store_only: PostgresCluster = serde_json::from_value(manifest(
        "store-only",
        "storage: {size: 1Gi}\nexternalClusters: [{name: site-a, store: {s3: {bucket: site-a-backups, credentialsSecret: {name: site-a-s3}}, cluster: db}}]\nreplica: {source: site-a}",
    )?)?;
    assert_eq!(pgop_api::validation::validate_cluster(&store_only), Ok(()));
    let created = api.create(&PostParams::default(), &store_only).await?;
    assert_eq!(created.spec, store_only.spec);

    // The API server applies the schema defaults; serde applies the Rust ones. They agree.
    let minimal: PostgresCluster =
        serde_json::from_value(manifest("minimal", "storage: {size: 1Gi}")?)?;
    let raw = dynamic_api(client, ns.name());
    let sent: DynamicObject = serde_json::from_value(manifest("minimal", "storage: {size: 1Gi}")?)?;
    let stored = raw.create(&PostParams::default(), &sent).await?;
    let stored: PostgresCluster = serde_json::from_value(serde_json::to_value(&stored)?)?;
    assert_eq!(stored.spec, minimal.spec);
    assert_eq!(
        serde_json::to_value(&stored.spec)?,
        json!({
            "replicas": 1,
            "storage": {"size": "1Gi"},
            "postgresql": {},
            "replication": {"synchronous": 0, "dataDurability": "preferred"},
            "affinity": {"podAntiAffinityType": "preferred", "topologyKey": "kubernetes.io/hostname"},
            "failoverDelay": 0,
            "switchoverTimeout": 60,
            "paused": false,
            "tls": {},
            "credentials": {},
            "networkPolicy": {"enabled": true}
        })
    );
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn status_scale_and_printer_columns_work_as_the_operator_will_use_them() -> Result {
    let (client, ns) = setup("api-status").await?;
    let plane = shared().await?;
    let api: Api<PostgresCluster> = Api::namespaced(client, ns.name());
    let cluster: PostgresCluster =
        serde_json::from_value(manifest("main", "replicas: 2\nstorage: {size: 1Gi}")?)?;
    api.create(&PostParams::default(), &cluster).await?;

    let now = conditions::whole_seconds(Time(k8s_openapi::jiff::Timestamp::now()));
    let mut conds = Vec::new();
    conditions::set_condition(
        &mut conds,
        conditions::new_condition(
            conditions::READY,
            true,
            "AllInstancesReady",
            "2/2 instances ready",
            Some(1),
            now.clone(),
        ),
        now.clone(),
    );
    let status = PostgresClusterStatus {
        phase: Some(ClusterPhase::Ready),
        conditions: conds,
        observed_generation: Some(1),
        current_primary: Some("main-1".into()),
        target_primary: Some("main-1".into()),
        target_primary_since: None,
        target_primary_trace: Some(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        ),
        replicas: 2,
        ready_replicas: 2,
        selector: Some(pgop_api::labels::instance_selector("main")),
        instances: vec![
            InstanceStatus {
                name: "main-1".into(),
                serial: 1,
                role: Some(InstanceRole::Primary),
                ready: true,
                timeline: Some(1),
                received_lsn: Some("0/3000060".into()),
                replayed_lsn: None,
                manager_version: Some("0.1.0".into()),
                postgres_version: Some("15.14 (Debian 15.14-0+deb12u1)".into()),
                fenced: false,
                reason: None,
                message: None,
                down_since: None,
            },
            InstanceStatus {
                name: "main-2".into(),
                serial: 2,
                role: Some(InstanceRole::Replica),
                ready: true,
                timeline: Some(1),
                received_lsn: Some("0/3000060".into()),
                replayed_lsn: Some("0/3000060".into()),
                manager_version: None,
                postgres_version: None,
                fenced: true,
                reason: None,
                message: None,
                down_since: None,
            },
        ],
        recovery_source: None,
        next_serial: 3,
        restart_instance: Some("main-2".into()),
        restart_requested: None,
        instance_restarts: vec![pgop_api::cluster::InstanceRestart {
            instance: "main-2".into(),
            requested_at: "2026-12-03T10:00:00.123456Z".into(),
        }],
        roles: vec![pgop_api::roles::AppliedStatus {
            name: "reporting".into(),
            applied: false,
            message: Some("role \"reporting\" cannot be dropped".into()),
        }],
        auto_grow: Some(pgop_api::cluster::AutoGrowStatus {
            size: "1536Mi".into(),
            grown_at: Some(now.clone()),
            count: 1,
            at_limit: true,
        }),
        databases: vec![pgop_api::roles::AppliedStatus {
            name: "shop".into(),
            applied: false,
            message: Some(
                "shop: extension \"postgis\": extension \"postgis\" is not available".into(),
            ),
        }],
        poolers: vec![pgop_api::pooler::PoolerStatus {
            name: "rw".into(),
            service: "main-pooler-rw".into(),
            instances: 2,
            ready_instances: 1,
        }],
        last_backup_time: Some(now.clone()),
        first_recoverability_point: None,
        last_logical_backup_time: None,
        positions_observed_at: Some(now.clone()),
        postgres_version: Some(15),
        major_upgrade: Some(pgop_api::cluster::MajorUpgrade {
            from: 15,
            to: 18,
            phase: pgop_api::cluster::MajorUpgradePhase::Upgrading,
            mode: pgop_api::cluster::MajorUpgradeMode::Link,
            primary: "main-1".into(),
            started_at: now.clone(),
            finished_at: None,
            backup: Some("main-before-18".into()),
            message: None,
        }),
        replica: Some(pgop_api::cluster_status::ReplicaStatus {
            source: "site-a".into(),
            designated_primary: Some("main-1".into()),
            mode: Some("streamingWithArchive".into()),
            streaming: false,
            last_restored_wal: Some("000000010000000000000003".into()),
            last_restored_at: Some("2026-12-03T10:00:01Z".into()),
            source_end_lsn: Some("0/3000060".into()),
            received_lsn: Some("0/3000060".into()),
            replayed_lsn: Some("0/3000000".into()),
            lag_bytes: Some(96),
            lag_seconds: Some(3),
            refusal_reason: Some("SourceUnreachable".into()),
            refusal_message: Some("connection refused".into()),
            last_message_at: Some("2026-12-03T10:00:00.123456Z".into()),
            promotion: Some(pgop_api::cluster_status::ReplicaPromotion {
                approved_at: now.clone(),
                forced: true,
                last_lag_seconds: Some(3),
                completed_at: None,
            }),
        }),
    };
    let patch = json!({
        "apiVersion": pgop_api::constants::API_VERSION,
        "kind": "PostgresCluster",
        "status": status,
    });
    let patched = api
        .patch_status(
            "main",
            &PatchParams::apply(pgop_api::constants::FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    assert_eq!(patched.status.as_ref(), Some(&status));

    let kubectl = pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Kubectl)?;
    let run = |args: Vec<String>| {
        let kubectl = kubectl.clone();
        async move {
            let out = tokio::process::Command::new(kubectl)
                .arg("--kubeconfig")
                .arg(plane.kubeconfig())
                .args(&args)
                .output()
                .await?;
            Ok::<_, std::io::Error>((
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            ))
        }
    };
    let ns_args = |rest: &[&str]| -> Vec<String> {
        ["-n", ns.name()]
            .iter()
            .chain(rest)
            .map(ToString::to_string)
            .collect()
    };

    // Printer columns, and the `pgop` category.
    let (ok, table) = run(ns_args(&["get", "pgop"])).await?;
    assert!(ok, "{table}");
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "INSTANCES", "READY", "PRIMARY", "PHASE", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row.get(..5),
        Some(
            &[
                "postgrescluster.database.example.com/main",
                "2",
                "2",
                "main-1",
                "Ready"
            ][..]
        ),
        "{table}"
    );

    // The scale subresource (kubectl uses the preferred version, v1beta1): within the range
    // it changes spec.instances (spec.replicas in v1alpha1), outside it is refused.
    let (ok, out) = run(ns_args(&["scale", "pgc/main", "--replicas=3"])).await?;
    assert!(ok, "{out}");
    assert_eq!(api.get("main").await?.spec.replicas, 3);
    let (ok, out) = run(ns_args(&["scale", "pgc/main", "--replicas=10"])).await?;
    assert!(!ok, "scaling to 10 must fail: {out}");
    assert!(out.contains("spec.instances"), "{out}");
    let scale = api.get_scale("main").await?;
    assert_eq!(
        scale.status.and_then(|s| s.selector).as_deref(),
        Some("database.example.com/cluster=main,app.kubernetes.io/component=database")
    );
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn a_backup_is_accepted_and_its_spec_cannot_change() -> Result {
    let (client, ns) = setup("api-backup").await?;
    let api: Api<PostgresBackup> = Api::namespaced(client, ns.name());
    let backup: PostgresBackup = serde_json::from_value(json!({
        "apiVersion": "database.example.com/v1alpha1",
        "kind": "PostgresBackup",
        "metadata": {"name": "nightly"},
        "spec": {"cluster": {"name": "main"}},
    }))?;
    assert_eq!(pgop_api::validation::validate_backup(&backup.spec), Ok(()));
    let mut created = api.create(&PostParams::default(), &backup).await?;
    created.spec.cluster.name = "other".into();
    let err = api
        .replace("nightly", &PostParams::default(), &created)
        .await
        .expect_err("changing a backup's spec must be refused");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(status.message.contains("spec"), "{}", status.message);
            assert!(status.message.contains("immutable"), "{}", status.message);
        }
        other => panic!("expected an API error, got {other}"),
    }
    let fields: Vec<String> =
        pgop_api::validation::validate_backup_update(&backup.spec, &created.spec)
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect();
    assert_eq!(fields, ["spec"]);
    ns.delete().await?;
    Ok(())
}
