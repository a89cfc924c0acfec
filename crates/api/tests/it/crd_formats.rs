//! Every string field the CRD checks (quantity, cron, time zone, names, bucket, URL,
//! region, store path, image, time, LSN, pg_hba line, parameter names and values, database
//! and owner names, Secret keys, label keys and values, and the names, hosts, databases,
//! users, Secrets and stores of external clusters) is judged alike by the real API server
//! (dry-run creates) and by the Rust checks in `pgop_api::formats` and `validate`:
//! first each format's own samples, then the same table of hostile values in every field.
//!
//! Why this file stays whole: it is one test,
//! `every_format_is_judged_alike_by_the_api_server_and_by_rust`, and the tables it runs, of
//! which `FORMATS` alone is about 650 of its lines.

use crate::common;

use common::{Result, dynamic_api, setup};

use kube::api::{DynamicObject, PostParams};
use pgop_api::cluster::{is_owned_parameter, is_reserved_name, is_unsupported_parameter};
use pgop_api::{PostgresCluster, formats};
use serde_json::{Value, json};

/// Where a sample goes in a valid spec, and the Rust function that judges it.
struct Format {
    name: &'static str,
    set: fn(&mut Value, &str),
    rust: fn(&str) -> bool,
    samples: &'static [&'static str],
    /// Every value of [`HOSTILE`] must be refused here. Only parameter values are lenient:
    /// quotes, `$( )`, `#` or `;` are plain text in a quoted postgresql.conf value, so
    /// only control characters and overlong values are refused there.
    strict: bool,
}

/// Hostile values, tried in every string field: line breaks, NUL and other control
/// characters, quotes, backslash, `=`, `#`, `;`, shell substitutions, path traversal,
/// overlong, blank, Unicode confusables and invisible characters.
const HOSTILE: &[&str] = &[
    "a\nb",
    "a\rb",
    "a\u{0}b",
    "a\tb",
    "a\u{7f}b",
    "x\narchive_cleanup_command = 'id'",
    "x'\nport = '5433",
    "'",
    "\"",
    "a'b",
    "a\"b",
    "\\",
    "a\\b",
    "a=b",
    " = ",
    "#",
    "a#b",
    ";",
    "a;b",
    "$(id)",
    "a$(id)b",
    "`id`",
    "a`id`b",
    "..",
    "../x",
    "a/../b",
    "/etc/passwd",
    "@/etc/passwd",
    "%p",
    "",
    " ",
    "a b",
    "\u{430}pp",
    "\u{ff50}\u{ff47}",
    "app\u{200b}",
    "x\u{2028}y",
    "x\u{85}y",
    "a&&b",
    "a|b",
    "a>b",
];

/// RFC 3339 times with a zone, good and bad (days that do not exist included).
const TIMESTAMP_SAMPLES: &[&str] = &[
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
    "2024-02-29T00:00:00Z",
    "2026-02-29T00:00:00Z",
    "2026-02-30T00:00:00Z",
    "2026-04-31T12:00:00+02:00",
    "1900-02-29T00:00:00Z",
    "2000-02-29T00:00:00Z",
];

/// A value far past every field's length limit.
fn overlong() -> String {
    "a".repeat(5000)
}

/// A sample as it is shown in a failure: long ones cut short.
fn show(value: &str) -> String {
    if value.chars().count() > 40 {
        let head: String = value.chars().take(20).collect();
        format!("{head:?}... ({} characters)", value.chars().count())
    } else {
        format!("{value:?}")
    }
}

/// Whether a hostile value must be refused even where the format is lenient.
fn structural(value: &str) -> bool {
    value.chars().any(|c| c < ' ' || c == '\u{7f}') || value.chars().count() > 4096
}

fn set_s3(s: &mut Value, key: &str, v: &str) {
    s["bootstrap"]["recovery"]["store"]["s3"][key] = json!(v);
}

