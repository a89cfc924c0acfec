//! Build from YAML fixtures: `fixtures/cluster.yaml` in, `fixtures/cluster.children.yaml`
//! expected out. Set `PGOP_UPDATE_FIXTURES=1` to rewrite the expected file after an
//! intended change, then review its diff.
//!
//! Why this file stays whole: it is the unit tests of one subject, the children `children`
//! builds for a cluster, all but one starting from the same fixture (`fixture`,
//! `instances`, `passwords`).

use super::*;
use k8s_openapi::api::core::v1::Pod;

fn fixture() -> PostgresCluster {
    let mut c: PostgresCluster =
        serde_yaml::from_str(include_str!("fixtures/cluster.yaml")).expect("fixture parses");
    c.spec = pgop_api::v1beta1::with_defaults(c.spec);
    c
}

fn instances() -> Vec<InstanceSpec> {
    vec![
        InstanceSpec {
            name: "main-1".into(),
            primary: true,
            major: 15,
            upgrade_from: None,
        },
        InstanceSpec {
            name: "main-2".into(),
            primary: false,
            major: 15,
            upgrade_from: None,
        },
        InstanceSpec {
            name: "main-4".into(),
            primary: false,
            major: 15,
            upgrade_from: None,
        },
    ]
}

/// Passwords and certificates as a pass reads them (also the whole-pass tests', decide/passes.rs).
pub(crate) fn passwords() -> Credentials {
    Credentials {
        passwords: super::Passwords {
            app: "app-password".into(),
            app_copied: false,
            replication: "replication-password".into(),
            superuser: Some(("superuser-password".into(), true)),
            pooler: Some("pooler-password".into()),
        },
        certificates: Certificates {
            ca_cert: "CA CERTIFICATE".into(),
            ca_key: "CA KEY".into(),
            manager_cert: "MANAGER CERTIFICATE".into(),
            manager_key: "MANAGER KEY".into(),
            manager_not_after: "2027-03-01T00:00:00Z".into(),
            postgres_ca_cert: "POSTGRES CA CERTIFICATE".into(),
            postgres_ca_key: "POSTGRES CA KEY".into(),
            server: pgop_tls::Issued {
                cert_pem: "SERVER CERTIFICATE".into(),
                key_pem: "SERVER KEY".into(),
                not_after: "2027-03-01T00:00:00Z".parse().expect("timestamp"),
            },
            server_ca_cert: "POSTGRES CA CERTIFICATE".into(),
            server_annotations: vec![
                (
                    pgop_api::constants::ANNOTATION_NOT_AFTER,
                    "2027-03-01T00:00:00Z".into(),
                ),
                (
                    pgop_api::constants::ANNOTATION_DNS_NAMES,
                    "main-rw,main-1".into(),
                ),
            ],
            replication: pgop_tls::Issued {
                cert_pem: "REPLICATION CERTIFICATE".into(),
                key_pem: "REPLICATION KEY".into(),
                not_after: "2027-03-01T00:00:00Z".parse().expect("timestamp"),
            },
            client_ca_cert: "POSTGRES CA CERTIFICATE".into(),
        },
    }
}

fn build() -> Children {
    build_of(&fixture())
}

/// The children of `cluster` with the fixture's instances, passwords and settings.
fn build_of(cluster: &PostgresCluster) -> Children {
    children(
        cluster,
        &instances(),
        &passwords(),
        &Settings::default(),
        &Budgets::new(3, false, true),
    )
    .expect("builds")
}

