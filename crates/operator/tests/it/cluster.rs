//! The PostgresCluster controller against a real API server with kube-controller-manager
//! (testenv). Pods have no node yet, so tests play kubelet by patching pod status.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::{
    Event, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use pgop_api::PostgresCluster;
use pgop_api::cluster::ClusterPhase;
use pgop_testenv::wait;
use std::time::Duration;

async fn events(client: &kube::Client, ns: &str, reason: &str) -> Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect())
}

#[tokio::test]
async fn a_cluster_gets_every_child_and_turns_ready_when_its_pods_are() -> Result {
    let (plane, client, ns) = setup("cluster-ready").await?;
    let ns_name = ns.name().to_string();
    let n = ns_name.as_str();
    let op = Operator::start(&client, n);
    let created = create(&client, n, &cluster("main", 3)).await?;
    let uid = created.uid().ok_or("no uid")?;

    wait_names::<Pod>(&client, n, "main", &["main-1", "main-2", "main-3"]).await?;
    wait_names::<PersistentVolumeClaim>(&client, n, "main", &["main-1", "main-2", "main-3"])
        .await?;
    wait_names::<Service>(&client, n, "main", &["main-r", "main-ro", "main-rw"]).await?;
    wait_names::<Secret>(
        &client,
        n,
        "main",
        &[
            "main-app",
            "main-ca",
            "main-manager-tls",
            "main-postgres-ca",
            "main-replication",
            "main-replication-tls",
            "main-server-tls",
        ],
    )
    .await?;
    wait_names::<PodDisruptionBudget>(&client, n, "main", &["main"]).await?;
    wait_names::<ServiceAccount>(&client, n, "main", &["main"]).await?;
    wait_names::<Role>(&client, n, "main", &["main"]).await?;
    wait_names::<RoleBinding>(&client, n, "main", &["main"]).await?;
    wait_names::<NetworkPolicy>(&client, n, "main", &["main"]).await?;

    // Every child is owned by the cluster.
    let pods: Api<Pod> = Api::namespaced(client.clone(), n);
    for pod in pods.list(&ListParams::default()).await?.items {
        let owner = pod.owner_references().first().cloned().ok_or("no owner")?;
        assert_eq!(owner.uid, uid);
        assert_eq!(owner.controller, Some(true));
        let role = pod.labels().get("database.example.com/role").cloned();
        let expected = if pod.name_any() == "main-1" {
            "primary"
        } else {
            "replica"
        };
        assert_eq!(role.as_deref(), Some(expected), "{}", pod.name_any());
    }
    let secret: Secret = Api::namespaced(client.clone(), n).get("main-app").await?;
    let password = secret
        .data
        .as_ref()
        .and_then(|d| d.get("password"))
        .map(|p| p.0.len());
    assert_eq!(password, Some(32));

    let c = wait_cluster(&client, n, "main", "phase Creating", |c| {
        phase(c) == Some(ClusterPhase::Creating)
    })
    .await?;
    assert_eq!(
        condition(&c, "Ready").map(|c| c.status.as_str()),
        Some("False")
    );
    assert_eq!(
        condition(&c, "SpecValid").map(|c| c.reason.as_str()),
        Some("Valid")
    );

    for pod in ["main-1", "main-2", "main-3"] {
        make_ready(&client, n, pod, true).await?;
    }
    let c = wait_cluster(&client, n, "main", "phase Ready", |c| {
        phase(c) == Some(ClusterPhase::Ready)
    })
    .await?;
    let status = c.status.clone().ok_or("no status")?;
    assert_eq!(status.ready_replicas, 3);
    assert_eq!(status.current_primary.as_deref(), Some("main-1"));
    assert_eq!(status.observed_generation, c.metadata.generation);
    let ready = condition(&c, "Ready").ok_or("no Ready condition")?;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "AllInstancesReady")
    );
    assert_eq!(
        condition(&c, "Progressing").map(|c| c.status.as_str()),
        Some("False")
    );
    assert_eq!(
        condition(&c, "Degraded").map(|c| c.status.as_str()),
        Some("False")
    );

    // What a person would run.
    kubectl(
        plane,
        &[
            "-n",
            n,
            "wait",
            "--for=condition=Ready",
            "pgc/main",
            "--timeout=30s",
        ],
    )
    .await?;
    let table = kubectl(plane, &["-n", n, "get", "pgc"]).await?;
    assert!(
        table.contains("INSTANCES") && table.contains("PRIMARY") && table.contains("PHASE"),
        "{table}"
    );
    assert!(
        table.contains("main-1") && table.contains("Ready"),
        "{table}"
    );
    assert_eq!(events(&client, n, "Created").await?.len(), 1);

    // spec.networkPolicy.enabled: false removes the policy; true brings it back.
    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), n);
    for (enabled, expected) in [(false, &[][..]), (true, &["main"][..])] {
        let patch = serde_json::json!({"spec": {"networkPolicy": {"enabled": enabled}}});
        clusters
            .patch("main", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        wait_names::<NetworkPolicy>(&client, n, "main", expected).await?;
    }

    // A standby failing turns the cluster Degraded.
    make_ready(&client, n, "main-3", false).await?;
    let c = wait_cluster(&client, n, "main", "phase Degraded", |c| {
        phase(c) == Some(ClusterPhase::Degraded)
    })
    .await?;
    assert_eq!(
        condition(&c, "Degraded").map(|c| c.status.as_str()),
        Some("True")
    );

    op.stop().await;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn scaling_adds_new_serials_and_removes_the_highest_non_primary() -> Result {
    let (plane, client, ns) = setup("cluster-scale").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    let op = Operator::start(&client, n);
    create(&client, n, &cluster("db", 2)).await?;
    wait_names::<Pod>(&client, n, "db", &["db-1", "db-2"]).await?;

    kubectl(plane, &["-n", n, "scale", "pgc/db", "--replicas=4"]).await?;
    wait_names::<Pod>(&client, n, "db", &["db-1", "db-2", "db-3", "db-4"]).await?;
    wait_names::<PersistentVolumeClaim>(&client, n, "db", &["db-1", "db-2", "db-3", "db-4"])
        .await?;

    kubectl(plane, &["-n", n, "scale", "pgc/db", "--replicas=2"]).await?;
    wait_names::<Pod>(&client, n, "db", &["db-1", "db-2"]).await?;
    wait_names::<PersistentVolumeClaim>(&client, n, "db", &["db-1", "db-2"]).await?;

    // Serials 3 and 4 are never handed out again.
    kubectl(plane, &["-n", n, "scale", "pgc/db", "--replicas=3"]).await?;
    wait_names::<Pod>(&client, n, "db", &["db-1", "db-2", "db-5"]).await?;
    let c = wait_cluster(&client, n, "db", "nextSerial 6", |c| {
        c.status.as_ref().is_some_and(|s| s.next_serial == 6)
    })
    .await?;
    assert_eq!(
        c.status.and_then(|s| s.current_primary).as_deref(),
        Some("db-1")
    );
    assert!(!events(&client, n, "Scaled").await?.is_empty());
    op.stop().await;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn spread_node_affinity_and_priority_reach_pods_the_api_server_accepts() -> Result {
    let (_plane, client, ns) = setup("cluster-placement").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    // A PriorityClass of this test's own (cluster-scoped; the plane is shared).
    let class = format!("pgop-{n}");
    let classes: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": class}, "value": 1000
            }))?,
        )
        .await?;
    let op = Operator::start(&client, n);
    let mut c = cluster("db", 2);
    c.spec.affinity = serde_json::from_value(serde_json::json!({
        "topologySpread": [{"topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}],
        "nodeAffinity": {"required": [{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]}]},
        "priorityClassName": class
    }))?;
    create(&client, n, &c).await?;
    wait_names::<Pod>(&client, n, "db", &["db-1", "db-2"]).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), n);
    for name in ["db-1", "db-2"] {
        let spec = pods.get(name).await?.spec.ok_or("a Pod spec")?;
        // The API server resolved the class into the Pod's priority.
        assert_eq!(spec.priority_class_name.as_deref(), Some(class.as_str()));
        assert_eq!(spec.priority, Some(1000));
        let spread = spec.topology_spread_constraints.unwrap_or_default();
        assert_eq!(spread.len(), 1);
        assert_eq!(spread[0].when_unsatisfiable, "DoNotSchedule");
        assert!(
            spec.affinity
                .and_then(|a| a.node_affinity)
                .and_then(|a| a.required_during_scheduling_ignored_during_execution)
                .is_some(),
            "{name} has the required node affinity"
        );
    }
    op.stop().await;
    classes.delete(&class, &Default::default()).await?;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn a_refused_volume_expansion_is_a_condition_and_an_event_and_does_not_hold_back_the_pods()