fn set_parameter_name(s: &mut Value, v: &str) {
    let mut parameters = serde_json::Map::new();
    parameters.insert(v.to_string(), json!("1"));
    s["postgresql"] = json!({"parameters": parameters});
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

/// Label keys (`topologyKey`, node selector and toleration keys).
const LABEL_KEY_SAMPLES: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "disktype",
    "A_b.c-D",
    "example.com/Some.Name_1",
    "/",
    "/name",
    "zone/",
    "a/b/c",
    "Example.com/name",
    "a..b/name",
    "-a",
    "a-",
    ".a",
    "_a",
    "kubernetes.io/hostname\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    PREFIX_253,
    PREFIX_254,
];

/// A key whose prefix is 253 characters long (the most), and one of 254.
const PREFIX_253: &str = concat!(
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "/zone"
);
const PREFIX_254: &str = concat!(
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "/zone"
);

/// Label values (node selector and toleration values).
const LABEL_VALUE_SAMPLES: &[&str] = &[
    "ssd",
    "",
    "a",
    "ssd_1.x-Y",
    "-",
    "a-",
    "a/b",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
];

const FORMATS: &[Format] = &[
    Format {
        name: "quantity",
        set: |s, v| s["storage"]["size"] = json!(v),
        rust: formats::is_quantity,
        samples: &[
            "1", "10Gi", "500M", "1.5Ti", "0.5Gi", "100k", "0", "0Gi", "0.0", "01Gi", "1.", ".5",
            "1e9", "100m", "10 Gi", "10gi", "1Gib", "-1Gi",
        ],
        strict: true,
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
        strict: true,
    },
    Format {
        name: "timezone",
        set: |s, v| s["backup"]["timezone"] = json!(v),
        rust: |v| v.len() <= 64 && formats::is_timezone(v),
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
        strict: true,
    },
    Format {
        name: "claim name",
        set: |s, v| s["backup"]["store"]["volume"]["claimName"] = json!(v),
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &["backups", "my-pvc.v1", "a", "-a", "a-", "A", "a..b", "a_b"],
        strict: true,
    },
    Format {
        name: "app credentials Secret",
        set: |s, v| s["credentials"]["appSecret"] = json!(v),
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &["shop-login", "a.b", "-a", "A", "a..b", "a_b"],
        strict: true,
    },
    Format {
        name: "superuser credentials Secret",
        set: |s, v| {
            s["credentials"]["superuserAccess"] = json!(true);
            s["credentials"]["superuserSecret"] = json!(v)
        },
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &["dba", "a.b", "a-", "A", "a..b"],
        strict: true,
    },
    Format {
        name: "bucket",
        set: |s, v| s["bootstrap"]["recovery"]["store"]["s3"]["bucket"] = json!(v),
        rust: formats::is_bucket,
        samples: &[
            "pg-backups.eu",
            "abc",
            "ab",
            "-abc",
            "abc-",
            "ABC",
            "a_b_c",
            "a..bc",
            "abc.",
            "a.-bc",
        ],
        strict: true,
    },
    Format {
        name: "endpoint",
        set: |s, v| s["bootstrap"]["recovery"]["store"]["s3"]["endpoint"] = json!(v),
        rust: formats::is_url,
        samples: &[
            "https://minio.storage:9000",
            "http://127.0.0.1:9000/",
            "http://[::1]:9000",
            "HTTPS://x",
            "https://s3.example.com/a/b",
            "minio:9000",
            "https://",
            "https:///x",
            "ftp://x",
            "https://a b",
            "https://user:pw@host",
            "https://host:123456",
            "https://host/$(id)",
            "https://host?x=1",
            "https://-host",
            "file:///etc/passwd",
        ],
        strict: true,
    },
    Format {
        name: "target time",
        set: |s, v| s["bootstrap"]["recovery"]["targetTime"] = json!(v),
        rust: formats::is_timestamp,
        samples: TIMESTAMP_SAMPLES,
        strict: true,
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
        strict: true,
    },
    Format {
        name: "pg_hba line",
        set: |s, v| s["postgresql"] = json!({"pgHba": [v]}),
        rust: |v| v.chars().count() <= formats::MAX_HBA_LINE_LENGTH && formats::is_hba_line(v),
        samples: &[
            "host all all 10.0.0.0/8 scram-sha-256",
            "local all all peer",
            "  host\tapp,shop +admins 10.0.0.0 255.0.0.0 md5  ",
            "host \"my db\" \"\u{dc}ser\" ::1/128 scram-sha-256",
            "host all all all ldap ldapserver=ldap.example.com ldapprefix=\"cn=\" ldapsuffix=\", dc=x\"",
            "hostnossl all all samenet reject",
            "",
            "a\nb",
            "a\rb",
            "host all all 0.0.0.0/0 md5\nlocal all all trust",
            "hostssl all all 10.0.0.0/8 scram-sha-256",
            "hostgssenc all all 10.0.0.0/8 gss",
            "host all all 10.0.0.0/8 cert",
            "hostssl all app 10.0.0.0/8 cert clientname=DN",
            "hostssl all all all cert",
            "hostnossl all all all cert",
            "local all all cert",
            "hostssl all all all",
            "host all all 10.0.0.0/8 scram-sha-256 # comment",
            "host @dbs all 10.0.0.0/8 md5",
            "include /etc/passwd",
            "include_dir /tmp",
            "host all all md5",
            "local all all 10.0.0.0/8 md5",
            "host all all a b c md5",
            "host a\"b all all md5",
            "host \"unterminated all all md5",
            "host all all all md5 Map=x",
            "host all all all md5 map=\"a\nb\"",
            "local all all peer map",
            "host all all all trust\u{a0}",
            "host\u{a0}all all all trust",
        ],
        strict: true,
    },
    Format {
        name: "database name",
        set: |s, v| {
            s["bootstrap"] = json!({"initdb": {"database": v}});
        },
        rust: |v| formats::is_identifier(v) && !is_reserved_name(v),
        samples: &[
            "app",
            "_x1",
            "1app",
            "App",
            "my-app",
            "postgres",
            "template0",
            "template1",
            "streaming_replica",
            "pg_catalog",
            "pg_",
            "pgx",
            "public",
            "app_pg_x",
        ],
        strict: true,
    },
    Format {
        name: "owner",
        set: |s, v| {
            s["bootstrap"] = json!({"initdb": {"owner": v}});
        },
        rust: |v| formats::is_identifier(v) && !is_reserved_name(v),
        samples: &[
            "app",
            "shop_owner",
            "postgres",
            "streaming_replica",
            "pg_monitor",
            "pg_read_server_files",
            "none",
            "current_user",
            "session_user",
            "current_role",
            "Postgres",
            "owner",
        ],
        strict: true,
    },
    Format {
        name: "parameter name",
        set: set_parameter_name,
        rust: |v| {
            formats::is_parameter_name(v) && !is_owned_parameter(v) && !is_unsupported_parameter(v)
        },
        samples: &[
            "work_mem",
            "Work_Mem",
            "pg_stat_statements.max",
            "_x",
            "pgop.x = 'y'\narchive_cleanup_command",
            "pgop.x",
            "a.b.c",
            "1x",
            "archive_cleanup_command",
            "Archive_Command",
            "ssl",
            "SSL",
            "ssl_passphrase_command",
            "ssl_cert_file",
            "sslx",
            "include",
            "include_dir",
            "Include_If_Exists",
            "w\u{43e}rk_mem",
            "work_mem ",
        ],
        strict: true,
    },
    Format {
        name: "parameter value",
        set: |s, v| s["postgresql"] = json!({"parameters": {"application_name": v}}),
        rust: formats::is_parameter_value,
        samples: &[
            "x",
            "",
            "'\"$user\", public'",
            "\u{e9}t\u{e9}",
            "x\nport = '5433'",
        ],
        strict: false,
    },
    Format {
        name: "image",
        set: |s, v| s["image"] = json!(v),
        rust: formats::is_image,
        samples: &[
            "pgop",
            "pgop:0.1.0",
            "registry.example.com:5000/team/pgop:v1.2_3",
            "localhost/pgop@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "pgop:1; rm -rf /",
            "pgop :1",
            "PGOP",
            "pgop:",
            "/pgop",
            "a___b",
            "reg:port/pgop",
        ],
        strict: true,
    },
    Format {
        name: "region",
        set: |s, v| set_s3(s, "region", v),
        rust: formats::is_region,
        samples: &[
            "eu-central-1",
            "garage",
            "us_east",
            "-x",
            "x-",
            "eu central",
        ],
        strict: true,
    },
    Format {
        name: "store path",
        set: |s, v| set_s3(s, "path", v),
        rust: formats::is_store_path,
        samples: &[
            "clusters/prod",
            "a",
            "x.y/_z-1",
            "a..b",
            "/abs",
            "a/",
            "a//b",
            "../../other",
            ".",
            "a/./b",
            ".hidden",
        ],
        strict: true,
    },
    Format {
        name: "secret key",
        set: |s, v| {
            s["bootstrap"]["recovery"]["store"]["s3"]["credentialsSecret"]["accessKeyIdKey"] =
                json!(v);
        },
        rust: |v| v.len() <= 253 && formats::is_secret_key(v),
        samples: &[
            "AWS_ACCESS_KEY_ID",
            "tls.crt",
            "a-b_c.d",
            ".x",
            "a/b",
            ".",
            "..",
            "..x",
        ],
        strict: true,
    },
    Format {
        name: "topology key",
        set: |s, v| s["affinity"] = json!({"topologyKey": v}),
        rust: formats::is_label_key,
        samples: LABEL_KEY_SAMPLES,
        strict: true,
    },
    Format {
        name: "node selector key",
        set: |s, v| {
            let mut selector = serde_json::Map::new();
            selector.insert(v.to_string(), json!("ssd"));
            s["affinity"] = json!({"nodeSelector": selector});
        },
        rust: formats::is_label_key,
        samples: LABEL_KEY_SAMPLES,
        strict: true,
    },
    Format {
        name: "node selector value",
        set: |s, v| s["affinity"] = json!({"nodeSelector": {"disktype": v}}),
        rust: formats::is_label_value,
        samples: LABEL_VALUE_SAMPLES,
        // The empty value is a label value (the hostile table's "" is accepted there).
        strict: false,
    },
    Format {
        name: "toleration key",
        set: |s, v| s["affinity"] = json!({"tolerations": [{"key": v, "operator": "Exists"}]}),
        rust: formats::is_label_key,
        samples: LABEL_KEY_SAMPLES,
        strict: true,
    },
    Format {
        name: "toleration value",
        set: |s, v| s["affinity"] = json!({"tolerations": [{"key": "dedicated", "value": v}]}),
        rust: formats::is_label_value,
        samples: LABEL_VALUE_SAMPLES,
        strict: false,
    },
    Format {
        name: "topology spread key",
        set: |s, v| s["affinity"] = json!({"topologySpread": [{"topologyKey": v}]}),
        rust: formats::is_label_key,
        samples: LABEL_KEY_SAMPLES,
        strict: true,
    },
    Format {
        name: "node affinity key",
        set: |s, v| s["affinity"] = json!({"nodeAffinity": {"required": [{"matchExpressions": [{"key": v, "operator": "Exists"}]}]}}),
        rust: formats::is_label_key,
        samples: LABEL_KEY_SAMPLES,
        strict: true,
    },
    Format {
        name: "node affinity value",
        set: |s, v| s["affinity"] = json!({"nodeAffinity": {"required": [{"matchExpressions": [{"key": "disktype", "operator": "In", "values": [v]}]}]}}),
        rust: formats::is_label_value,
        samples: LABEL_VALUE_SAMPLES,
        strict: false,
    },
    Format {
        name: "priority class name",
        set: |s, v| s["affinity"] = json!({"priorityClassName": v}),
        rust: |v| {
            !v.is_empty()
                && v.len() <= 253
                && formats::is_dns_subdomain(v)
                && !v.starts_with(pgop_api::affinity::SYSTEM_PRIORITY_CLASS_PREFIX)
        },
        samples: &[
            "databases",
            "high.priority",
            "system-node-critical",
            "Databases",
            "db_1",
        ],
        strict: true,
    },
    Format {
        name: "role name",
        set: |s, v| s["roles"] = json!([{"name": v}]),
        rust: |v| formats::is_identifier(v) && !is_reserved_name(v),
        samples: &[
            "reporting",
            "_etl",
            "pg_monitor",
            "postgres",
            "Reporting",
            "a-b",
            "r1",
        ],
        strict: true,
    },
    Format {
        name: "role membership",
        set: |s, v| s["roles"] = json!([{"name": "reporting", "inRoles": [v]}]),
        rust: |v| {
            formats::is_identifier(v)
                && !pgop_api::roles::FORBIDDEN_MEMBERSHIPS.contains(&v)
                && v != "reporting"
        },
        samples: &[
            "pg_monitor",
            "readers",
            "postgres",
            "streaming_replica",
            "reporting",
            "PG_MONITOR",
        ],
        strict: true,
    },
    Format {
        name: "role valid until",
        set: |s, v| s["roles"] = json!([{"name": "reporting", "validUntil": v}]),
        rust: formats::is_timestamp,
        samples: TIMESTAMP_SAMPLES,
        strict: true,
    },
    Format {
        name: "role password Secret",
        set: |s, v| s["roles"] = json!([{"name": "reporting", "passwordSecret": {"name": v}}]),
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &["reporting-password", "a.b", "Reporting", "a_b"],
        strict: true,
    },
    Format {
        name: "database name",
        set: |s, v| s["databases"] = json!([{"name": v, "owner": "app"}]),
        rust: |v| formats::is_identifier(v) && !is_reserved_name(v),
        samples: &[
            "shop",
            "_etl",
            "postgres",
            "template0",
            "pg_x",
            "Shop",
            "a-b",
        ],
        strict: true,
    },
    Format {
        name: "database owner",
        set: |s, v| s["databases"] = json!([{"name": "shop", "owner": v}]),
        rust: |v| formats::is_identifier(v) && pgop_api::databases::is_usable_owner(v),
        samples: &["app", "postgres", "streaming_replica", "pg_monitor", "App"],
        strict: true,
    },
    Format {
        name: "database encoding",
        set: |s, v| s["databases"] = json!([{"name": "shop", "owner": "app", "encoding": v}]),
        rust: formats::is_encoding,
        samples: &[
            "UTF8",
            "utf8",
            "SQL_ASCII",
            "EUC_JP",
            "LATIN1",
            "8BIT",
            "UTF-8",
        ],
        strict: true,
    },
    Format {
        name: "database locale",
        set: |s, v| s["databases"] = json!([{"name": "shop", "owner": "app", "locale": v}]),
        rust: formats::is_locale,
        samples: &[
            "C",
            "POSIX",
            "C.UTF-8",
            "en_US.UTF-8",
            "sr_RS@latin",
            ".UTF-8",
            "-C",
        ],
        strict: true,
    },
    Format {
        name: "schema name",
        set: |s, v| {
            s["databases"] = json!([{"name": "shop", "owner": "app", "schemas": [{"name": v}]}])
        },
        rust: |v| formats::is_identifier(v) && pgop_api::databases::is_usable_schema_name(v),
        samples: &[
            "sales",
            "_x",
            "public",
            "information_schema",
            "pg_temp",
            "Sales",
        ],
        strict: true,
    },
    Format {
        name: "schema owner",
        set: |s, v| {
            s["databases"] = json!([{"name": "shop", "owner": "app",
                "schemas": [{"name": "sales", "owner": v}]}])
        },
        rust: |v| formats::is_identifier(v) && pgop_api::databases::is_usable_owner(v),
        samples: &["app", "reporting", "streaming_replica", "pg_monitor", "App"],
        strict: true,
    },
    Format {
        name: "extension schema",
        set: |s, v| {
            s["databases"] = json!([{"name": "shop", "owner": "app",
                "extensions": [{"name": "pgcrypto", "schema": v}]}])
        },
        rust: formats::is_identifier,
        samples: &["public", "sales", "a.b", "Sales", "_x"],
        strict: true,
    },
    Format {
        name: "extension name",
        set: |s, v| {
            s["databases"] = json!([{"name": "shop", "owner": "app", "extensions": [{"name": v}]}])
        },
        rust: formats::is_extension_name,
        samples: &["pgcrypto", "uuid-ossp", "pg_trgm", "-x", "PgCrypto", "1x"],
        strict: true,
    },
    Format {
        name: "extension version",
        set: |s, v| {
            s["databases"] = json!([{"name": "shop", "owner": "app",
                "extensions": [{"name": "pgcrypto", "version": v}]}])
        },
        rust: formats::is_extension_version,
        samples: &["1.3", "2.5.0", "1.0beta1", "1_0-rc.1", ".1", "-1"],
        strict: true,
    },
    Format {
        // A size of one byte, so that every quantity is at least it (maxSize >= size).
        name: "auto-grow maximum",
        set: |s, v| s["storage"] = json!({"size": "1", "autoGrow": {"maxSize": v}}),
        rust: formats::is_quantity,
        samples: &[
            "1", "10Gi", "500M", "1.5Ti", "0.5Gi", "0", "0Gi", "01Gi", "1e9", "100m", "10 Gi",
            "-1Gi",
        ],
        strict: true,
    },
    Format {
        name: "WAL volume size",
        set: |s, v| s["walStorage"] = json!({"size": v}),
        rust: formats::is_quantity,
        samples: &[
            "1", "2Gi", "500M", "0", "0Gi", "01Gi", "1e9", "100m", "10 Gi", "-1Gi",
        ],
        strict: true,
    },
    Format {
        name: "WAL StorageClass",
        set: |s, v| s["walStorage"] = json!({"size": "1Gi", "storageClassName": v}),
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &["fast", "fast-wal.v1", "-a", "A", "a..b", "a_b"],
        strict: true,
    },
    Format {
        name: "fenced instance",
        set: |s, v| s["fencedInstances"] = json!([v]),
        rust: |v| pgop_api::cel::is_instance_of("formats", v),
        samples: &[
            "formats-1",
            "formats-42",
            "formats-2147483647",
            "formats-01",
            "formats-",
            "formats-x",
            "Formats-1",
            "formats-1-",
            "formats-12345678901",
        ],
        strict: true,
    },
    Format {
        // The cluster is named `formats` (7 characters): every sample fits the 55 of
        // cluster and pooler names together.
        name: "pooler name",
        set: |s, v| s["poolers"] = json!([{"name": v}]),
        rust: |v| v.len() <= pgop_api::pooler::MAX_POOLER_NAME_LENGTH && formats::is_dns_label(v),
        samples: &[
            "rw",
            "reports-2",
            "a",
            "abcdefghijklmnopqrst",
            "abcdefghijklmnopqrstu",
            "Rw",
            "-rw",
            "rw-",
            "r_w",
            "r.w",
        ],
        strict: true,
    },
    Format {
        name: "external cluster name",
        set: |s, v| {
            s["externalClusters"] =
                json!([{"name": v, "store": {"volume": {"claimName": "wal"}, "cluster": "db"}}])
        },
        rust: |v| v.len() <= 63 && formats::is_dns_label(v),
        samples: &[
            "site-a",
            "a",
            "a1",
            "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk",
            "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijkl",
            "Site-a",
            "1a",
            "-a",
            "a-",
            "a.b",
            "a_b",
        ],
        strict: true,
    },
    Format {
        name: "external host",
        set: |s, v| {
            s["externalClusters"] = json!([{"name": "a", "connection": {"host": v, "user": "app", "sslMode": "require"}}])
        },
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &[
            "db",
            "db.site-a.example.com",
            "10.0.3.7",
            "127.0.0.2",
            "DB",
            "db_1",
            "-db",
            "db.",
            "::1",
            "[::1]",
            "db:5432",
        ],
        strict: true,
    },
    Format {
        name: "external database",
        set: |s, v| s["externalClusters"] = json!([{"name": "a", "connection": {"host": "db", "dbname": v, "user": "app", "sslMode": "require"}}]),
        rust: formats::is_identifier,
        samples: &["postgres", "shop_1", "_x", "Shop", "1db", "shop-1", "a.b"],
        strict: true,
    },
    Format {
        name: "external user",
        set: |s, v| {
            s["externalClusters"] = json!([{"name": "a", "connection": {"host": "db", "user": v, "sslMode": "require"}}])
        },
        rust: formats::is_identifier,
        samples: &[
            "streaming_replica",
            "postgres",
            "app",
            "App",
            "1app",
            "app-1",
        ],
        strict: true,
    },
    Format {
        name: "external password Secret",
        set: |s, v| s["externalClusters"] = json!([{"name": "a", "connection": {"host": "db", "user": "app", "sslMode": "require", "passwordSecret": {"name": v}}}]),
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &["site-a", "site-a.v1", "Site-a", "site_a"],
        strict: true,
    },
    Format {
        name: "external password key",
        set: |s, v| s["externalClusters"] = json!([{"name": "a", "connection": {"host": "db", "user": "app", "sslMode": "require", "passwordSecret": {"name": "site-a", "key": v}}}]),
        rust: |v| v.len() <= 253 && formats::is_secret_key(v),
        samples: &["password", "PG_PASSWORD", "pass.word", "pass-word", "a/b"],
        strict: true,
    },
    Format {
        name: "external authority Secret",
        set: |s, v| s["externalClusters"] = json!([{"name": "a", "connection": {"host": "db", "user": "app", "caSecret": {"name": v}}}]),
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &["site-a-ca", "site-a-ca.v1", "Site-a-ca", "site_a_ca"],
        strict: true,
    },
    Format {
        name: "external authority key",
        set: |s, v| s["externalClusters"] = json!([{"name": "a", "connection": {"host": "db", "user": "app", "caSecret": {"name": "site-a-ca", "key": v}}}]),
        rust: |v| v.len() <= 253 && formats::is_secret_key(v),
        samples: &["ca.crt", "ca-bundle.pem", "a/b"],
        strict: true,
    },
    Format {
        name: "external client certificate Secret",
        set: |s, v| s["externalClusters"] = json!([{"name": "a", "connection": {"host": "db", "user": "app", "sslMode": "require", "clientCertificateSecret": {"name": v}}}]),
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &["site-a-client", "Site-a"],
        strict: true,
    },
    Format {
        name: "external store cluster",
        set: |s, v| {
            s["externalClusters"] =
                json!([{"name": "a", "store": {"volume": {"claimName": "wal"}, "cluster": v}}])
        },
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &["db", "db.v1", "Db", "db_1"],
        strict: true,
    },
    Format {
        name: "replica source",
        // The one entry is `site-a`: any other source names no entry.
        set: |s, v| {
            s["externalClusters"] = json!([{"name": "site-a", "connection": {"host": "db", "user": "app", "sslMode": "require"}}]);
            s["replica"] = json!({"source": v});
            // A replica cluster is cloned from its source, never restored.
            s["bootstrap"] = json!({"initdb": {}});
        },
        rust: |v| v == "site-a",
        samples: &["site-a", "site-b", "Site-a", "a.b"],
        strict: true,
    },
    Format {
        name: "source cluster",
        set: |s, v| s["bootstrap"]["recovery"]["sourceCluster"] = json!(v),
        rust: |v| v.len() <= 253 && formats::is_dns_subdomain(v),
        samples: &["old", "old.v1", "Old", "old_1"],
        strict: true,
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
    let overlong = overlong();
    let hostile: Vec<&str> = HOSTILE.iter().copied().chain([overlong.as_str()]).collect();
    assert!(hostile.len() >= 40);
    for format in FORMATS {
        let samples = format.samples.iter().copied().map(|s| (s, false));
        let hostile = hostile.iter().copied().map(|s| (s, true));
        for (sample, is_hostile) in samples.chain(hostile) {
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
            if is_hostile && (format.strict || structural(sample)) && (server || rust) {
                disagreements.push(format!(
                    "{} {} is hostile: API server accepts: {server}, Rust accepts: {rust}",
                    format.name,
                    show(sample)
                ));
            }
            if server != rust {
                disagreements.push(format!(
                    "{} {}: API server accepts: {server}, Rust accepts: {rust}",
                    format.name,
                    show(sample)
                ));
            }
            // The whole spec must be judged alike too, not only the format function.
            let typed: PostgresCluster = serde_json::from_value(serde_json::to_value(&object)?)?;
            let validated = pgop_api::validate(&typed.spec).is_ok();
            if server != validated {
                disagreements.push(format!(
                    "{} {}: API server accepts: {server}, validate accepts: {validated}",
                    format.name,
                    show(sample)
                ));
            }
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    ns.delete().await?;
    Ok(())
}