fn to_yaml(c: &Children) -> String {
    let Children {
        service_account,
        role,
        role_binding,
        app_secret,
        app_derived_keys,
        replication_secret,
        superuser_secret,
        superuser_secret_name: _,
        ca_secret,
        manager_tls_secret,
        postgres_ca_secret,
        server_tls_secret,
        replication_tls_secret,
        services,
        pod_disruption_budgets,
        pvcs,
        pods,
        network_policy,
        poolers,
    } = c;
    let mut docs = vec![
        serde_yaml::to_string(service_account),
        serde_yaml::to_string(role),
        serde_yaml::to_string(role_binding),
        serde_yaml::to_string(app_secret),
        serde_yaml::to_string(replication_secret),
    ];
    docs.extend(
        superuser_secret
            .iter()
            .map(|(s, _)| serde_yaml::to_string(s)),
    );
    docs.extend([
        serde_yaml::to_string(ca_secret),
        serde_yaml::to_string(manager_tls_secret),
        serde_yaml::to_string(postgres_ca_secret),
        serde_yaml::to_string(server_tls_secret),
        serde_yaml::to_string(replication_tls_secret),
    ]);
    docs.extend(services.iter().map(serde_yaml::to_string));
    for pdb in pod_disruption_budgets {
        docs.push(serde_yaml::to_string(pdb));
    }
    docs.extend(pvcs.iter().map(serde_yaml::to_string));
    docs.extend(pods.iter().map(serde_yaml::to_string));
    docs.extend(network_policy.iter().map(serde_yaml::to_string));
    if let Some((account, role, binding)) = &poolers.identity {
        docs.extend([
            serde_yaml::to_string(account),
            serde_yaml::to_string(role),
            serde_yaml::to_string(binding),
        ]);
    }
    docs.extend(poolers.auth_secret.iter().map(serde_yaml::to_string));
    docs.extend(poolers.deployments.iter().map(serde_yaml::to_string));
    docs.extend(poolers.services.iter().map(serde_yaml::to_string));
    // Not objects: checked by the_password_follows_the_users_secret_only_when_copied.
    let _ = app_derived_keys;
    docs.into_iter()
        .map(|d| d.expect("serializes"))
        .collect::<Vec<_>>()
        .join("---\n")
}

#[test]
fn children_match_the_expected_fixture() {
    let actual = to_yaml(&build());
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/cluster/build/fixtures/cluster.children.yaml"
    );
    if std::env::var_os("PGOP_UPDATE_FIXTURES").is_some() {
        std::fs::write(path, &actual).expect("write fixture");
    }
    let expected = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        actual == expected,
        "built children differ from {path}; if the change is intended, rerun with PGOP_UPDATE_FIXTURES=1 and review the diff"
    );
}

fn pod(name: &str) -> Pod {
    build()
        .pods
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .expect("pod built")
}

#[test]
fn every_child_is_owned_by_the_cluster_and_labelled() {
    let yaml = to_yaml(&build());
    for doc in yaml.split("---\n") {
        let v: serde_yaml::Value = serde_yaml::from_str(doc).expect("doc");
        let owner = &v["metadata"]["ownerReferences"][0];
        assert_eq!(
            owner["uid"].as_str(),
            Some("0b6f5d3c-1111-4c2e-9a3e-000000000001"),
            "{doc}"
        );
        assert_eq!(owner["controller"].as_bool(), Some(true), "{doc}");
        assert_eq!(
            v["metadata"]["labels"]["database.example.com/cluster"].as_str(),
            Some("main"),
            "{doc}"
        );
        assert_eq!(
            v["metadata"]["labels"]["app.kubernetes.io/managed-by"].as_str(),
            Some("pgop"),
            "{doc}"
        );
        assert_eq!(v["metadata"]["namespace"].as_str(), Some("db"), "{doc}");
    }
}

#[test]
fn the_password_follows_the_users_secret_only_when_copied() {
    let built = build();
    assert_eq!(built.app_derived_keys, ["uri", "sslmode", "ca.crt"]);
    let (superuser, keys) = built.superuser_secret.expect("superuserAccess");
    assert_eq!(keys, ["uri", "sslmode", "ca.crt", "password"]);
    let data = superuser.string_data.unwrap_or_default();
    assert_eq!(data.get("username").map(String::as_str), Some("postgres"));
    assert_eq!(data.get("dbname").map(String::as_str), Some("postgres"));
    let mut without = passwords();
    without.passwords.superuser = None;
    without.passwords.app_copied = true;
    let built = children(
        &fixture(),
        &instances(),
        &without,
        &Settings::default(),
        &Budgets::new(3, false, true),
    )
    .expect("builds");
    assert!(built.superuser_secret.is_none());
    assert_eq!(
        built.app_derived_keys,
        ["uri", "sslmode", "ca.crt", "password"]
    );
}

#[test]
fn only_the_primary_carries_the_primary_role_label() {
    let role = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::ROLE))
            .cloned()
    };
    assert_eq!(role(&pod("main-1")).as_deref(), Some("primary"));
    assert_eq!(role(&pod("main-2")).as_deref(), Some("replica"));
    assert_eq!(role(&pod("main-4")).as_deref(), Some("replica"));
}

