//! The OLM bundle `bundle/` (docs/olm.md): it is `hack/render-bundle.sh`'s rendering of the
//! chart, so it cannot drift from it; its ClusterServiceVersion says what the chart says
//! (the Deployment, the RBAC, the webhooks, the version, the examples); operator-sdk's
//! validation library (`bundle-validate`, built by `hack/install-bundle-validate.sh`) finds
//! nothing in it, default validators and the OperatorHub suite alike, and does find what
//! is wrong in broken copies of it; a real kube-apiserver accepts, with strict field
//! validation, the CSV against OLM's own CRD, and its Deployment and rules as objects; and
//! pgop converts PostgresClusters with a certificate mounted the way OLM mounts its own,
//! for the bundle's CRDs, on which the `alm-examples` apply.
//!
//! Helm is built by `hack/install-testenv.sh` into the testenv bin directory.

use crate::common;

use common::*;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery;
use pgop_testenv::TempDir;
use serde_yaml::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const CSV: &str = "manifests/pgop.clusterserviceversion.yaml";
const INSTALL_VALIDATOR: &str = "hack/install-bundle-validate.sh";
/// Where OLM mounts the certificate it issues for the webhooks.
const OLM_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bundle() -> PathBuf {
    root().join("bundle")
}

/// The helm that `hack/install-testenv.sh` builds, or an error naming that script.
fn helm() -> Result<PathBuf> {
    Ok(pgop_testenv::binaries::locate(
        pgop_testenv::binaries::Binary::Helm,
    )?)
}

/// bundle-validate: `PGOP_BUNDLE_VALIDATE`, else where `hack/install-bundle-validate.sh`
/// puts it; an error naming that script when it is not there.
fn validator() -> Result<PathBuf> {
    let path = match std::env::var_os("PGOP_BUNDLE_VALIDATE") {
        Some(path) => PathBuf::from(path),
        None => pgop_testenv::binaries::cache_dir().join("bundle-validate/bin/bundle-validate"),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "bundle-validate not found at {}: build it with `{INSTALL_VALIDATOR}` (or set PGOP_BUNDLE_VALIDATE)",
            path.display()
        )
        .into())
    }
}

/// The Kubernetes minor testenv runs, `1.34` (`--k8s-version` of alpha-deprecated-apis).
fn k8s_minor() -> Result<String> {
    let env = std::fs::read_to_string(root().join("hack/testenv-versions.env"))?;
    let version = env
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
        .ok_or("no KUBERNETES_VERSION in hack/testenv-versions.env")?;
    let (minor, _patch) = version
        .trim()
        .rsplit_once('.')
        .ok_or_else(|| format!("KUBERNETES_VERSION {version:?} is not X.Y.Z"))?;
    Ok(minor.to_string())
}

/// Runs bundle-validate on `dir`: its exit status and output.
fn validate(dir: &Path) -> Result<(Option<i32>, String)> {
    let validator = validator()?;
    let out = Command::new(&validator)
        .arg("--k8s-version")
        .arg(k8s_minor()?)
        .arg(dir)
        .output()
        .map_err(|e| format!("failed to run {}: {e}", validator.display()))?;
    Ok((out.status.code(), text(&out)))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every file under `dir`, by path relative to it, with its contents.
fn files(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) -> Result {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(base, &path, out)?;
            } else {
                let name = path
                    .strip_prefix(base)?
                    .to_string_lossy()
                    .replace('\\', "/");
                out.insert(name, std::fs::read(&path)?);
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

/// A copy of `bundle/` in a temporary directory.
fn copy_of_bundle(label: &str) -> Result<TempDir> {
    let dir = TempDir::new(label)?;
    for (name, contents) in files(&bundle())? {
        let path = dir.0.join(&name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, contents)?;
    }
    Ok(dir)
}

/// Replaces `from` (which must be there) with `to` in `file` of `dir`.
fn edit(dir: &Path, file: &str, from: &str, to: &str) -> Result {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path)?;
    assert!(text.contains(from), "{from:?} not in {file}");
    std::fs::write(&path, text.replacen(from, to, 1))?;
    Ok(())
}

fn yaml_file(path: &Path) -> Result<Value> {
    Ok(serde_yaml::from_str(&std::fs::read_to_string(path)?)?)
}

fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).expect("valid YAML in the test")
}