-> Result {
    let (_plane, client, ns) = setup("cluster-grow").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    let op = Operator::start(&client, n);
    create(&client, n, &cluster("db", 2)).await?;
    wait_names::<PersistentVolumeClaim>(&client, n, "db", &["db-1", "db-2"]).await?;
    wait_names::<Pod>(&client, n, "db", &["db-1", "db-2"]).await?;
    // No provisioner here: the claims stay unbound, and the API server refuses to resize
    // an unbound claim. Grown and scaled up in one change.
    Api::<PostgresCluster>::namespaced(client.clone(), n)
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 3, "storage": {"size": "2Gi"}}})),
        )
        .await?;
    wait_names::<Pod>(&client, n, "db", &["db-1", "db-2", "db-3"]).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), n);
    let size = |c: &PersistentVolumeClaim| {
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone())
    };
    assert_eq!(size(&claims.get("db-3").await?).as_deref(), Some("2Gi"));
    assert_eq!(size(&claims.get("db-1").await?).as_deref(), Some("1Gi"));
    let refused = wait::until("a VolumeResizeRefused Event", TIMEOUT, || async {
        let found = events(&client, n, "VolumeResizeRefused")
            .await
            .map_err(|e| e.to_string())?;
        found
            .into_iter()
            .next()
            .ok_or_else(|| "none yet".to_string())
    })
    .await?;
    assert_eq!(refused.type_.as_deref(), Some("Warning"));
    let note = refused.message.unwrap_or_default();
    assert!(
        note.contains("PersistentVolumeClaim db-") && note.contains("spec.storage.size"),
        "{note}"
    );
    // And a condition, which stays while the claims ask for less.
    let refused = wait_cluster(
        &client,
        n,
        "db",
        "VolumesResized=False (ResizeRefused)",
        |c| {
            c.status.as_ref().is_some_and(|s| {
                pgop_api::conditions::find_condition(
                    &s.conditions,
                    pgop_api::conditions::VOLUMES_RESIZED,
                )
                .is_some_and(|c| c.status == "False" && c.reason == "ResizeRefused")
            })
        },
    )
    .await?;
    let message = refused
        .status
        .as_ref()
        .and_then(|s| {
            pgop_api::conditions::find_condition(
                &s.conditions,
                pgop_api::conditions::VOLUMES_RESIZED,
            )
        })
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("keeps its size") && message.contains("2Gi"),
        "{message}"
    );
    op.stop().await;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn scaling_down_keeps_the_primary_even_when_it_has_the_highest_serial() -> Result {
    let (_plane, client, ns) = setup("cluster-scale-primary").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    let op = Operator::start(&client, n);
    create(&client, n, &cluster("p", 3)).await?;
    wait_names::<Pod>(&client, n, "p", &["p-1", "p-2", "p-3"]).await?;
    wait_cluster(&client, n, "p", "a primary", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.current_primary.is_some())
    })
    .await?;
    op.stop().await;

    // As after a failover to p-3 (the HA work moves the primary; here the status says so).
    let api: Api<PostgresCluster> = Api::namespaced(client.clone(), n);
    let patch = serde_json::json!({"status": {"currentPrimary": "p-3", "targetPrimary": "p-3"}});
    api.patch_status("p", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let op = Operator::start(&client, n);
    api.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 1}})),
    )
    .await?;
    wait_names::<Pod>(&client, n, "p", &["p-3"]).await?;
    let pod: Pod = Api::namespaced(client.clone(), n).get("p-3").await?;
    assert_eq!(
        pod.labels()
            .get("database.example.com/role")
            .map(String::as_str),
        Some("primary")
    );
    op.stop().await;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn deleting_the_cluster_removes_every_child_through_the_garbage_collector() -> Result {
    let (_plane, client, ns) = setup("cluster-delete").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    let op = Operator::start(&client, n);
    create(&client, n, &cluster("gone", 2)).await?;
    wait_names::<Pod>(&client, n, "gone", &["gone-1", "gone-2"]).await?;
    wait_names::<Secret>(
        &client,
        n,
        "gone",
        &[
            "gone-app",
            "gone-ca",
            "gone-manager-tls",
            "gone-postgres-ca",
            "gone-replication",
            "gone-replication-tls",
            "gone-server-tls",
        ],
    )
    .await?;
    Api::<PostgresCluster>::namespaced(client.clone(), n)
        .delete("gone", &DeleteParams::foreground())
        .await?;
    wait_names::<Pod>(&client, n, "gone", &[]).await?;
    wait_names::<PersistentVolumeClaim>(&client, n, "gone", &[]).await?;
    wait_names::<Service>(&client, n, "gone", &[]).await?;
    wait_names::<Secret>(&client, n, "gone", &[]).await?;
    wait_names::<PodDisruptionBudget>(&client, n, "gone", &[]).await?;
    wait_names::<ServiceAccount>(&client, n, "gone", &[]).await?;
    wait_names::<Role>(&client, n, "gone", &[]).await?;
    wait_names::<RoleBinding>(&client, n, "gone", &[]).await?;
    wait::until("the cluster to be gone", TIMEOUT, || async {
        match Api::<PostgresCluster>::namespaced(client.clone(), n)
            .get_opt("gone")
            .await
        {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|c| c.map(|c| c.status)))),
        }
    })
    .await?;
    op.stop().await;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn damage_to_children_is_repaired_and_a_users_extra_label_is_kept() -> Result {
    let (_plane, client, ns) = setup("cluster-repair").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    let op = Operator::start(&client, n);
    create(&client, n, &cluster("fix", 1)).await?;
    wait_names::<Service>(&client, n, "fix", &["fix-r", "fix-ro", "fix-rw"]).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), n);

    // A user's own label (their own field manager) on a child.
    services
        .patch("fix-r", &PatchParams::apply("someone-else"), &Patch::Apply(serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "fix-r", "labels": {"team": "payments"}}
        })))
        .await?;
    // Damage: a deleted Service and a changed selector.
    services.delete("fix-rw", &DeleteParams::default()).await?;
    services
        .patch(
            "fix-ro",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "spec": {"selector": {"database.example.com/role": "primary"}}
            })),
        )
        .await?;

    wait_names::<Service>(&client, n, "fix", &["fix-r", "fix-ro", "fix-rw"]).await?;
    wait::until("the -ro selector to be restored", TIMEOUT, || {
        let services = services.clone();
        async move {
            let s = services.get("fix-ro").await.map_err(|e| e.to_string())?;
            let role = s
                .spec
                .and_then(|s| s.selector)
                .and_then(|s| s.get("database.example.com/role").cloned());
            if role.as_deref() == Some("replica") {
                Ok(())
            } else {
                Err(format!("{role:?}"))
            }
        }
    })
    .await?;
    let r = services.get("fix-r").await?;
    assert_eq!(
        r.labels().get("team").map(String::as_str),
        Some("payments"),
        "a user's label is not fought over"
    );
    op.stop().await;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn a_paused_cluster_is_left_alone_until_resumed() -> Result {
    let (_plane, client, ns) = setup("cluster-paused").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    let op = Operator::start(&client, n);
    let mut c = cluster("still", 1);
    c.spec.paused = true;
    create(&client, n, &c).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(names::<Pod>(&client, n, "still").await?.is_empty());
    assert!(names::<Service>(&client, n, "still").await?.is_empty());
    assert!(
        get(&client, n, "still").await?.status.is_none(),
        "a paused cluster's status is not touched"
    );

    let api: Api<PostgresCluster> = Api::namespaced(client.clone(), n);
    api.patch(
        "still",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
    )
    .await?;
    wait_names::<Pod>(&client, n, "still", &["still-1"]).await?;
    op.stop().await;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn an_operator_killed_mid_reconcile_converges_to_the_same_state_after_restart() -> Result {
    let (_plane, client, ns) = setup("cluster-restart").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    let op = Operator::start(&client, n);
    create(&client, n, &cluster("crash", 3)).await?;
    // Kill it as soon as the first child exists: the reconcile is half done.
    wait::until("the first child", TIMEOUT, || async {
        match names::<ServiceAccount>(&client, n, "crash").await {
            Ok(v) if !v.is_empty() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    op.kill().await;

    let op = Operator::start(&client, n);
    // Serials reserved by the interrupted reconcile may be skipped (never reused), so the
    // names depend on where it was killed; the shape must not.
    let c = wait_cluster(&client, n, "crash", "3 instances in status", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.instances.len() == 3 && s.replicas == 3)
    })
    .await?;
    let status = c.status.ok_or("no status")?;
    let instances: Vec<String> = status.instances.iter().map(|i| i.name.clone()).collect();
    let expected: Vec<&str> = instances.iter().map(String::as_str).collect();
    wait_names::<Pod>(&client, n, "crash", &expected).await?;
    wait_names::<PersistentVolumeClaim>(&client, n, "crash", &expected).await?;
    wait_names::<Secret>(
        &client,
        n,
        "crash",
        &[
            "crash-app",
            "crash-ca",
            "crash-manager-tls",
            "crash-postgres-ca",
            "crash-replication",
            "crash-replication-tls",
            "crash-server-tls",
        ],
    )
    .await?;
    let max_serial = status
        .instances
        .iter()
        .map(|i| i.serial)
        .max()
        .ok_or("no instances")?;
    assert_eq!(status.next_serial, max_serial + 1);
    assert_eq!(
        status.current_primary.as_deref(),
        Some(instances[0].as_str())
    );
    // Roles in status.instances are what the instances report (none run here); the
    // operator's own mark is the role label, on exactly one pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), n);
    let primaries = pods
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            pgop_api::labels::ROLE,
            pgop_api::labels::ROLE_PRIMARY
        )))
        .await?;
    let primaries: Vec<String> = primaries.items.iter().map(|p| p.name_any()).collect();
    assert_eq!(primaries, [instances[0].clone()]);
    op.stop().await;
    ns.delete().await?;
    Ok(())
}