#[test]
fn the_pod_runs_the_instance_manager_under_a_restricted_security_context() {
    let p = pod("main-2");
    let spec = p.spec.expect("spec");
    let c = &spec.containers[0];
    assert_eq!(
        c.command.as_deref(),
        Some(&["pgop".to_string(), "instance".into(), "run".into()][..])
    );
    let sc = c
        .security_context
        .as_ref()
        .expect("container security context");
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_string()])
    );
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    let psc = spec.security_context.expect("pod security context");
    assert_eq!(psc.run_as_user, Some(26));
    let ports: Vec<(Option<&str>, i32)> = c
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        vec![
            (Some("postgres"), 5432),
            (Some("manager"), 8000),
            (Some("manager-tls"), 8001)
        ],
        "a PodMonitor selects the manager's port by name"
    );
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.clone())
    };
    assert_eq!(probe_path(&c.readiness_probe).as_deref(), Some("/readyz"));
    assert_eq!(probe_path(&c.liveness_probe).as_deref(), Some("/healthz"));
    let env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    for name in ["POD_NAME", "POD_NAMESPACE", "PGOP_CLUSTER", "PGOP_WAL_DIR"] {
        assert!(env.contains(&name), "{name} missing from {env:?}");
    }
    let claims: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
        .collect();
    // The data claim, and the WAL's (the fixture has spec.walStorage).
    assert_eq!(claims, ["main-2", "main-2-wal"]);
    // Every path PostgreSQL writes to is a volume (the root filesystem is read-only).
    let mounts: Vec<&str> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(
        mounts,
        vec![
            "/var/lib/postgresql/data",
            "/run/postgresql",
            "/tmp",
            "/var/lib/postgresql/wal"
        ]
    );
}

#[test]
fn services_select_by_role_and_the_app_secret_names_the_initdb_owner() {
    let c = build();
    let selector = |i: usize| {
        c.services[i]
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default()
    };
    assert_eq!(c.services[0].metadata.name.as_deref(), Some("main-rw"));
    assert_eq!(
        selector(0).get(labels::ROLE).map(String::as_str),
        Some("primary")
    );
    assert_eq!(
        selector(1).get(labels::ROLE).map(String::as_str),
        Some("replica")
    );
    assert!(!selector(2).contains_key(labels::ROLE));
    let data = c.app_secret.string_data.clone().unwrap_or_default();
    assert_eq!(data.get("username").map(String::as_str), Some("shopper"));
    assert_eq!(data.get("dbname").map(String::as_str), Some("shop"));
    assert_eq!(
        data.get("password").map(String::as_str),
        Some("app-password")
    );
}

#[test]
fn the_cluster_image_overrides_the_operator_default() {
    let mut cluster = fixture();
    cluster.spec.image = Some("registry.example/pgop:custom".into());
    let c = build_of(&cluster);
    let image = c.pods[0]
        .spec
        .as_ref()
        .and_then(|s| s.containers[0].image.clone());
    assert_eq!(image.as_deref(), Some("registry.example/pgop:custom"));
}

#[test]
fn a_cluster_without_uid_is_an_error_not_a_panic() {
    let mut cluster = fixture();
    cluster.metadata.uid = None;
    assert!(
        children(
            &cluster,
            &instances(),
            &passwords(),
            &Settings::default(),
            &Budgets::new(3, false, true)
        )
        .is_err()
    );
}

#[test]
fn pods_carry_the_prometheus_scrape_hints_outside_the_spec_hash() {
    let p = pod("main-2");
    let annotations = p.metadata.annotations.clone().unwrap_or_default();
    let get = |k: &str| annotations.get(k).map(String::as_str);
    assert_eq!(get("prometheus.io/scrape"), Some("true"));
    assert_eq!(get("prometheus.io/port"), Some("8000"));
    assert_eq!(get("prometheus.io/path"), Some("/metrics"));
    // Metadata only: the hash (and so the rolling update) depends on the spec alone.
    assert_eq!(
        get(pgop_api::constants::ANNOTATION_SPEC_HASH),
        Some(super::pod::spec_hash(&p.spec).as_str())
    );
}

/// The spec hash of `main-2` built from the fixture with these resources.
fn hash_with_resources(cpu: &str, memory: &str) -> String {
    let mut cluster = fixture();
    cluster.spec.resources = Some(
        serde_json::from_value(serde_json::json!({
            "requests": {"cpu": cpu, "memory": memory},
            "limits": {"memory": memory}
        }))
        .expect("resources"),
    );
    let pods = children(
        &cluster,
        &instances(),
        &passwords(),
        &Settings::default(),
        &Budgets::new(3, false, true),
    )
    .expect("builds")
    .pods;
    let pod = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("main-2"))
        .expect("pod built");
    super::pod::spec_hash(&pod.spec)
}

