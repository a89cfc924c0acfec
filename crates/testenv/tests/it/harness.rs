//! The harness against the real control plane it starts.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use pgop_testenv::{ControlPlane, Options, TestNamespace, crds, shared, wait};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_string());
    cm.data = Some(
        data.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    );
    cm
}

#[tokio::test]
async fn config_map_create_get_list_watch_apply_delete() -> Result {
    let plane = shared().await?;
    let ns = TestNamespace::create(plane.config(), "harness-crud").await?;
    let api: Api<ConfigMap> = Api::namespaced(plane.client()?, ns.name());

    let mut events = api
        .watch(
            &WatchParams::default().fields("metadata.name=settings"),
            "0",
        )
        .await?
        .try_filter(|e| std::future::ready(!matches!(e, WatchEvent::Bookmark(_))))
        .boxed();

    api.create(
        &PostParams::default(),
        &config_map("settings", &[("color", "blue")]),
    )
    .await?;
    let got = api.get("settings").await?;
    assert_eq!(
        got.data
            .as_ref()
            .and_then(|d| d.get("color"))
            .map(String::as_str),
        Some("blue")
    );

    let listed = api.list(&ListParams::default()).await?;
    let names: Vec<String> = listed.items.iter().map(|c| c.name_any()).collect();
    assert!(names.contains(&"settings".to_string()), "{names:?}");

    let first = tokio::time::timeout(Duration::from_secs(10), events.try_next()).await??;
    match first {
        Some(WatchEvent::Added(cm)) => assert_eq!(cm.name_any(), "settings"),
        other => panic!("expected an Added event, got {other:?}"),
    }

    // Server-side apply: the field manager owns `data.color` and changes it.
    let patch = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings"},
        "data": {"color": "green", "size": "large"}
    });
    let applied = api
        .patch(
            "settings",
            &PatchParams::apply("harness-test").force(),
            &Patch::Apply(&patch),
        )
        .await?;
    let data = applied.data.clone().unwrap_or_default();
    assert_eq!(data.get("color").map(String::as_str), Some("green"));
    assert_eq!(data.get("size").map(String::as_str), Some("large"));
    let managers: Vec<String> = applied
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.contains(&"harness-test".to_string()),
        "{managers:?}"
    );
    let modified = tokio::time::timeout(Duration::from_secs(10), events.try_next()).await??;
    assert!(
        matches!(modified, Some(WatchEvent::Modified(_))),
        "{modified:?}"
    );

    api.delete("settings", &DeleteParams::default()).await?;
    assert!(api.get_opt("settings").await?.is_none());
    let deleted = tokio::time::timeout(Duration::from_secs(10), events.try_next()).await??;
    assert!(
        matches!(deleted, Some(WatchEvent::Deleted(_))),
        "{deleted:?}"
    );

    ns.delete().await?;
    Ok(())
}

const TEST_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.harness.pgop.test
spec:
  group: harness.pgop.test
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "self.minSize <= self.maxSize"
              message: "minSize must not exceed maxSize"
            properties:
              minSize: {type: integer}
              maxSize: {type: integer}
"#;