fn csv() -> Result<Value> {
    yaml_file(&bundle().join(CSV))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

#[test]
fn bundle_is_the_chart_rendered_for_olm() -> Result {
    let out = TempDir::new("olm-render")?;
    let status = Command::new(root().join("hack/render-bundle.sh"))
        .arg("--out")
        .arg(&out.0)
        .env("HELM", helm()?)
        .output()?;
    assert!(
        status.status.success(),
        "hack/render-bundle.sh --out failed:\n{}",
        text(&status)
    );
    let rendered = files(&out.0)?;
    let committed = files(&bundle())?;
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        committed.keys().collect::<Vec<_>>(),
        "files in bundle/; regenerate it with hack/render-bundle.sh"
    );
    for (name, contents) in &rendered {
        assert!(
            Some(contents) == committed.get(name),
            "bundle/{name} differs from the chart's rendering; regenerate it with hack/render-bundle.sh"
        );
    }
    Ok(())
}

#[test]
fn the_csv_says_what_the_chart_says() -> Result {
    let csv = csv()?;
    let spec = &csv["spec"];
    assert_eq!(
        csv["metadata"]["name"].as_str(),
        Some(&*format!("pgop.v{VERSION}"))
    );
    assert_eq!(spec["version"].as_str(), Some(VERSION));
    let minor = k8s_minor()?;
    assert_eq!(
        spec["minKubeVersion"].as_str(),
        Some(&*format!("{minor}.0"))
    );
    // The image of the chart's default values: pgop:<version>.
    let image = format!("pgop:{VERSION}");
    assert_eq!(
        csv["metadata"]["annotations"]["containerImage"].as_str(),
        Some(image.as_str())
    );

    // All namespaces only: OLM allows a conversion webhook in no other install mode.
    let modes: Vec<(String, bool)> = spec["installModes"]
        .as_sequence()
        .ok_or("installModes")?
        .iter()
        .map(|m| {
            (
                m["type"].as_str().unwrap_or_default().to_string(),
                m["supported"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    for (mode, supported) in &modes {
        assert_eq!(*supported, mode == "AllNamespaces", "{mode}");
    }
    assert_eq!(modes.len(), 4);

    // The examples are examples/'s, and name the owned kinds.
    let examples: Vec<serde_json::Value> = serde_json::from_str(
        csv["metadata"]["annotations"]["alm-examples"]
            .as_str()
            .ok_or("alm-examples")?,
    )?;
    let mut from_files = Vec::new();
    for file in ["cluster.yaml", "backup.yaml"] {
        let text = std::fs::read_to_string(root().join("examples").join(file))?;
        from_files.push(serde_yaml::from_str::<serde_json::Value>(&text)?);
    }
    assert_eq!(examples, from_files);
    let owned: Vec<(String, String)> = spec["customresourcedefinitions"]["owned"]
        .as_sequence()
        .ok_or("owned")?
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["version"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        owned,
        [
            ("PostgresCluster".to_string(), "v1beta1".to_string()),
            ("PostgresBackup".to_string(), "v1alpha1".to_string()),
        ]
    );
    for (example, (kind, version)) in examples.iter().zip(&owned) {
        assert_eq!(example["kind"].as_str(), Some(kind.as_str()));
        assert_eq!(
            example["apiVersion"].as_str(),
            Some(&*format!("database.example.com/{version}"))
        );
    }

    // The Deployment: the chart's, serving the webhooks with OLM's certificate and without
    // pgop's own certificate keeper.
    let install = &spec["install"]["spec"];
    let deployments = install["deployments"].as_sequence().ok_or("deployments")?;
    assert_eq!(deployments.len(), 1);
    let deployment = &deployments[0];
    assert_eq!(deployment["name"].as_str(), Some("pgop-operator"));
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"].as_str(), Some(image.as_str()));
    let args = strings(&container["args"]);
    assert_eq!(
        args,
        [
            "--metrics-bind-address=0.0.0.0:8080".to_string(),
            format!("--image={image}"),
            "--concurrency=4".to_string(),
            "--leader-elect=true".to_string(),
            "--leader-election-name=pgop-operator".to_string(),
            "--webhook-bind-address=:9443".to_string(),
            format!("--webhook-cert-dir={OLM_CERT_DIR}"),
        ]
    );
    // No Helm labels: OLM manages it.
    let labels = &deployment["label"];
    assert!(labels.get("helm.sh/chart").is_none(), "{labels:?}");
    assert!(
        labels.get("app.kubernetes.io/managed-by").is_none(),
        "{labels:?}"
    );

    // The RBAC: the chart's ClusterRole, and of the webhooks' only the PriorityClass read
    // (OLM keeps the caBundles and the CRD's conversion; nothing patches a CRD).
    let permissions = install["clusterPermissions"]
        .as_sequence()
        .ok_or("clusterPermissions")?;
    assert_eq!(permissions.len(), 1);
    assert_eq!(
        permissions[0]["serviceAccountName"].as_str(),
        Some("pgop-operator")
    );
    let rules = permissions[0]["rules"].as_sequence().ok_or("rules")?;
    let groups: Vec<String> = rules
        .iter()
        .flat_map(|r| strings(&r["apiGroups"]))
        .collect();
    for group in [
        "database.example.com",
        "",
        "coordination.k8s.io",
        "scheduling.k8s.io",
    ] {
        assert!(groups.iter().any(|g| g == group), "{group:?} in {groups:?}");
    }
    for group in ["admissionregistration.k8s.io", "apiextensions.k8s.io"] {
        assert!(
            !groups.iter().any(|g| g == group),
            "{group:?} in {groups:?}"
        );
    }
    assert!(install.get("permissions").is_none());

    // The webhooks: the chart's three admission webhooks and the CRD's conversion.
    let hooks = spec["webhookdefinitions"]
        .as_sequence()
        .ok_or("webhookdefinitions")?;
    let summary: Vec<String> = hooks
        .iter()
        .map(|h| {
            format!(
                "{} {} {}->{}",
                h["type"].as_str().unwrap_or_default(),
                h["webhookPath"].as_str().unwrap_or_default(),
                h["containerPort"].as_u64().unwrap_or_default(),
                h["targetPort"].as_u64().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            "ValidatingAdmissionWebhook /validate/postgresclusters 443->9443",
            "ValidatingAdmissionWebhook /validate/postgresbackups 443->9443",
            "MutatingAdmissionWebhook /mutate/postgresclusters 443->9443",
            "ConversionWebhook /convert 443->9443",
        ]
    );
    for hook in hooks {
        assert_eq!(hook["deploymentName"].as_str(), Some("pgop-operator"));
    }
    assert_eq!(
        hooks[3]["conversionCRDs"],
        yaml("[postgresclusters.database.example.com]")
    );
    assert_eq!(
        hooks[3]["webhookPath"].as_str(),
        Some(pgop_api::CONVERT_PATH)
    );
    Ok(())
}

#[test]
fn the_validator_finds_nothing_in_the_bundle() -> Result {
    let (code, out) = validate(&bundle())?;
    assert_eq!(code, Some(0), "bundle-validate bundle/:\n{out}");
    assert!(out.contains(": 0 error(s), 0 warning(s)"), "{out}");
    Ok(())
}

/// Breaks a copy of the bundle in some way.
type BreakBundle = fn(&Path) -> Result;

#[test]
fn the_validator_fails_on_broken_bundles() -> Result {
    let cases: [(&str, BreakBundle, &str); 5] = [
        (
            "missing-crd",
            |dir| {
                std::fs::remove_file(
                    dir.join("manifests/database.example.com_postgresbackups.yaml"),
                )?;
                Ok(())
            },
            "owned CRD \"database.example.com/v1alpha1, Kind=PostgresBackup\" not found",
        ),
        (
            "namespaced-with-conversion",
            |dir| {
                edit(
                    dir,
                    CSV,
                    "- type: SingleNamespace\n    supported: false",
                    "- type: SingleNamespace\n    supported: true",
                )
            },
            "only AllNamespaces InstallModeType is supported when conversionCRDs is present",
        ),
        (
            "bad-category",
            |dir| edit(dir, CSV, "categories: Database", "categories: Databases"),
            "is not in the set of standard categories",
        ),
        (
            "bad-min-kube-version",
            |dir| {
                edit(
                    dir,
                    CSV,
                    "minKubeVersion: ",
                    "minKubeVersion: one.thirty-four # ",
                )
            },
            "csv.Spec.MinKubeVersion has an invalid value",
        ),
        (
            "no-channel",
            |dir| {
                edit(
                    dir,
                    "metadata/annotations.yaml",
                    "  operators.operatorframework.io.bundle.channels.v1: candidate\n",
                    "",
                )
            },
            "operators.operatorframework.io.bundle.channels.v1",
        ),
    ];
    for (label, break_it, expected) in cases {
        let dir = copy_of_bundle(label)?;
        break_it(&dir.0)?;
        let (code, out) = validate(&dir.0)?;
        assert_eq!(
            code,
            Some(1),
            "{label}: bundle-validate should fail:\n{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with("error\t") && l.contains(expected)),
            "{label}: no error line with {expected:?} in:\n{out}"
        );
    }
    // A warning fails too (an owned kind without an example).
    let dir = copy_of_bundle("warning")?;
    let csv_path = dir.0.join(CSV);
    let mut csv: Value = yaml_file(&csv_path)?;
    let examples: Vec<serde_json::Value> = serde_json::from_str(
        csv["metadata"]["annotations"]["alm-examples"]
            .as_str()
            .ok_or("alm-examples")?,
    )?;
    csv["metadata"]["annotations"]["alm-examples"] =
        Value::String(serde_json::to_string(&examples[..1])?);
    std::fs::write(&csv_path, serde_yaml::to_string(&csv)?)?;
    let (code, out) = validate(&dir.0)?;
    assert_eq!(code, Some(1), "a warning should fail:\n{out}");
    assert!(
        out.lines().any(|l| l.starts_with("warning\t")
            && l.contains("provided API should have an example annotation")),
        "{out}"
    );
    Ok(())
}

/// OLM's ClusterServiceVersion CRD, as the validation library has it.
fn csv_crd() -> Result<Value> {
    let validator = validator()?;
    let out = Command::new(&validator).arg("--print-csv-crd").output()?;
    assert!(out.status.success(), "{}", text(&out));
    Ok(serde_yaml::from_slice(&out.stdout)?)
}

#[tokio::test]
async fn the_api_server_accepts_the_csv_its_deployment_and_rules() -> Result {
    let (_plane, admin, ns) = setup("olm-bundle").await?;
    let n = ns.name();
    let params = PatchParams::apply("pgop-olm-bundle-test")
        .force()
        .validation_strict();

    // The CSV, against OLM's own schema.
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_yaml::from_value(csv_crd()?)?;
    pgop_testenv::crds::install(&admin, vec![crd]).await?;
    let csv = csv()?;
    let mut obj: DynamicObject = serde_yaml::from_value(csv.clone())?;
    obj.metadata.namespace = Some(n.to_string());
    let gvk = GroupVersionKind::gvk("operators.coreos.com", "v1alpha1", "ClusterServiceVersion");
    let (resource, _) = discovery::pinned_kind(&admin, &gvk).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), n, &resource);
    let name = obj.metadata.name.clone().unwrap_or_default();
    api.patch(&name, &params, &Patch::Apply(&obj))
        .await
        .map_err(|e| format!("the API server refused the CSV: {e}"))?;

    // Its Deployment and rules as the objects OLM makes of them.
    let deployment = &csv["spec"]["install"]["spec"]["deployments"][0];
    let objects = [
        yaml(&format!(
            "{{apiVersion: v1, kind: ServiceAccount, metadata: {{name: pgop-operator, namespace: {n}}}}}"
        )),
        {
            let mut d = yaml(&format!(
                "{{apiVersion: apps/v1, kind: Deployment, metadata: {{name: pgop-operator, namespace: {n}}}}}"
            ));
            d["metadata"]["labels"] = deployment["label"].clone();
            d["spec"] = deployment["spec"].clone();
            d
        },
        {
            let mut r = yaml(&format!(
                "{{apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole, metadata: {{name: {n}-olm}}}}"
            ));
            r["rules"] = csv["spec"]["install"]["spec"]["clusterPermissions"][0]["rules"].clone();
            r
        },
        {
            let mut s =
                yaml_file(&bundle().join("manifests/pgop-operator-metrics_v1_service.yaml"))?;
            s["metadata"]["namespace"] = Value::String(n.to_string());
            s
        },
    ];
    for doc in objects {
        let obj: DynamicObject = serde_yaml::from_value(doc)?;
        let types = obj.types.as_ref().ok_or("apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(types)?;
        let (resource, caps) = discovery::pinned_kind(&admin, &gvk).await?;
        let api: Api<DynamicObject> = match caps.scope {
            discovery::Scope::Cluster => Api::all_with(admin.clone(), &resource),
            discovery::Scope::Namespaced => Api::namespaced_with(admin.clone(), n, &resource),
        };
        let name = obj.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&obj))
            .await
            .map_err(|e| format!("the API server refused {} {name}: {e}", gvk.kind))?;
        if matches!(caps.scope, discovery::Scope::Cluster) {
            api.delete(&name, &Default::default()).await?;
        }
    }
    ns.delete().await?;
    Ok(())
}

/// What OLM does with the bundle's webhooks, without OLM: a certificate written as OLM
/// mounts its Secret (`tls.crt` and `tls.key` in one directory), pgop's webhook server
/// serving from that directory (`--webhook-cert-dir`, the certificate source the CSV's
/// Deployment names), and the bundle's CRDs with their conversion pointed at it and the
/// authority in the `caBundle` (OLM points it at its Service). The `alm-examples` are then
/// created as a console would (strict field validation), and the PostgresCluster example,
/// stored in `v1beta1`, reads as `v1alpha1` through pgop's conversion over that certificate.
/// Its own control plane: the CRDs it installs convert through this test's webhook.
#[tokio::test]
async fn pgop_converts_with_a_certificate_mounted_as_olm_does_and_the_examples_apply() -> Result {
    use k8s_openapi::ByteString;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::WebhookClientConfig;
    use pgop_operator::webhook::{Config, Webhook, cert};
    use pgop_testenv::{ControlPlane, Options, TestNamespace, wait};

    let csv = csv()?;
    let args = strings(
        &csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"]["containers"]
            [0]["args"],
    );
    assert!(
        args.contains(&format!("--webhook-cert-dir={OLM_CERT_DIR}")),
        "{args:?}"
    );

    let plane = ControlPlane::start(Options::default()).await?;
    let client = plane.client()?;
    let now = jiff::Timestamp::now();
    let authority = pgop_tls::Authority::generate_webhook(now)?;
    let issued = authority.issue_webhook_server(&["127.0.0.1".to_string()], now, 30)?;
    let mounted = TempDir::new("olm-serving-certs")?;
    std::fs::write(mounted.0.join("tls.crt"), &issued.cert_pem)?;
    std::fs::write(mounted.0.join("tls.key"), &issued.key_pem)?;
    let webhook = Webhook::bind(
        client.clone(),
        Config {
            listen: "127.0.0.1:0".parse()?,
            certificate: cert::Source::Files {
                dir: mounted.0.clone(),
                check_every: std::time::Duration::from_secs(60),
            },
        },
    )
    .await?;
    let port = webhook.local_addr().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(webhook.run(async move {
        let _ = stopped.await;
    }));

    let mut crds = Vec::new();
    for file in [
        "manifests/database.example.com_postgresclusters.yaml",
        "manifests/database.example.com_postgresbackups.yaml",
    ] {
        crds.extend(pgop_testenv::crds::from_yaml(&std::fs::read_to_string(
            bundle().join(file),
        )?)?);
    }
    let mut converting = 0;
    for crd in &mut crds {
        let webhook = crd
            .spec
            .conversion
            .as_mut()
            .filter(|c| c.strategy == "Webhook")
            .and_then(|c| c.webhook.as_mut());
        if let Some(webhook) = webhook {
            webhook.client_config = Some(WebhookClientConfig {
                url: Some(format!(
                    "https://127.0.0.1:{port}{}",
                    pgop_api::CONVERT_PATH
                )),
                ca_bundle: Some(ByteString(authority.cert_pem().as_bytes().to_vec())),
                service: None,
            });
            converting += 1;
        }
    }
    assert_eq!(converting, 1, "one CRD converts by webhook");
    pgop_testenv::crds::install(&client, crds).await?;

    let ns = TestNamespace::create(plane.config(), "olm-examples").await?;
    let n = ns.name();
    let params = PatchParams::apply("pgop-olm-bundle-test")
        .force()
        .validation_strict();
    let examples: Vec<serde_json::Value> = serde_json::from_str(
        csv["metadata"]["annotations"]["alm-examples"]
            .as_str()
            .ok_or("alm-examples")?,
    )?;
    for example in examples {
        let mut obj: DynamicObject = serde_json::from_value(example)?;
        obj.metadata.namespace = Some(n.to_string());
        let types = obj.types.as_ref().ok_or("apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(types)?;
        let (resource, _) = discovery::pinned_kind(&client, &gvk).await?;
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), n, &resource);
        let name = obj.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&obj))
            .await
            .map_err(|e| {
                format!(
                    "the API server refused the example {} {name}: {e}",
                    gvk.kind
                )
            })?;
    }

    let alpha: Api<pgop_api::PostgresCluster> = Api::namespaced(client.clone(), n);
    let read = wait::until(
        "the example cluster to read as v1alpha1 through pgop's conversion",
        TIMEOUT,
        || {
            let alpha = alpha.clone();
            async move { alpha.get("example").await.map_err(|e| e.to_string()) }
        },
    )
    .await?;
    assert_eq!(read.spec.replicas, 3);

    let _ = stop.send(());
    server.await??;
    ns.delete().await?;
    Ok(())
}