#[test]
fn the_spec_hash_sees_quantities_by_value() {
    let canonical = hash_with_resources("500m", "1536Mi");
    assert_eq!(hash_with_resources("0.5", "1.5Gi"), canonical);
    assert_eq!(hash_with_resources("+500m", "1572864Ki"), canonical);
    assert_ne!(hash_with_resources("500m", "1537Mi"), canonical);
    assert_ne!(hash_with_resources("1", "1536Mi"), canonical);
}

#[test]
fn a_spec_in_canonical_form_hashes_as_before() {
    // FNV-1a of the spec's JSON as it is, the hash before quantities were canonicalized:
    // Pods built from canonical resources (the fixture's) are not replaced on upgrade.
    let p = pod("main-2");
    let json = serde_json::to_string(&p.spec).expect("serializes");
    let mut raw: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in json.bytes() {
        raw ^= u64::from(byte);
        raw = raw.wrapping_mul(0x0100_0000_01b3);
    }
    assert_eq!(super::pod::spec_hash(&p.spec), format!("{raw:016x}"));
}

/// `main-2` built from the fixture with this `spec.scheduling` (YAML).
fn pod_with_affinity(yaml: &str) -> Pod {
    let mut cluster = fixture();
    cluster.spec.scheduling = serde_yaml::from_str(yaml).expect("affinity parses");
    children(
        &cluster,
        &instances(),
        &passwords(),
        &Settings::default(),
        &Budgets::new(3, false, true),
    )
    .expect("builds")
    .pods
    .into_iter()
    .find(|p| p.metadata.name.as_deref() == Some("main-2"))
    .expect("pod built")
}

fn anti_affinity(p: &Pod) -> k8s_openapi::api::core::v1::PodAntiAffinity {
    p.spec
        .as_ref()
        .and_then(|s| s.affinity.clone())
        .and_then(|a| a.pod_anti_affinity)
        .expect("pod anti-affinity")
}

fn selects_the_cluster(term: &k8s_openapi::api::core::v1::PodAffinityTerm) -> bool {
    term.label_selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref())
        .is_some_and(|m| m.len() == 1 && m.get(labels::CLUSTER).map(String::as_str) == Some("main"))
}

#[test]
fn by_default_instances_prefer_other_nodes_and_the_pod_is_unchanged() {
    let default = pod("main-2");
    let spelled_out =
        pod_with_affinity("{podAntiAffinityType: preferred, topologyKey: kubernetes.io/hostname}");
    // The same Pod (and hash) as before spec.affinity existed: the fixture holds it.
    assert_eq!(default, spelled_out);
    let anti = anti_affinity(&default);
    assert_eq!(
        anti.required_during_scheduling_ignored_during_execution,
        None
    );
    let preferred = anti
        .preferred_during_scheduling_ignored_during_execution
        .unwrap_or_default();
    assert_eq!(preferred.len(), 1);
    assert_eq!(preferred[0].weight, 100);
    assert_eq!(
        preferred[0].pod_affinity_term.topology_key,
        "kubernetes.io/hostname"
    );
    assert!(selects_the_cluster(&preferred[0].pod_affinity_term));
    let spec = default.spec.expect("spec");
    assert_eq!(spec.node_selector, None);
    assert_eq!(spec.tolerations, None);
    assert_eq!(spec.topology_spread_constraints, None);
    assert_eq!(spec.priority_class_name, None);
    assert_eq!(spec.affinity.and_then(|a| a.node_affinity), None);
}