#[tokio::test]
async fn crd_with_cel_rule_rejects_a_violating_object_with_its_message() -> Result {
    let plane = shared().await?;
    let client = plane.client()?;
    crds::install(&client, crds::from_yaml(TEST_CRD)?).await?;
    // Installing again is harmless (server-side apply).
    crds::install(&client, crds::from_yaml(TEST_CRD)?).await?;
    let ns = TestNamespace::create(plane.config(), "harness-cel").await?;

    let gvk = kube::api::GroupVersionKind::gvk("harness.pgop.test", "v1", "Widget");
    let resource = kube::api::ApiResource::from_gvk(&gvk);
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client, ns.name(), &resource);
    let widget = |name: &str, min: i64, max: i64| -> Result<kube::api::DynamicObject> {
        Ok(serde_json::from_value(serde_json::json!({
            "apiVersion": "harness.pgop.test/v1", "kind": "Widget",
            "metadata": {"name": name},
            "spec": {"minSize": min, "maxSize": max}
        }))?)
    };

    api.create(&PostParams::default(), &widget("good", 1, 2)?)
        .await?;
    let err = api
        .create(&PostParams::default(), &widget("bad", 3, 2)?)
        .await
        .expect_err("a widget with minSize > maxSize must be rejected");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("minSize must not exceed maxSize"),
                "{}",
                status.message
            );
            assert!(
                status.message.contains("spec"),
                "the message names the field: {}",
                status.message
            );
        }
        other => panic!("expected an API error, got {other}"),
    }
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn deleting_an_owner_garbage_collects_what_it_owns() -> Result {
    let plane = shared().await?;
    let ns = TestNamespace::create(plane.config(), "harness-gc").await?;
    let api: Api<ConfigMap> = Api::namespaced(plane.client()?, ns.name());

    let owner = api
        .create(&PostParams::default(), &config_map("owner", &[]))
        .await?;
    let mut owned = config_map("owned", &[]);
    owned.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.name_any(),
        uid: owner.uid().ok_or("owner has no uid")?,
        ..OwnerReference::default()
    }]);
    api.create(&PostParams::default(), &owned).await?;

    api.delete("owner", &DeleteParams::background()).await?;
    wait::until(
        "the owned ConfigMap to be garbage-collected",
        Duration::from_secs(60),
        || {
            let api = api.clone();
            async move {
                match api.get_opt("owned").await {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => Err("still there".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await?;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn kubectl_works_with_the_written_kubeconfig() -> Result {
    let plane = shared().await?;
    let kubectl = pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Kubectl)?;
    let out = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(plane.kubeconfig())
        .args(["get", "namespace", "kube-system", "-o", "name"])
        .output()
        .await?;
    assert!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "namespace/kube-system"
    );
    Ok(())
}

fn pid_gone(pid: u32) -> bool {
    // A reaped child has no /proc entry; a zombie would still count as left behind.
    !PathBuf::from(format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn two_control_planes_in_parallel_do_not_collide() -> Result {
    let (a, b) = tokio::join!(
        ControlPlane::start(Options::default()),
        ControlPlane::start(Options::default())
    );
    let (a, b) = (a?, b?);
    assert_ne!(a.server(), b.server());
    assert_ne!(a.dir(), b.dir());
    let api_a: Api<ConfigMap> = Api::namespaced(a.client()?, "default");
    let api_b: Api<ConfigMap> = Api::namespaced(b.client()?, "default");
    api_a
        .create(
            &PostParams::default(),
            &config_map("same-name", &[("plane", "a")]),
        )
        .await?;
    api_b
        .create(
            &PostParams::default(),
            &config_map("same-name", &[("plane", "b")]),
        )
        .await?;
    let seen_a = api_a.get("same-name").await?.data.unwrap_or_default();
    let seen_b = api_b.get("same-name").await?.data.unwrap_or_default();
    assert_eq!(seen_a.get("plane").map(String::as_str), Some("a"));
    assert_eq!(seen_b.get("plane").map(String::as_str), Some("b"));
    Ok(())
}

#[tokio::test]
async fn dropping_the_harness_leaves_no_process_and_no_directory() -> Result {
    let plane = ControlPlane::start(
        Options::default()
            .with_controller_manager()
            .with_scheduler(),
    )
    .await?;
    let pids = plane.pids();
    let dir = plane.dir().to_path_buf();
    assert_eq!(
        pids.len(),
        4,
        "etcd, kube-apiserver, kube-controller-manager, kube-scheduler"
    );
    assert!(pids.iter().all(|p| !pid_gone(*p)));
    drop(plane);
    for pid in pids {
        assert!(pid_gone(pid), "process {pid} is still there");
    }
    assert!(!dir.exists(), "{} is still there", dir.display());
    Ok(())
}

#[tokio::test]
async fn a_panicking_test_still_stops_its_control_plane() -> Result {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let plane = ControlPlane::start(Options::default())
            .await
            .expect("control plane starts");
        let _ = tx.send((plane.pids(), plane.dir().to_path_buf()));
        panic!("a test failing while it holds a control plane");
    });
    assert!(task.await.is_err(), "the task panicked");
    let (pids, dir) = rx.await?;
    for pid in pids {
        assert!(pid_gone(pid), "process {pid} is still there");
    }
    assert!(!dir.exists(), "{} is still there", dir.display());
    Ok(())
}

#[tokio::test]
async fn missing_binaries_are_an_error_naming_the_install_command() -> Result {
    let empty = std::env::temp_dir().join(format!("pgop-no-binaries-{}", std::process::id()));
    std::fs::create_dir_all(&empty)?;
    let err = ControlPlane::start(Options::default().with_bin_dir(&empty))
        .await
        .expect_err("starting without binaries must fail");
    let msg = err.to_string();
    std::fs::remove_dir_all(&empty)?;
    assert!(msg.contains("hack/install-testenv.sh"), "{msg}");
    assert!(msg.contains("etcd"), "{msg}");
    Ok(())
}