#[test]
fn required_anti_affinity_is_a_rule_over_the_topology_key_and_rolls_the_pods() {
    let required = pod_with_affinity("{podAntiAffinityType: required}");
    let anti = anti_affinity(&required);
    assert_eq!(
        anti.preferred_during_scheduling_ignored_during_execution,
        None
    );
    let terms = anti
        .required_during_scheduling_ignored_during_execution
        .unwrap_or_default();
    assert_eq!(terms.len(), 1);
    assert_eq!(terms[0].topology_key, "kubernetes.io/hostname");
    assert!(selects_the_cluster(&terms[0]));

    let zones = pod_with_affinity(
        "{podAntiAffinityType: required, topologyKey: topology.kubernetes.io/zone}",
    );
    let terms = anti_affinity(&zones)
        .required_during_scheduling_ignored_during_execution
        .unwrap_or_default();
    assert_eq!(terms[0].topology_key, "topology.kubernetes.io/zone");
    let preferred_zones = pod_with_affinity("{topologyKey: topology.kubernetes.io/zone}");
    let weighted = anti_affinity(&preferred_zones)
        .preferred_during_scheduling_ignored_during_execution
        .unwrap_or_default();
    assert_eq!(
        weighted[0].pod_affinity_term.topology_key,
        "topology.kubernetes.io/zone"
    );

    // Each change is a change of the Pod spec: the rolling update replaces the Pods.
    let hash = |p: &Pod| super::pod::spec_hash(&p.spec);
    let hashes = [
        hash(&pod("main-2")),
        hash(&required),
        hash(&zones),
        hash(&preferred_zones),
    ];
    for (i, a) in hashes.iter().enumerate() {
        for b in &hashes[i + 1..] {
            assert_ne!(a, b);
        }
    }
}

#[test]
fn node_selector_and_tolerations_reach_the_pod() {
    let p = pod_with_affinity(
        "{nodeSelector: {disktype: ssd}, tolerations: [{key: dedicated, value: db, effect: NoSchedule}, {operator: Exists, effect: NoExecute, tolerationSeconds: 30}]}",
    );
    let spec = p.spec.expect("spec");
    assert_eq!(
        spec.node_selector,
        Some([("disktype".to_string(), "ssd".to_string())].into())
    );
    let tolerations = spec.tolerations.unwrap_or_default();
    assert_eq!(
        serde_json::to_value(&tolerations).expect("serializes"),
        serde_json::json!([
            {"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"},
            {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
        ])
    );
}

#[test]
fn spread_node_affinity_and_priority_reach_the_pod_and_roll_it() {
    let p = pod_with_affinity(
        "{topologySpread: [{topologyKey: topology.kubernetes.io/zone, maxSkew: 2, whenUnsatisfiable: DoNotSchedule}, {topologyKey: kubernetes.io/hostname}],
          nodeAffinity: {required: [{matchExpressions: [{key: disktype, operator: In, values: [ssd, nvme]}, {key: spot, operator: DoesNotExist}]}],
                         preferred: [{weight: 30, matchExpressions: [{key: example.com/generation, operator: Gt, values: ['3']}]}]},
          priorityClassName: databases}",
    );
    let spec = p.spec.clone().expect("spec");
    assert_eq!(
        serde_json::to_value(&spec.topology_spread_constraints).expect("serializes"),
        serde_json::json!([
            {"labelSelector": {"matchLabels": {"database.example.com/cluster": "main"}},
             "maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"},
            {"labelSelector": {"matchLabels": {"database.example.com/cluster": "main"}},
             "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
        ])
    );
    let node = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.clone())
        .expect("node affinity");
    assert_eq!(
        serde_json::to_value(&node).expect("serializes"),
        serde_json::json!({
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "disktype", "operator": "In", "values": ["ssd", "nvme"]},
                {"key": "spot", "operator": "DoesNotExist"}
            ]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 30, "preference": {"matchExpressions": [
                {"key": "example.com/generation", "operator": "Gt", "values": ["3"]}
            ]}}]
        })
    );
    assert_eq!(spec.priority_class_name.as_deref(), Some("databases"));
    // The anti-affinity stays as it was beside the node affinity.
    assert_eq!(anti_affinity(&p), anti_affinity(&pod("main-2")));
    // Unset (or empty), nothing changes; set, the Pod rolls.
    assert_eq!(
        pod_with_affinity("{topologySpread: [], nodeAffinity: {}}"),
        pod("main-2")
    );
    let hash = |p: &Pod| super::pod::spec_hash(&p.spec);
    assert_ne!(hash(&p), hash(&pod("main-2")));
    assert_ne!(
        hash(&pod_with_affinity("{priorityClassName: databases}")),
        hash(&pod("main-2"))
    );
}

#[test]
fn the_app_uri_percent_encodes_a_password_that_could_break_it() {
    assert_eq!(secret::percent_encode("aZ09-._~"), "aZ09-._~");
    assert_eq!(
        secret::percent_encode("p@ss:w/rd%'\" $(x)"),
        "p%40ss%3Aw%2Frd%25%27%22%20%24%28x%29"
    );
    assert_eq!(secret::percent_encode("é"), "%C3%A9");
}

#[test]
fn the_network_policy_admits_the_selected_clients_and_the_operator_or_is_left_out() {
    let mut cluster = fixture();
    cluster.spec.network_policy.clients = vec![pgop_api::network::ClientSelector {
        pod_labels: BTreeMap::from([("app".to_string(), "shop".to_string())]),
        namespace_labels: Some(BTreeMap::new()),
    }];
    let settings = Settings {
        operator_namespace: Some("pgop-system".into()),
        ..Settings::default()
    };
    let build = |cluster: &PostgresCluster| {
        children(
            cluster,
            &instances(),
            &passwords(),
            &settings,
            &Budgets::new(3, false, true),
        )
        .expect("builds")
    };
    let policy = build(&cluster).network_policy.expect("a policy");
    let value = serde_json::to_value(&policy).expect("serializes");
    let rules = &value["spec"]["ingress"];
    // PostgreSQL: the cluster's instances, its poolers' Pods (the fixture has poolers),
    // then the selected clients in every namespace.
    assert_eq!(
        rules[0]["from"],
        serde_json::json!([
            {"podSelector": {"matchLabels": {
                "app.kubernetes.io/component": "database", "database.example.com/cluster": "main"}}},
            {"podSelector": {"matchLabels": {
                "app.kubernetes.io/component": "pooler", "app.kubernetes.io/instance": "main"}}},
            {"podSelector": {"matchLabels": {"app": "shop"}}, "namespaceSelector": {"matchLabels": {}}}
        ])
    );
    // Without poolers, no pooler peer.
    let mut without = cluster.clone();
    without.spec.poolers.clear();
    let policy = build(&without).network_policy.expect("a policy");
    let value = serde_json::to_value(&policy).expect("serializes");
    assert_eq!(
        value["spec"]["ingress"][0]["from"]
            .as_array()
            .map(|peers| peers.len()),
        Some(2)
    );
    assert_eq!(rules[0]["ports"][0]["port"], 5432);
    // The read-only port from anywhere; the TLS port from the operator's Pods only.
    assert_eq!(rules[1]["from"], serde_json::Value::Null);
    assert_eq!(rules[1]["ports"][0]["port"], 8000);
    assert_eq!(
        rules[2]["from"],
        serde_json::json!([{
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "pgop-operator"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pgop-system"}}
        }])
    );
    assert_eq!(rules[2]["ports"][0]["port"], 8001);

    cluster.spec.network_policy.enabled = false;
    assert!(build(&cluster).network_policy.is_none());
}

#[test]
fn each_instance_runs_the_major_it_is_built_for() {
    let mut wanted = instances();
    wanted[1].major = 18;
    let built = children(
        &fixture(),
        &wanted,
        &passwords(),
        &Settings::default(),
        &Budgets::new(3, false, true),
    )
    .expect("builds");
    let major_of = |p: &Pod| {
        p.spec.as_ref().expect("spec").containers[0]
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "PGOP_POSTGRES_MAJOR")
            .and_then(|e| e.value.clone())
    };
    let majors: Vec<_> = built.pods.iter().map(major_of).collect();
    assert_eq!(
        majors,
        vec![Some("15".into()), Some("18".into()), Some("15".into())]
    );
}

#[test]
fn the_upgrade_request_reaches_the_primary_and_changes_no_spec_hash() {
    let build = |upgrade_from| {
        let mut wanted = instances();
        wanted[0].major = 18;
        wanted[0].upgrade_from = upgrade_from;
        children(
            &fixture(),
            &wanted,
            &passwords(),
            &Settings::default(),
            &Budgets::new(3, false, true),
        )
        .expect("builds")
    };
    let upgrading = build(Some((15, pgop_api::cluster::MajorUpgradeMode::Link)));
    let after = build(None);
    let env_of = |p: &Pod, name: &str| {
        p.spec.as_ref().expect("spec").containers[0]
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    let primary = &upgrading.pods[0];
    assert_eq!(env_of(primary, "PGOP_UPGRADE_FROM").as_deref(), Some("15"));
    assert_eq!(
        env_of(primary, "PGOP_UPGRADE_MODE").as_deref(),
        Some("link")
    );
    assert_eq!(
        env_of(primary, "PGOP_POSTGRES_MAJOR").as_deref(),
        Some("18")
    );
    assert_eq!(env_of(&after.pods[0], "PGOP_UPGRADE_FROM"), None);
    assert_eq!(env_of(&upgrading.pods[1], "PGOP_UPGRADE_FROM"), None);
    let hash = |p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(pgop_api::constants::ANNOTATION_SPEC_HASH).cloned())
    };
    assert_eq!(hash(primary), hash(&after.pods[0]));
    // The major itself is part of the spec: a Pod built for another one is replaced.
    let mut on_15 = instances();
    on_15[0].upgrade_from = None;
    let before = children(
        &fixture(),
        &on_15,
        &passwords(),
        &Settings::default(),
        &Budgets::new(3, false, true),
    )
    .expect("builds");
    assert_ne!(hash(&before.pods[0]), hash(primary));
}

#[test]
fn managers_get_the_otlp_endpoint_only_when_one_is_set() {
    let endpoint_of = |settings: &Settings| -> Vec<Option<String>> {
        children(
            &fixture(),
            &instances(),
            &passwords(),
            settings,
            &Budgets::new(3, false, true),
        )
        .expect("builds")
        .pods
        .iter()
        .map(|p| {
            p.spec.as_ref().expect("spec").containers[0]
                .env
                .iter()
                .flatten()
                .find(|e| e.name == "OTEL_EXPORTER_OTLP_ENDPOINT")
                .and_then(|e| e.value.clone())
        })
        .collect()
    };
    assert!(
        endpoint_of(&Settings::default())
            .iter()
            .all(Option::is_none)
    );
    let traced = Settings {
        instance_otlp_endpoint: Some("http://collector.observability:4318".into()),
        ..Settings::default()
    };
    let endpoints = endpoint_of(&traced);
    assert!(!endpoints.is_empty());
    assert!(
        endpoints
            .iter()
            .all(|e| e.as_deref() == Some("http://collector.observability:4318")),
        "{endpoints:?}"
    );
}

#[test]
fn the_pod_spec_hashes_are_the_pods_whichever_instance_is_labelled_primary() {
    let hashes =
        super::pod_spec_hashes(&fixture(), &instances(), &Settings::default()).expect("hashes");
    let mut relabelled = instances();
    for i in relabelled.iter_mut() {
        i.primary = !i.primary;
    }
    for wanted in [instances(), relabelled] {
        let built = children(
            &fixture(),
            &wanted,
            &passwords(),
            &Settings::default(),
            &Budgets::new(wanted.len(), false, false),
        )
        .expect("children");
        assert_eq!(built.pods.len(), hashes.len());
        for p in &built.pods {
            let name = p.metadata.name.clone().unwrap_or_default();
            let live = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(pgop_api::constants::ANNOTATION_SPEC_HASH));
            assert_eq!(live, hashes.get(&name), "{name}");
        }
    }
}

#[test]
fn a_replica_cluster_s_instances_may_read_exactly_the_secrets_of_the_entry_they_follow() {
    let mut cluster = fixture();
    let extra: pgop_api::v1beta1::PostgresClusterSpec = serde_yaml::from_str(
        r#"
storage: {size: 1Gi}
externalClusters:
- name: site-a
  connection: {host: db.site-a, user: streaming_replica, passwordSecret: {name: site-a-pw},
               caSecret: {name: site-a-ca}, clientCertificateSecret: {name: site-a-client}}
  store: {s3: {bucket: site-a, credentialsSecret: {name: site-a-s3}}, cluster: db}
- name: site-b
  connection: {host: db.site-b, user: streaming_replica, passwordSecret: {name: site-b-pw},
               sslMode: require}
replica: {source: site-a}
"#,
    )
    .expect("spec parses");
    cluster.spec.external_clusters = extra.external_clusters;
    cluster.spec.replica = extra.replica;
    let built = build_of(&cluster);
    let secrets: Vec<String> = built
        .role
        .rules
        .iter()
        .flatten()
        .filter(|r| r.resources.as_deref() == Some(&["secrets".to_string()][..]))
        .flat_map(|r| r.resource_names.clone().unwrap_or_default())
        .collect();
    for name in ["site-a-pw", "site-a-ca", "site-a-client", "site-a-s3"] {
        assert!(secrets.iter().any(|s| s == name), "{name}: {secrets:?}");
    }
    // Not another entry's Secrets.
    assert!(!secrets.iter().any(|s| s == "site-b-pw"), "{secrets:?}");
}
