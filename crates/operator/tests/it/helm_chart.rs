//! The Helm chart `charts/pgop`: its CRDs are `pgop crd`'s, `deploy/operator/` is its
//! rendering with the default values, `deploy/monitoring/` its rendering with the PodMonitors
//! and the alert rules on, `helm lint --strict` is clean, and its renderings
//! under several value sets say what they should and are accepted, server-side and with
//! strict field validation, by a real kube-apiserver. The operator runs under the
//! namespace-scoped RBAC it renders, for one and for two watched namespaces (the
//! cluster-wide one is `rbac.rs`'s); with the webhooks on, pgop's webhook certificate
//! keeper runs under the RBAC it renders, cluster-wide and namespace-scoped.
//!
//! Helm is built by `hack/install-testenv.sh` into the testenv bin directory.
//!
//! Why this file stays whole: it is one subject, the chart `charts/pgop`: each test checks
//! its files, or renders it and checks, applies or runs pgop under what comes out, with one
//! set of helpers (`helm`, `template`, `apply`) shared by them.

use crate::common;

use common::*;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{self, Scope};
use kube::{Client, ResourceExt};
use pgop_api::PostgresCluster;
use pgop_api::cluster::ClusterPhase;
use pgop_operator::webhook::{self, cert};
use pgop_testenv::TestNamespace;
use serde_yaml::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn chart() -> PathBuf {
    root().join("charts/pgop")
}

/// The helm that `hack/install-testenv.sh` builds, or an error naming that script.
fn helm() -> Result<PathBuf> {
    Ok(pgop_testenv::binaries::locate(
        pgop_testenv::binaries::Binary::Helm,
    )?)
}

/// Runs helm; its stdout, or an error with its stderr.
fn run_helm(args: &[&str]) -> Result<String, String> {
    let helm = helm().map_err(|e| e.to_string())?;
    let out = Command::new(&helm)
        .args(args)
        .output()
        .map_err(|e| format!("failed to run {}: {e}", helm.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "helm {} failed ({}):\n{stdout}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `values` written to a file of its own (removed on drop), for `helm -f`.
struct ValuesFile(PathBuf);

impl ValuesFile {
    fn new(label: &str, values: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(format!(
            "pgop-helm-chart-{}-{label}-values.yaml",
            std::process::id()
        ));
        std::fs::write(&path, values)?;
        Ok(Self(path))
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

impl Drop for ValuesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `helm template RELEASE charts/pgop --namespace NS -f VALUES`, as one YAML value per
/// document. Values that do not mention `webhook` render with the webhooks off (after
/// [`WEBHOOKS_OFF`]): the tests of other values apply what they render to the control plane
/// other tests share, where a cluster-wide webhook configuration would review everybody's
/// objects. The webhooks' own test renders them, and checks that they are on by default.
fn template(release: &str, namespace: &str, values: &str) -> Result<Vec<Value>, String> {
    let base =
        ValuesFile::new(&format!("{release}-base"), WEBHOOKS_OFF).map_err(|e| e.to_string())?;
    let file = ValuesFile::new(release, values).map_err(|e| e.to_string())?;
    let chart = chart();
    let mut argv = vec![
        "template",
        release,
        chart.to_str().unwrap_or_default(),
        "--namespace",
        namespace,
    ];
    if !values.contains("webhook") {
        argv.extend(["-f", base.path()]);
    }
    argv.extend(["-f", file.path()]);
    let out = run_helm(&argv)?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&out) {
        let value: Value = serde::Deserialize::deserialize(doc)
            .map_err(|e| format!("helm template printed invalid YAML: {e}\n{out}"))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// "Kind namespace/name" (or "Kind name" when cluster-scoped) of every document, sorted.
fn objects(docs: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = docs
        .iter()
        .map(|d| {
            let name = d["metadata"]["name"].as_str().unwrap_or_default();
            match d["metadata"]["namespace"].as_str() {
                Some(ns) => format!("{} {ns}/{name}", kind_of(d)),
                None => format!("{} {name}", kind_of(d)),
            }
        })
        .collect();
    out.sort();
    out
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| kind_of(d) == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} in {:?}", objects(docs));
    found[0]
}

fn pod_spec(docs: &[Value]) -> &Value {
    &one(docs, "Deployment")["spec"]["template"]["spec"]
}

fn container(docs: &[Value]) -> &Value {
    let containers = pod_spec(docs)["containers"]
        .as_sequence()
        .expect("containers");
    assert_eq!(containers.len(), 1);
    &containers[0]
}

fn args(docs: &[Value]) -> Vec<String> {
    container(docs)["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("a string argument").to_string())
        .collect()
}

fn env(docs: &[Value], name: &str) -> Value {
    container(docs)["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .cloned()
        .unwrap_or_else(|| panic!("no env {name}"))
}

fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).expect("valid YAML in the test")
}

/// Server-side applies every document (strict field validation: an unknown field is an
/// error), then reads each back.
async fn apply(client: &Client, docs: &[Value]) -> Result {
    let params = PatchParams::apply("pgop-helm-chart-test")
        .force()
        .validation_strict();
    for doc in docs {
        let obj: DynamicObject = serde_yaml::from_value(doc.clone())?;
        let what = objects(std::slice::from_ref(doc)).join("");
        let api = dynamic_api(client, &obj).await?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&obj))
            .await
            .map_err(|e| format!("failed to apply {what}: {e}"))?;
        api.get(&name)
            .await
            .map_err(|e| format!("{what} is not there after applying it: {e}"))?;
    }
    Ok(())
}

async fn dynamic_api(client: &Client, obj: &DynamicObject) -> Result<Api<DynamicObject>> {
    let types = obj
        .types
        .as_ref()
        .ok_or("a document without apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(types)?;
    let (resource, caps) = discovery::pinned_kind(client, &gvk).await.map_err(|e| {
        format!(
            "unknown kind {}/{} {}: {e}",
            gvk.group, gvk.version, gvk.kind
        )
    })?;
    Ok(match (caps.scope, obj.metadata.namespace.as_deref()) {
        (Scope::Cluster, None) => Api::all_with(client.clone(), &resource),
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (scope, ns) => {
            return Err(format!("{} is {scope:?} but its namespace is {ns:?}", gvk.kind).into());
        }
    })
}

#[test]
fn the_chart_crds_are_pgop_crd() -> Result {
    let path = chart().join("crds/crds.yaml");
    let committed = std::fs::read_to_string(&path)
        .map_err(|e| format!("failed to read {}: {e}", path.display()))?;
    assert!(
        committed == pgop_api::crds_yaml()?,
        "charts/pgop/crds/crds.yaml differs from `pgop crd`; regenerate it with hack/render-deploy.sh"
    );
    // Nothing else in crds/: Helm installs every file there.
    let files: Vec<String> = std::fs::read_dir(chart().join("crds"))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    assert_eq!(files, ["crds.yaml"]);
    Ok(())
}

#[test]
fn the_chart_app_version_is_the_pgop_version() -> Result {
    let chart: Value = serde_yaml::from_str(&std::fs::read_to_string(chart().join("Chart.yaml"))?)?;
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(VERSION),
        "Chart.yaml appVersion"
    );
    assert_eq!(
        chart["version"].as_str(),
        Some("0.1.0"),
        "Chart.yaml version"
    );
    Ok(())
}

#[test]
fn deploy_operator_is_the_chart_rendered_with_its_defaults() -> Result {
    let out = std::env::temp_dir().join(format!("pgop-render-deploy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(root().join("hack/render-deploy.sh"))
        .arg("--manifests")
        .arg(&out)
        .env("HELM", helm()?)
        .status()?;
    assert!(status.success(), "hack/render-deploy.sh --manifests failed");
    let list = |dir: &Path| -> Result<Vec<String>> {
        let mut names: Vec<String> = std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        names.sort();
        Ok(names)
    };
    let committed_dir = root().join("deploy/operator");
    let names = list(&out)?;
    assert_eq!(
        names,
        [
            "deployment.yaml",
            "rbac.yaml",
            "service.yaml",
            "webhook.yaml"
        ]
    );
    // The Service the CRD's conversion webhook names is the one deploy/ makes.
    let webhook = std::fs::read_to_string(out.join("webhook.yaml"))?;
    let service = format!(
        "kind: Service\nmetadata:\n  name: {}\n  namespace: {}\n",
        pgop_api::CONVERSION_SERVICE,
        pgop_api::CONVERSION_NAMESPACE
    );
    assert!(webhook.contains(&service), "{service} not in\n{webhook}");
    assert_eq!(list(&committed_dir)?, names, "files in deploy/operator/");
    for name in &names {
        let rendered = std::fs::read_to_string(out.join(name))?;
        let committed = std::fs::read_to_string(committed_dir.join(name))?;
        assert!(
            rendered == committed,
            "deploy/operator/{name} differs from the chart's rendering; regenerate it with hack/render-deploy.sh"
        );
    }
    std::fs::remove_dir_all(&out)?;
    Ok(())
}

#[test]
fn deploy_monitoring_is_the_chart_rendered_with_monitoring_on() -> Result {
    let out = std::env::temp_dir().join(format!("pgop-render-monitoring-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(root().join("hack/render-deploy.sh"))
        .arg("--monitoring")
        .arg(&out)
        .env("HELM", helm()?)
        .status()?;
    assert!(
        status.success(),
        "hack/render-deploy.sh --monitoring failed"
    );
    let mut names: Vec<String> = std::fs::read_dir(&out)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    assert_eq!(
        names,
        ["dashboard.json", "podmonitor.yaml", "prometheusrule.yaml"]
    );
    for name in &names {
        let rendered = std::fs::read_to_string(out.join(name))?;
        let committed = std::fs::read_to_string(root().join("deploy/monitoring").join(name))?;
        assert!(
            rendered == committed,
            "deploy/monitoring/{name} differs from the chart's rendering; regenerate it with hack/render-deploy.sh"
        );
    }
    std::fs::remove_dir_all(&out)?;
    Ok(())
}

/// Every value in values.yaml has a row in the chart README's table (a value or one of
/// its parents, e.g. `resources`), and every row names a value.
#[test]
fn every_value_is_in_the_chart_readme() -> Result {
    /// Every path, and whether it is a leaf (not a non-empty mapping).
    fn paths(prefix: &str, value: &Value, out: &mut Vec<(String, bool)>) {
        for (k, v) in value.as_mapping().into_iter().flatten() {
            let key = k.as_str().unwrap_or_default();
            let path = if prefix.is_empty() {
                key.to_string()
            } else {
                format!("{prefix}.{key}")
            };
            let leaf = v.as_mapping().is_none_or(|m| m.is_empty());
            out.push((path.clone(), leaf));
            paths(&path, v, out);
        }
    }
    let values: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart().join("values.yaml"))?)?;
    let mut all = Vec::new();
    paths("", &values, &mut all);
    let readme = std::fs::read_to_string(chart().join("README.md"))?;
    let rows: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(key, _)| key))
        .collect();
    for (path, _) in all.iter().filter(|(_, leaf)| *leaf) {
        let documented = rows
            .iter()
            .any(|row| path == row || path.starts_with(&format!("{row}.")));
        assert!(
            documented,
            "{path} is not in the charts/pgop/README.md table"
        );
    }
    for row in &rows {
        assert!(
            all.iter().any(|(p, _)| p == row),
            "README row `{row}` is not a value"
        );
    }
    Ok(())
}

/// The value sets below, by name.
const DEFAULTS: &str = "{}\n";
const TWO_REPLICAS_AND_PODMONITOR: &str = "
replicas: 2
metrics:
  port: 9090
  service: {port: 9000}
  podMonitor:
    enabled: true
    interval: 15s
    scrapeTimeout: 10s
    labels: {release: prometheus}
";
const CUSTOM_POD: &str = "
image: {repository: registry.example/pgop, tag: 1.2.3, pullPolicy: Always}
imagePullSecrets: [{name: regcred}]
instances: {image: registry.example/pgop-postgres:15, runAsUser: 1001, runAsGroup: 1002}
logLevel: info,pgop_operator=debug
logFormat: json
tracing: {otlpEndpoint: 'http://otel-collector.observability:4318', instanceOtlpEndpoint: 'https://otel.example:4318'}
clusterSelector: 'pgop.example.com/channel in (canary, next),!legacy'
concurrency: 8
leaderElection: {enabled: false}
serviceAccount: {annotations: {example.com/role: pgop}}
metrics: {scrapeAnnotations: false, service: {enabled: false}}
podAnnotations: {example.com/team: databases}
podLabels: {example.com/tier: control}
resources:
  requests: {cpu: 100m, memory: 64Mi}
  limits: {cpu: '1', memory: 256Mi}
nodeSelector: {kubernetes.io/os: linux, example.com/pool: system}
tolerations:
- {key: dedicated, operator: Equal, value: system, effect: NoSchedule}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
";

/// Both PodMonitors, the alert rules and the dashboard, with every value of theirs set;
/// `{dashboards}`: the dashboard's namespace.
const MONITORING: &str = "
metrics:
  podMonitor: {enabled: true}
  instancePodMonitor: {enabled: true, interval: 15s, scrapeTimeout: 10s, labels: {release: prometheus}}
  poolerPodMonitor: {enabled: true, labels: {release: prometheus}}
monitoring:
  prometheusRule:
    enabled: true
    labels: {release: prometheus}
    runbookURL: https://git.example.com/pgop/blob/main/docs/runbooks.md
  dashboard:
    enabled: true
    namespace: {dashboards}
    labels: {grafana_dashboard: '1', team: databases}
    annotations: {grafana_folder: Databases}
";

/// The webhooks on, cluster-wide.
const WEBHOOKS: &str = "webhook: {enabled: true}\n";

/// The webhooks off (see [`template`]).
const WEBHOOKS_OFF: &str = "webhook: {enabled: false}\n";

/// The chart's defaults for the webhooks (on; see [`template`]).
const WEBHOOK_DEFAULTS: &str = "webhook: {}\n";

fn namespaced(watch: &str) -> String {
    format!("watchNamespace: {watch}\n")
}

#[test]
fn helm_lint_is_clean_with_every_value_set() -> Result {
    let chart = chart();
    let chart = chart.to_str().unwrap_or_default();
    let sets = [
        ("defaults", DEFAULTS.to_string()),
        ("podmonitor", TWO_REPLICAS_AND_PODMONITOR.to_string()),
        (
            "monitoring",
            MONITORING.replace("{dashboards}", "grafana"),
        ),
        ("namespaced", namespaced("databases")),
        (
            "two-namespaces",
            "watchNamespaces: [team-a, team-b]\n".to_string(),
        ),
        ("custom", CUSTOM_POD.to_string()),
        ("webhooks", WEBHOOKS.to_string()),
        (
            "webhooks-namespaced",
            "watchNamespaces: [team-a]\nwebhook: {enabled: true, failurePolicy: Fail, timeoutSeconds: 10}\n"
                .to_string(),
        ),
        (
            "webhooks-cert-dir",
            "watchNamespaces: [team-a]\nwebhook: {enabled: true, certDir: /certs}\n".to_string(),
        ),
    ];
    for (label, values) in sets {
        let file = ValuesFile::new(&format!("lint-{label}"), &values)?;
        let out = run_helm(&["lint", "--strict", chart, "-f", file.path()])?;
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed") && !out.contains("[WARNING]"),
            "helm lint --strict with the {label} values:\n{out}"
        );
    }
    Ok(())
}

#[test]
fn values_the_operator_cannot_honour_are_refused() -> Result {
    helm()?;
    let refused = [
        // Watched namespaces: a list of namespace names, each once, or the older one
        // namespace; not both.
        (
            "watchNamespaces: [a, b]\nwatchNamespace: c\n",
            "set watchNamespaces (a list of namespaces) or watchNamespace (one namespace, the older value), not both",
        ),
        ("watchNamespaces: [a, a]\n", "watchNamespaces"),
        ("watchNamespaces: [a, B]\n", "watchNamespaces"),
        ("watchNamespaces: ['a,b']\n", "watchNamespaces"),
        ("watchNamespaces: a\n", "watchNamespaces"),
        ("watchNamespace: [a, b]\n", "watchNamespace"),
        ("watchNamespace: a_b\n", "watchNamespace"),
        // Two replicas without a Lease would both reconcile.
        (
            "replicas: 2\nleaderElection: {enabled: false}\n",
            "replicas > 1 needs leaderElection.enabled",
        ),
        ("replicas: 0\n", "replicas"),
        ("instances: {runAsUser: 0}\n", "runAsUser"),
        ("metrics: {port: 70000}\n", "port"),
        ("image: {pullPolicy: Sometimes}\n", "pullPolicy"),
        // A selector is a label selector and nothing else: no quotes, `$( )` or newlines
        // reach the operator's command line (the operator checks the grammar itself).
        ("clusterSelector: 'a=$(reboot)'\n", "clusterSelector"),
        ("clusterSelector: \"a=x\\nb=y\"\n", "clusterSelector"),
        ("clusterSelector: \"a='x'\"\n", "clusterSelector"),
        // The webhooks: what the API server accepts, on a port of their own; the chart
        // sets no caBundle (the operator keeps it).
        // webhook.certDir: an absolute path, written unquoted into the arguments.
        ("webhook: {certDir: certs}\n", "certDir"),
        ("webhook: {certDir: '/a b'}\n", "certDir"),
        ("webhook: {certDir: '/a: b'}\n", "certDir"),
        // The runbook URL lands unquoted in every rule's annotations.
        (
            "monitoring: {prometheusRule: {runbookURL: 'docs/runbooks.md #x'}}\n",
            "runbookURL",
        ),
        (
            "monitoring: {prometheusRule: {runbookURL: '{x}'}}\n",
            "runbookURL",
        ),
        (
            "monitoring: {dashboard: {namespace: Grafana}}\n",
            "namespace",
        ),
        (
            "metrics: {instancePodMonitor: {honorLabels: false}}\n",
            "honorLabels",
        ),
        // The OTLP endpoints: an http(s) URL with no blank, quote or `$`.
        ("tracing: {otlpEndpoint: 'otel:4318'}\n", "otlpEndpoint"),
        ("tracing: {otlpEndpoint: 'http://a b'}\n", "otlpEndpoint"),
        (
            "tracing: {instanceOtlpEndpoint: 'http://a$(reboot)'}\n",
            "instanceOtlpEndpoint",
        ),
        ("tracing: {endpoint: 'http://a'}\n", "endpoint"),
        ("webhook: {failurePolicy: Sometimes}\n", "failurePolicy"),
        ("webhook: {timeoutSeconds: 31}\n", "timeoutSeconds"),
        ("webhook: {port: 0}\n", "port"),
        ("webhook: {caBundle: Cg==}\n", "caBundle"),
        (
            "webhook: {enabled: true, port: 8080}\n",
            "webhook.port and metrics.port must differ",
        ),
    ];
    for (values, expected) in refused {
        match template("refused", "pgop-system", values) {
            Ok(docs) => panic!("rendered with {values:?}: {:?}", objects(&docs)),
            Err(e) => assert!(e.contains(expected), "{values:?}: {e}"),
        }
    }
    Ok(())
}

#[tokio::test]
async fn defaults_render_the_published_install_and_apply() -> Result {
    let (_plane, admin, ns) = setup("helm-defaults").await?;
    let n = ns.name();
    let docs = template(n, n, DEFAULTS)?;
    let full = format!("{n}-operator");
    assert_eq!(
        objects(&docs),
        [
            format!("ClusterRole {full}"),
            format!("ClusterRoleBinding {full}"),
            format!("Deployment {n}/{full}"),
            format!("Service {n}/{full}-metrics"),
            format!("ServiceAccount {n}/{full}"),
        ]
    );
    let binding = one(&docs, "ClusterRoleBinding");
    assert_eq!(
        binding["subjects"],
        yaml(&format!(
            "[{{kind: ServiceAccount, name: {full}, namespace: {n}}}]"
        ))
    );

    let deployment = one(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], yaml("1"));
    let image = format!("pgop:{VERSION}");
    let c = container(&docs);
    assert_eq!(c["image"].as_str(), Some(image.as_str()));
    assert_eq!(c["imagePullPolicy"].as_str(), Some("IfNotPresent"));
    assert_eq!(c["command"], yaml("[pgop, operator]"));
    assert_eq!(
        args(&docs),
        [
            "--metrics-bind-address=0.0.0.0:8080".to_string(),
            format!("--image={image}"),
            "--concurrency=4".to_string(),
            "--leader-elect=true".to_string(),
            format!("--leader-election-name={full}"),
        ]
    );
    assert_eq!(
        c["ports"],
        yaml("[{name: metrics, containerPort: 8080, protocol: TCP}]")
    );
    assert_eq!(env(&docs, "RUST_LOG")["value"].as_str(), Some("info"));
    assert_eq!(
        env(&docs, "POD_NAMESPACE")["valueFrom"],
        yaml("{fieldRef: {fieldPath: metadata.namespace}}")
    );
    assert_eq!(
        env(&docs, "POD_NAME")["valueFrom"],
        yaml("{fieldRef: {fieldPath: metadata.name}}")
    );
    assert_eq!(
        c["resources"],
        yaml("{requests: {cpu: 50m, memory: 32Mi}, limits: {memory: 128Mi}}")
    );
    assert_eq!(
        c["securityContext"],
        yaml(
            "{allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}"
        )
    );
    let pod = pod_spec(&docs);
    assert_eq!(
        pod["securityContext"],
        yaml(
            "{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {type: RuntimeDefault}}"
        )
    );
    assert_eq!(pod["serviceAccountName"].as_str(), Some(full.as_str()));
    for absent in [
        "nodeSelector",
        "tolerations",
        "affinity",
        "imagePullSecrets",
    ] {
        assert!(pod.get(absent).is_none(), "{absent} in {pod:?}");
    }
    let template = &deployment["spec"]["template"]["metadata"];
    assert_eq!(
        template["annotations"],
        yaml(
            "{prometheus.io/scrape: 'true', prometheus.io/port: '8080', prometheus.io/path: /metrics}"
        )
    );
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    assert_eq!(
        *selector,
        yaml(&format!(
            "{{app.kubernetes.io/name: pgop-operator, app.kubernetes.io/instance: {n}}}"
        ))
    );
    assert_eq!(template["labels"], *selector);
    let service = one(&docs, "Service");
    assert_eq!(service["spec"]["selector"], *selector);
    assert_eq!(
        service["spec"]["ports"],
        yaml("[{name: metrics, port: 8080, targetPort: metrics, protocol: TCP}]")
    );

    apply(&admin, &docs).await?;
    ns.delete().await?;
    Ok(())
}

/// A minimal PodMonitor CRD: the Prometheus Operator's is not installed in testenv. Its
/// schema declares only the fields the chart writes, with their types, so that a strict
/// apply still catches a misspelt or mistyped field there.
fn podmonitor_crd() -> Result<
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
> {
    let duration = "{type: string, pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'}";
    Ok(serde_yaml::from_str(&format!(
        "
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: podmonitors.monitoring.coreos.com}}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {{kind: PodMonitor, plural: podmonitors, singular: podmonitor, listKind: PodMonitorList}}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        required: [spec]
        properties:
          spec:
            type: object
            required: [selector]
            properties:
              selector:
                type: object
                properties:
                  matchLabels: {{type: object, additionalProperties: {{type: string}}}}
              namespaceSelector:
                type: object
                properties:
                  any: {{type: boolean}}
                  matchNames: {{type: array, items: {{type: string}}}}
              podMetricsEndpoints:
                type: array
                items:
                  type: object
                  properties:
                    port: {{type: string}}
                    path: {{type: string}}
                    interval: {duration}
                    scrapeTimeout: {duration}
                    honorLabels: {{type: boolean}}
"
    ))?)
}

/// A minimal PrometheusRule CRD (the Prometheus Operator's is not installed in testenv),
/// declaring the fields of a rule group and a rule that pgop's rules may use, so that a
/// strict apply refuses a misspelt one.
fn prometheusrule_crd() -> Result<
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
> {
    let strings = "{type: object, additionalProperties: {type: string}}";
    let duration = "{type: string, pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'}";
    Ok(serde_yaml::from_str(&format!(
        "
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: prometheusrules.monitoring.coreos.com}}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {{kind: PrometheusRule, plural: prometheusrules, singular: prometheusrule, listKind: PrometheusRuleList}}
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
            properties:
              groups:
                type: array
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {{type: string, minLength: 1}}
                    interval: {duration}
                    rules:
                      type: array
                      items:
                        type: object
                        required: [expr]
                        properties:
                          alert: {{type: string}}
                          record: {{type: string}}
                          expr: {{type: string}}
                          for: {duration}
                          keep_firing_for: {duration}
                          labels: {strings}
                          annotations: {strings}
"
    ))?)
}

/// pgop's alert rules (the chart's `monitoring/rules.yaml`) with every `runbook_url` of the
/// form `docs/runbooks.md#x` moved under `base`.
fn rules_with_runbooks_at(base: &str) -> Result<Value> {
    let mut rules: Value = serde_yaml::from_str(&std::fs::read_to_string(
        chart().join("monitoring/rules.yaml"),
    )?)?;
    let groups = rules["groups"].as_sequence_mut().ok_or("no groups")?;
    for group in groups {
        for rule in group["rules"].as_sequence_mut().ok_or("no rules")? {
            let url = &mut rule["annotations"]["runbook_url"];
            let anchor = url
                .as_str()
                .and_then(|u| u.strip_prefix("docs/runbooks.md#"))
                .ok_or_else(|| format!("runbook_url {url:?}"))?
                .to_string();
            *url = Value::from(format!("{base}#{anchor}"));
        }
    }
    Ok(rules["groups"].clone())
}

#[tokio::test]
async fn two_replicas_and_a_podmonitor_render_and_apply() -> Result {
    let (_plane, admin, ns) = setup("helm-podmonitor").await?;
    let n = ns.name();
    let docs = template(n, n, TWO_REPLICAS_AND_PODMONITOR)?;
    let full = format!("{n}-operator");
    assert!(objects(&docs).contains(&format!("PodMonitor {n}/{full}")));
    let deployment = one(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], yaml("2"));
    let a = args(&docs);
    assert!(a.contains(&"--leader-elect=true".to_string()), "{a:?}");
    assert!(
        a.contains(&"--metrics-bind-address=0.0.0.0:9090".to_string()),
        "{a:?}"
    );
    let c = container(&docs);
    assert_eq!(c["ports"][0]["containerPort"], yaml("9090"));
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"].as_str(),
        Some("9090")
    );
    assert_eq!(
        one(&docs, "Service")["spec"]["ports"],
        yaml("[{name: metrics, port: 9000, targetPort: metrics, protocol: TCP}]")
    );
    let monitor = one(&docs, "PodMonitor");
    assert_eq!(
        monitor["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        monitor["spec"]["podMetricsEndpoints"],
        yaml(
            "[{port: metrics, path: /metrics, interval: 15s, scrapeTimeout: 10s, honorLabels: true}]"
        )
    );
    assert_eq!(
        monitor["metadata"]["labels"]["release"].as_str(),
        Some("prometheus")
    );

    // Everything but the PodMonitor applies as is; the PodMonitor is refused only because
    // the API server does not know its kind, and is accepted once its CRD is installed.
    let (monitors, rest): (Vec<Value>, Vec<Value>) =
        docs.into_iter().partition(|d| kind_of(d) == "PodMonitor");
    apply(&admin, &rest).await?;
    let unknown = apply(&admin, &monitors).await;
    let unknown = unknown
        .expect_err("a PodMonitor without its CRD")
        .to_string();
    assert!(
        unknown.starts_with("unknown kind monitoring.coreos.com/v1 PodMonitor")
            && unknown.contains("404"),
        "{unknown}"
    );
    pgop_testenv::crds::install(&admin, [podmonitor_crd()?]).await?;
    apply(&admin, &monitors).await?;

    // Monitoring on (its CRDs installed here, after the check above): the instances'
    // PodMonitor, the rules and the dashboard, applied.
    let docs = template(n, n, &MONITORING.replace("{dashboards}", n))?;
    let all = template(n, n, DEFAULTS)?;
    let mut expected = objects(&all);
    expected.extend([
        format!("ConfigMap {n}/{full}-dashboard"),
        format!("PodMonitor {n}/{full}"),
        format!("PodMonitor {n}/{full}-instances"),
        format!("PodMonitor {n}/{full}-poolers"),
        format!("PrometheusRule {n}/{full}"),
    ]);
    expected.sort();
    assert_eq!(objects(&docs), expected, "monitoring adds these only");
    let instances = named(&docs, "PodMonitor", &format!("{full}-instances"));
    assert_eq!(
        instances["metadata"]["labels"]["release"].as_str(),
        Some("prometheus")
    );
    let endpoints =
        "[{port: manager, path: /metrics, interval: 15s, scrapeTimeout: 10s, honorLabels: true}]";
    assert_eq!(
        instances["spec"],
        yaml(&format!(
            "{{namespaceSelector: {{any: true}},
               selector: {{matchLabels: {{app.kubernetes.io/managed-by: pgop, app.kubernetes.io/component: database}}}},
               podMetricsEndpoints: {endpoints}}}"
        ))
    );
    // The selector is what the operator puts on every instance Pod, its port the one the
    // Pod names, and the path the one the manager serves.
    let mut pod_labels = pgop_api::labels::cluster_labels("any");
    pod_labels.insert(
        pgop_api::labels::COMPONENT.to_string(),
        pgop_api::labels::COMPONENT_DATABASE.to_string(),
    );
    assert!(selects(
        &instances["spec"]["selector"]["matchLabels"],
        &serde_yaml::to_value(&pod_labels)?
    ));
    assert_eq!(
        instances["spec"]["podMetricsEndpoints"][0]["port"].as_str(),
        Some(pgop_api::constants::MANAGER_PORT_NAME)
    );
    assert_eq!(
        instances["spec"]["podMetricsEndpoints"][0]["path"].as_str(),
        Some(pgop_api::constants::PATH_METRICS)
    );
    // The poolers': what the operator puts on every pooler Pod's template, its port.
    let poolers = named(&docs, "PodMonitor", &format!("{full}-poolers"));
    assert_eq!(
        poolers["spec"],
        yaml(
            "{namespaceSelector: {any: true},
              selector: {matchLabels: {app.kubernetes.io/name: pgbouncer, app.kubernetes.io/component: pooler}},
              podMetricsEndpoints: [{port: manager, path: /metrics, interval: 30s}]}"
        )
    );
    assert_eq!(
        poolers["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
        Some(pgop_api::labels::NAME_POOLER)
    );
    assert_eq!(
        poolers["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"].as_str(),
        Some(pgop_api::labels::COMPONENT_POOLER)
    );
    // With watched namespaces, those only.
    let watched = template(
        n,
        n,
        &format!(
            "watchNamespaces: [team-a, team-b]\n{}",
            MONITORING.replace("{dashboards}", n)
        ),
    )?;
    assert_eq!(
        named(&watched, "PodMonitor", &format!("{full}-instances"))["spec"]["namespaceSelector"],
        yaml("{matchNames: [team-a, team-b]}")
    );
    let rule = one(&docs, "PrometheusRule");
    assert_eq!(
        rule["metadata"]["labels"]["release"].as_str(),
        Some("prometheus")
    );
    assert_eq!(
        rule["spec"]["groups"],
        rules_with_runbooks_at("https://git.example.com/pgop/blob/main/docs/runbooks.md")?,
        "the rules of monitoring/rules.yaml, runbooks under runbookURL"
    );
    let dashboard = one(&docs, "ConfigMap");
    assert_eq!(dashboard["metadata"]["namespace"].as_str(), Some(n));
    assert_eq!(
        dashboard["metadata"]["labels"]["grafana_dashboard"].as_str(),
        Some("1")
    );
    assert_eq!(
        dashboard["metadata"]["labels"]["team"].as_str(),
        Some("databases")
    );
    assert_eq!(
        dashboard["metadata"]["annotations"],
        yaml("{grafana_folder: Databases}")
    );
    let json = std::fs::read_to_string(chart().join("monitoring/dashboard.json"))?;
    assert_eq!(
        dashboard["data"]["pgop.json"].as_str(),
        Some(json.trim_end()),
        "the ConfigMap holds monitoring/dashboard.json"
    );
    // The default dashboard labels are the Grafana sidecar's.
    let sidecar = template(n, n, "monitoring: {dashboard: {enabled: true}}\n")?;
    assert_eq!(
        one(&sidecar, "ConfigMap")["metadata"]["labels"]["grafana_dashboard"].as_str(),
        Some("1")
    );
    assert_eq!(
        one(&sidecar, "ConfigMap")["metadata"]["namespace"].as_str(),
        Some(n)
    );
    pgop_testenv::crds::install(&admin, [prometheusrule_crd()?]).await?;
    let monitoring: Vec<Value> = docs
        .into_iter()
        .filter(|d| ["PodMonitor", "PrometheusRule", "ConfigMap"].contains(&kind_of(d)))
        .collect();
    apply(&admin, &monitoring).await?;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn custom_image_resources_and_scheduling_render_and_apply() -> Result {
    let (_plane, admin, ns) = setup("helm-custom").await?;
    let n = ns.name();
    let docs = template(n, n, CUSTOM_POD)?;
    let full = format!("{n}-operator");
    assert_eq!(
        objects(&docs),
        [
            format!("ClusterRole {full}"),
            format!("ClusterRoleBinding {full}"),
            format!("Deployment {n}/{full}"),
            format!("ServiceAccount {n}/{full}"),
        ],
        "no metrics Service"
    );
    assert_eq!(
        one(&docs, "ServiceAccount")["metadata"]["annotations"],
        yaml("{example.com/role: pgop}")
    );
    let c = container(&docs);
    assert_eq!(c["image"].as_str(), Some("registry.example/pgop:1.2.3"));
    assert_eq!(c["imagePullPolicy"].as_str(), Some("Always"));
    assert_eq!(
        args(&docs),
        [
            "--metrics-bind-address=0.0.0.0:8080",
            "--image=registry.example/pgop-postgres:15",
            "--concurrency=8",
            "--log-format=json",
            "--cluster-selector=pgop.example.com/channel in (canary, next),!legacy",
            "--leader-elect=false",
            "--instance-uid=1001",
            "--instance-gid=1002",
            "--instance-otlp-endpoint=https://otel.example:4318",
        ]
    );
    assert_eq!(
        env(&docs, "RUST_LOG")["value"].as_str(),
        Some("info,pgop_operator=debug")
    );
    assert_eq!(
        env(&docs, "OTEL_EXPORTER_OTLP_ENDPOINT")["value"].as_str(),
        Some("http://otel-collector.observability:4318")
    );
    assert_eq!(
        c["resources"],
        yaml("{requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: '1', memory: 256Mi}}")
    );
    let pod = pod_spec(&docs);
    assert_eq!(pod["imagePullSecrets"], yaml("[{name: regcred}]"));
    assert_eq!(
        pod["nodeSelector"],
        yaml("{kubernetes.io/os: linux, example.com/pool: system}")
    );
    assert_eq!(
        pod["tolerations"],
        yaml("[{key: dedicated, operator: Equal, value: system, effect: NoSchedule}]")
    );
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["values"],
        yaml("[amd64, arm64]")
    );
    let deployment = one(&docs, "Deployment");
    let template = &deployment["spec"]["template"]["metadata"];
    assert_eq!(
        template["annotations"],
        yaml("{example.com/team: databases}"),
        "no prometheus.io annotations"
    );
    assert_eq!(
        template["labels"]["example.com/tier"].as_str(),
        Some("control")
    );
    assert!(
        deployment["spec"]["selector"]["matchLabels"]
            .get("example.com/tier")
            .is_none(),
        "pod labels stay out of the selector"
    );

    apply(&admin, &docs).await?;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn one_watched_namespace_renders_roles_only_and_the_operator_runs_under_them() -> Result {
    let (plane, admin, home) = setup("helm-ns-home").await?;
    let watched = TestNamespace::create(plane.config(), "helm-ns-watched").await?;
    let (h, w) = (home.name(), watched.name());
    let full = format!("{h}-operator");
    let only_namespaced = template(h, h, &format!("{}rbac:\n  nodes: false\n", namespaced(w)))?;
    let docs = template(h, h, &namespaced(w))?;
    let nodes = [
        format!("ClusterRole {full}-nodes"),
        format!("ClusterRoleBinding {full}-nodes"),
    ];
    let all = objects(&docs);
    assert!(
        nodes.iter().all(|n| all.contains(n)),
        "the Node reads: {all:?}"
    );
    assert_eq!(
        all.iter()
            .filter(|o| !nodes.contains(o))
            .cloned()
            .collect::<Vec<_>>(),
        objects(&only_namespaced),
        "rbac.nodes adds the Node reads and nothing else"
    );
    assert_eq!(
        objects(&only_namespaced),
        [
            format!("Deployment {h}/{full}"),
            format!("Role {h}/{full}-leader-election"),
            format!("Role {w}/{full}"),
            format!("RoleBinding {h}/{full}-leader-election"),
            format!("RoleBinding {w}/{full}"),
            format!("Service {h}/{full}-metrics"),
            format!("ServiceAccount {h}/{full}"),
        ],
        "nothing cluster-wide"
    );
    assert!(args(&docs).contains(&format!("--namespace={w}")));
    for binding in docs.iter().filter(|d| kind_of(d) == "RoleBinding") {
        assert_eq!(
            binding["subjects"],
            yaml(&format!(
                "[{{kind: ServiceAccount, name: {full}, namespace: {h}}}]"
            ))
        );
        assert_eq!(binding["roleRef"]["kind"].as_str(), Some("Role"));
    }
    // The watched namespace's Role has the ClusterRole's rules but the cluster-scoped
    // Node reads; the home one only the leader Lease.
    let cluster_wide = template(h, h, "rbac:\n  nodes: false\n")?;
    let role = |ns: &str| {
        docs.iter()
            .find(|d| kind_of(d) == "Role" && d["metadata"]["namespace"].as_str() == Some(ns))
            .expect("a Role")
    };
    assert_eq!(role(w)["rules"], one(&cluster_wide, "ClusterRole")["rules"]);
    assert_eq!(
        role(h)["rules"],
        yaml(&format!(
            "[{{apiGroups: [coordination.k8s.io], resources: [leases], resourceNames: [{full}], verbs: [get, update]}},
              {{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [create]}}]"
        ))
    );
    // Watching its own namespace: one Role, which covers the Lease too.
    let own = template(h, h, &namespaced(h))?;
    assert_eq!(
        objects(&own)
            .into_iter()
            .filter(|o| o.starts_with("Role"))
            .collect::<Vec<_>>(),
        [
            format!("Role {h}/{full}"),
            format!("RoleBinding {h}/{full}")
        ]
    );

    apply(&admin, &docs).await?;

    // The operator, as that ServiceAccount, with the flags the chart passes: it may do
    // nothing outside the watched namespace (and its Lease), and all it needs inside.
    let mut config = plane.config().clone();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{h}:{full}"));
    let operator_client = Client::try_from(config)?;
    assert!(
        Api::<PostgresCluster>::all(operator_client.clone())
            .list(&Default::default())
            .await
            .is_err(),
        "no cluster-wide list"
    );
    assert!(
        Api::<PostgresCluster>::namespaced(operator_client.clone(), h)
            .list(&Default::default())
            .await
            .is_err(),
        "nothing in its own namespace but the Lease"
    );
    let op = Operator::start_with(
        &operator_client,
        pgop_operator::Options {
            namespaces: vec![w.to_string()],
            leader_election: Some(pgop_operator::LeaderElection {
                namespace: h.to_string(),
                name: full.clone(),
                identity: "pgop-operator-0".to_string(),
            }),
            ..pgop_operator::Options::default()
        },
    );
    create(&admin, w, &cluster("scoped", 2)).await?;
    wait_names::<Pod>(&admin, w, "scoped", &["scoped-1", "scoped-2"]).await?;
    wait_names::<Secret>(
        &admin,
        w,
        "scoped",
        &[
            "scoped-app",
            "scoped-ca",
            "scoped-manager-tls",
            "scoped-postgres-ca",
            "scoped-replication",
            "scoped-replication-tls",
            "scoped-server-tls",
        ],
    )
    .await?;
    wait_names::<k8s_openapi::api::networking::v1::NetworkPolicy>(&admin, w, "scoped", &["scoped"])
        .await?;
    for pod in ["scoped-1", "scoped-2"] {
        make_ready(&admin, w, pod, true).await?;
    }
    wait_cluster(&admin, w, "scoped", "phase Ready", |c| {
        phase(c) == Some(ClusterPhase::Ready)
    })
    .await?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(admin.clone(), h);
    let lease = leases.get(&full).await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("pgop-operator-0")
    );
    op.stop().await;
    watched.delete().await?;
    home.delete().await?;
    Ok(())
}

/// `watchNamespaces` with two namespaces: a Role and RoleBinding in each, nothing
/// cluster-wide for the main rules; the operator, impersonating the chart's ServiceAccount
/// with the flags the chart passes, reconciles a cluster in each of the two and leaves one
/// in a third namespace alone.
#[tokio::test]
async fn two_watched_namespaces_render_roles_in_each_and_the_operator_serves_both() -> Result {
    let (plane, admin, home) = setup("helm-list-home").await?;
    let first = TestNamespace::create(plane.config(), "helm-list-a").await?;
    let second = TestNamespace::create(plane.config(), "helm-list-b").await?;
    let other = TestNamespace::create(plane.config(), "helm-list-other").await?;
    let (h, a, b, o) = (home.name(), first.name(), second.name(), other.name());
    let full = format!("{h}-operator");
    let values = format!("watchNamespaces: [{a}, {b}]\n");
    let docs = template(h, h, &values)?;
    let only_namespaced = template(h, h, &format!("{values}rbac:\n  nodes: false\n"))?;
    assert_eq!(
        objects(&only_namespaced),
        [
            format!("Deployment {h}/{full}"),
            format!("Role {a}/{full}"),
            format!("Role {b}/{full}"),
            format!("Role {h}/{full}-leader-election"),
            format!("RoleBinding {a}/{full}"),
            format!("RoleBinding {b}/{full}"),
            format!("RoleBinding {h}/{full}-leader-election"),
            format!("Service {h}/{full}-metrics"),
            format!("ServiceAccount {h}/{full}"),
        ],
        "nothing cluster-wide"
    );
    let cluster_roles: Vec<String> = objects(&docs)
        .into_iter()
        .filter(|o| o.starts_with("Cluster"))
        .collect();
    assert_eq!(
        cluster_roles,
        [
            format!("ClusterRole {full}-nodes"),
            format!("ClusterRoleBinding {full}-nodes"),
        ],
        "only the Node reads are cluster-wide"
    );
    let flags: Vec<String> = args(&docs)
        .into_iter()
        .filter(|f| f.starts_with("--namespace"))
        .collect();
    assert_eq!(
        flags,
        [format!("--namespace={a}"), format!("--namespace={b}")]
    );
    let cluster_wide = template(h, h, "rbac:\n  nodes: false\n")?;
    for ns in [a, b] {
        let role = docs
            .iter()
            .find(|d| kind_of(d) == "Role" && d["metadata"]["namespace"].as_str() == Some(ns))
            .ok_or_else(|| format!("no Role in {ns}"))?;
        assert_eq!(role["rules"], one(&cluster_wide, "ClusterRole")["rules"]);
    }
    // The older one-namespace value renders as a list of one.
    assert_eq!(
        objects(&template(h, h, &namespaced(a))?),
        objects(&template(h, h, &format!("watchNamespaces: [{a}]\n"))?)
    );
    // The release namespace among the watched ones: its Role covers the Lease too.
    let with_home = template(h, h, &format!("watchNamespaces: [{a}, {h}]\n"))?;
    assert!(
        !objects(&with_home)
            .iter()
            .any(|o| o.contains("leader-election")),
        "{:?}",
        objects(&with_home)
    );

    apply(&admin, &docs).await?;
    let mut config = plane.config().clone();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{h}:{full}"));
    let operator_client = Client::try_from(config)?;
    assert!(
        Api::<PostgresCluster>::namespaced(operator_client.clone(), o)
            .list(&Default::default())
            .await
            .is_err(),
        "nothing in an unwatched namespace"
    );
    // Created first, so that by the time both watched clusters are Ready an operator
    // that watched it would have reconciled it too.
    create(&admin, o, &cluster("alone", 1)).await?;
    let op = Operator::start_with(
        &operator_client,
        pgop_operator::Options {
            namespaces: vec![a.to_string(), b.to_string()],
            leader_election: Some(pgop_operator::LeaderElection {
                namespace: h.to_string(),
                name: full.clone(),
                identity: "pgop-operator-0".to_string(),
            }),
            ..pgop_operator::Options::default()
        },
    );
    for ns in [a, b] {
        create(&admin, ns, &cluster("listed", 1)).await?;
    }
    for ns in [a, b] {
        wait_names::<Pod>(&admin, ns, "listed", &["listed-1"]).await?;
        make_ready(&admin, ns, "listed-1", true).await?;
    }
    for ns in [a, b] {
        wait_cluster(&admin, ns, "listed", "phase Ready", |c| {
            phase(c) == Some(ClusterPhase::Ready)
        })
        .await?;
    }
    let alone = get(&admin, o, "alone").await?;
    assert!(alone.status.is_none(), "{:?}", alone.status);
    assert!(alone.finalizers().is_empty(), "{:?}", alone.finalizers());
    assert_eq!(
        names::<Pod>(&admin, o, "alone").await?,
        Vec::<String>::new()
    );
    assert_eq!(
        names::<Secret>(&admin, o, "alone").await?,
        Vec::<String>::new()
    );
    op.stop().await;
    other.delete().await?;
    second.delete().await?;
    first.delete().await?;
    home.delete().await?;
    Ok(())
}

/// Whether every label of `selector` (a matchLabels map) is in `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_mapping()
        .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// Two releases side by side in one namespace, as in a canary of a new version
/// (docs/operator.md, "Upgrading pgop"): one per watched namespace, the second with
/// another image tag. No object of one is an object of the other (and so neither
/// `helm install` fails on the other's objects), their leader Leases differ, and each
/// Deployment and Service selects its own release's Pods only. Cluster-wide, their
/// ClusterRoles differ too. Both renderings apply to a real API server.
#[tokio::test]
async fn two_releases_side_by_side_share_no_object() -> Result {
    let (plane, admin, home) = setup("helm-two-home").await?;
    let first = TestNamespace::create(plane.config(), "helm-two-a").await?;
    let second = TestNamespace::create(plane.config(), "helm-two-b").await?;
    let (h, a, b) = (home.name(), first.name(), second.name());
    let stable = template("pgop-stable", h, &namespaced(b))?;
    let canary = template(
        "pgop-canary",
        h,
        &format!("watchNamespace: {a}\nimage: {{tag: 0.1.1-next}}\n"),
    )?;
    let shared = |x: &[Value], y: &[Value]| -> Vec<String> {
        let theirs = objects(y);
        objects(x)
            .into_iter()
            .filter(|o| theirs.contains(o))
            .collect()
    };
    assert_eq!(shared(&stable, &canary), Vec::<String>::new());
    let cluster_wide = (
        template("pgop-stable", h, DEFAULTS)?,
        template("pgop-canary", h, DEFAULTS)?,
    );
    assert_eq!(
        shared(&cluster_wide.0, &cluster_wide.1),
        Vec::<String>::new()
    );
    let flag = |docs: &[Value], name: &str| {
        args(docs)
            .into_iter()
            .find(|a| a.starts_with(name))
            .unwrap_or_default()
    };
    assert_eq!(
        flag(&stable, "--leader-election-name="),
        "--leader-election-name=pgop-stable-operator"
    );
    assert_eq!(
        flag(&canary, "--leader-election-name="),
        "--leader-election-name=pgop-canary-operator"
    );
    assert_eq!(flag(&stable, "--namespace="), format!("--namespace={b}"));
    assert_eq!(flag(&canary, "--namespace="), format!("--namespace={a}"));
    assert_eq!(
        flag(&canary, "--image="),
        "--image=pgop:0.1.1-next",
        "the canary's instances run its image"
    );
    assert_eq!(flag(&stable, "--image="), format!("--image=pgop:{VERSION}"));
    let deployment = |docs: &[Value]| one(docs, "Deployment").clone();
    for (mine, theirs) in [(&stable, &canary), (&canary, &stable)] {
        let pods = &deployment(mine)["spec"]["template"]["metadata"]["labels"];
        let other_pods = &deployment(theirs)["spec"]["template"]["metadata"]["labels"];
        let selector = &deployment(mine)["spec"]["selector"]["matchLabels"];
        assert!(selects(selector, pods));
        assert!(
            !selects(selector, other_pods),
            "a Deployment selects the other release's Pods"
        );
        let service = one(mine, "Service")["spec"]["selector"].clone();
        assert!(selects(&service, pods));
        assert!(
            !selects(&service, other_pods),
            "a Service selects the other release's Pods"
        );
    }
    apply(&admin, &stable).await?;
    apply(&admin, &canary).await?;
    second.delete().await?;
    first.delete().await?;
    home.delete().await?;
    Ok(())
}

/// The document of this kind and name.
fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| kind_of(d) == kind && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in {:?}", objects(docs)))
}

/// The value of the operator's flag `name` (e.g. `--webhook-name=`) in a rendering.
fn flag(docs: &[Value], name: &str) -> Result<String> {
    args(docs)
        .into_iter()
        .find_map(|a| a.strip_prefix(name).map(str::to_string))
        .ok_or_else(|| format!("no {name} in {:?}", args(docs)).into())
}

/// The chart's two webhooks, calling the Service `service` in `namespace`; `selector`: the
/// namespaceSelector of each, if any.
fn expected_webhooks(
    service: &str,
    namespace: &str,
    policy: &str,
    timeout: u32,
    selector: Option<&str>,
) -> Value {
    let selector = selector
        .map(|s| format!("namespaceSelector: {s}, "))
        .unwrap_or_default();
    let hook = |resource: &str, path: &str| {
        format!(
            "{{name: {resource}.database.example.com,
              clientConfig: {{service: {{name: {service}, namespace: {namespace}, path: {path}, port: 443}}}},
              rules: [{{apiGroups: [database.example.com], apiVersions: ['*'], operations: [CREATE, UPDATE],
                        resources: [{resource}], scope: Namespaced}}],
              {selector}failurePolicy: {policy}, timeoutSeconds: {timeout}, sideEffects: None,
              admissionReviewVersions: [v1], matchPolicy: Equivalent}}"
        )
    };
    yaml(&format!(
        "[{}, {}]",
        hook("postgresclusters", webhook::VALIDATE_CLUSTERS),
        hook("postgresbackups", webhook::VALIDATE_BACKUPS)
    ))
}

/// The defaulting webhook, calling the Service `service` in `namespace`.
fn expected_defaulting(
    service: &str,
    namespace: &str,
    policy: &str,
    timeout: u32,
    selector: Option<&str>,
) -> Value {
    let selector = selector
        .map(|s| format!("namespaceSelector: {s}, "))
        .unwrap_or_default();
    yaml(&format!(
        "[{{name: defaults.postgresclusters.database.example.com,
            clientConfig: {{service: {{name: {service}, namespace: {namespace}, path: {}, port: 443}}}},
            rules: [{{apiGroups: [database.example.com], apiVersions: ['*'], operations: [CREATE, UPDATE],
                      resources: [postgresclusters], scope: Namespaced}}],
            {selector}failurePolicy: {policy}, timeoutSeconds: {timeout}, sideEffects: None,
            reinvocationPolicy: Never, admissionReviewVersions: [v1], matchPolicy: Equivalent}}]",
        webhook::MUTATE_CLUSTERS
    ))
}

/// The webhook configurations of `docs` narrowed to `namespace`, so that applying
/// it to the shared control plane affects no other test (the cluster-wide one matches
/// every namespace).
fn narrowed(docs: &[Value], namespace: &str) -> Vec<Value> {
    let mut docs = docs.to_vec();
    for doc in docs
        .iter_mut()
        .filter(|d| kind_of(d).ends_with("WebhookConfiguration"))
    {
        for hook in doc["webhooks"].as_sequence_mut().into_iter().flatten() {
            hook["namespaceSelector"] = yaml(&format!(
                "{{matchLabels: {{kubernetes.io/metadata.name: {namespace}}}}}"
            ));
        }
    }
    docs
}

/// pgop's certificate keeper, as the ServiceAccount of the rendering `docs` and with its
/// `--webhook-*` flags, under the RBAC applied from it: it creates the Secret
/// of its `--webhook-secret` in the release namespace, renews it with a patch (at every check here:
/// valid 1 day, renewed 2 days ahead), and writes its authority into the caBundle of both
/// webhooks of the chart's configuration. The ServiceAccount may read no other
/// configuration (`other`).
async fn keeps_the_certificate(
    plane: &pgop_testenv::ControlPlane,
    admin: &Client,
    docs: &[Value],
    other: &str,
) -> Result {
    let deployment = one(docs, "Deployment");
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .ok_or("the Deployment's namespace")?;
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .ok_or("serviceAccountName")?;
    let configuration = flag(docs, "--webhook-configuration=")?;
    let mut config = plane.config().clone();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:{sa}"));
    let operator_client = Client::try_from(config)?;
    let forbidden = Api::<ValidatingWebhookConfiguration>::all(operator_client.clone())
        .get(other)
        .await;
    assert!(
        matches!(&forbidden, Err(kube::Error::Api(e)) if e.code == 403),
        "another configuration: {forbidden:?}"
    );

    let secret = flag(docs, "--webhook-secret=")?;
    let secret = secret.as_str();
    let managed = cert::Managed {
        namespace: namespace.to_string(),
        secret: secret.to_string(),
        names: flag(docs, "--webhook-name=")?
            .split(',')
            .map(str::to_string)
            .collect(),
        configurations: vec![configuration.clone()],
        conversion_crds: Vec::new(),
        conversion_client: None,
        validity_days: 1,
        renew_before_days: 2,
        check_every: std::time::Duration::from_millis(300),
    };
    let (tx, _rx) = tokio::sync::watch::channel(None);
    let keeper = tokio::spawn(cert::keep(
        operator_client,
        cert::Source::Managed(managed),
        tx,
        None,
    ));
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), namespace);
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let created = pgop_testenv::wait::until("the certificate's Secret", TIMEOUT, || async {
        secrets
            .get_opt(secret)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "not created: the keeper's calls fail (its RBAC?)".to_string())
    })
    .await?;
    pgop_testenv::wait::until("the Secret renewed", TIMEOUT, || async {
        let now = secrets.get(secret).await.map_err(|e| e.to_string())?;
        if now.metadata.resource_version == created.metadata.resource_version {
            Err("not patched since created: the keeper's calls fail (its RBAC?)".to_string())
        } else {
            Ok(())
        }
    })
    .await?;
    pgop_testenv::wait::until("the caBundle of the three webhooks", TIMEOUT, || async {
        let held = secrets.get(secret).await.map_err(|e| e.to_string())?;
        let ca = held
            .data
            .as_ref()
            .and_then(|d| d.get("ca.crt"))
            .map(|b| b.0.clone());
        let vwc = configurations
            .get(&configuration)
            .await
            .map_err(|e| e.to_string())?;
        let mwc = mutating
            .get(&configuration)
            .await
            .map_err(|e| e.to_string())?;
        let bundles: Vec<Option<Vec<u8>>> = vwc
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.client_config.ca_bundle.map(|b| b.0))
            .chain(
                mwc.webhooks
                    .unwrap_or_default()
                    .into_iter()
                    .map(|w| w.client_config.ca_bundle.map(|b| b.0)),
            )
            .collect();
        if ca.is_some() && bundles.len() == 3 && bundles.iter().all(|b| *b == ca) {
            Ok(())
        } else {
            Err(format!(
                "{} caBundles, ca.crt {}",
                bundles.len(),
                ca.is_some()
            ))
        }
    })
    .await?;
    keeper.abort();
    Ok(())
}

/// The admission and conversion webhooks, on by default (`webhook.enabled`,
/// `webhook.conversion`): cluster-wide, and for a watched namespace other than the
/// release's. The Deployment's flags and port, the
/// Service, the ValidatingWebhookConfiguration (without a caBundle: the operator writes
/// it) and the RBAC to keep that and the certificate's Secret. Both renderings apply to a
/// real API server (the cluster-wide configuration narrowed to this test's namespace: the
/// control plane is shared), and pgop's certificate keeper works under each one's RBAC.
#[tokio::test]
async fn webhooks_render_when_enabled_and_their_certificate_is_kept_under_the_chart_rbac() -> Result
{
    let (plane, admin, home) = setup("helm-wh").await?;
    let ns_home = TestNamespace::create(plane.config(), "helm-wh-ns-home").await?;
    let watched = TestNamespace::create(plane.config(), "helm-wh-watched").await?;
    let (h, nh, w) = (home.name(), ns_home.name(), watched.name());
    let full = format!("{h}-operator");
    let service = format!("{full}-webhook");

    // On by default; off: nothing of the webhooks.
    assert_eq!(
        template(h, h, WEBHOOK_DEFAULTS)?,
        template(h, h, WEBHOOKS)?,
        "the webhooks are on by default"
    );
    let defaults = template(h, h, WEBHOOKS_OFF)?;
    assert!(
        !objects(&defaults)
            .iter()
            .any(|o| o.ends_with("-webhook") || o.contains("WebhookConfiguration")),
        "{:?}",
        objects(&defaults)
    );
    assert!(
        !args(&defaults).iter().any(|a| a.starts_with("--webhook")),
        "{:?}",
        args(&defaults)
    );
    assert_eq!(
        container(&defaults)["ports"],
        yaml("[{name: metrics, containerPort: 8080, protocol: TCP}]")
    );

    // Cluster-wide.
    let docs = template(h, h, WEBHOOKS)?;
    let mut expected = objects(&defaults);
    expected.extend([
        format!("ClusterRole {full}-webhook"),
        format!("ClusterRoleBinding {full}-webhook"),
        format!("MutatingWebhookConfiguration {full}"),
        format!("Service {h}/{service}"),
        format!("ValidatingWebhookConfiguration {full}"),
    ]);
    expected.sort();
    assert_eq!(objects(&docs), expected, "the webhooks add these only");
    for kind in ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"] {
        assert_eq!(
            named(&docs, kind, &full),
            named(&defaults, kind, &full),
            "{kind} {full} is the same with the webhooks on"
        );
    }
    assert_eq!(
        args(&docs),
        [
            args(&defaults),
            vec![
                format!("--webhook-bind-address=:{}", webhook::DEFAULT_PORT),
                format!("--webhook-name={service}.{h}.svc,{service}.{h}.svc.cluster.local"),
                format!("--webhook-configuration={full}"),
                format!("--webhook-secret={full}-webhook-tls"),
                "--webhook-conversion-crd=postgresclusters.database.example.com".to_string(),
                format!("--webhook-conversion-service={h}/{service}"),
            ],
        ]
        .concat()
    );
    assert_eq!(
        container(&docs)["ports"],
        yaml(
            "[{name: metrics, containerPort: 8080, protocol: TCP}, {name: webhook, containerPort: 9443, protocol: TCP}]"
        )
    );
    let deployment = one(&docs, "Deployment");
    let svc = named(&docs, "Service", &service);
    assert_eq!(
        svc["spec"],
        yaml(&format!(
            "{{type: ClusterIP, selector: {}, ports: [{{name: webhook, port: 443, targetPort: webhook, protocol: TCP}}]}}",
            serde_json::to_string(&deployment["spec"]["selector"]["matchLabels"])?
        ))
    );
    let vwc = one(&docs, "ValidatingWebhookConfiguration");
    assert_eq!(
        vwc["apiVersion"].as_str(),
        Some("admissionregistration.k8s.io/v1")
    );
    assert_eq!(vwc["metadata"]["labels"], deployment["metadata"]["labels"]);
    assert_eq!(
        vwc["webhooks"],
        expected_webhooks(&service, h, "Ignore", 5, None),
        "every namespace, and no caBundle"
    );
    let mwc = one(&docs, "MutatingWebhookConfiguration");
    assert_eq!(mwc["metadata"]["labels"], deployment["metadata"]["labels"]);
    assert_eq!(
        mwc["webhooks"],
        expected_defaulting(&service, h, "Ignore", 5, None),
        "every namespace, and no caBundle"
    );
    assert_eq!(
        named(&docs, "ClusterRole", &format!("{full}-webhook"))["rules"],
        yaml(&format!(
            "[{{apiGroups: [admissionregistration.k8s.io],
                resources: [validatingwebhookconfigurations, mutatingwebhookconfigurations],
                resourceNames: [{full}], verbs: [get, patch]}},
              {{apiGroups: [scheduling.k8s.io], resources: [priorityclasses], verbs: [get]}},
              {{apiGroups: [apiextensions.k8s.io], resources: [customresourcedefinitions],
                resourceNames: [postgresclusters.database.example.com], verbs: [get, patch]}}]"
        ))
    );
    // Without conversion (another release converts): neither the flags nor the rule.
    let unconverting = template(h, h, "webhook: {conversion: false}\n")?;
    assert!(
        !args(&unconverting)
            .iter()
            .any(|a| a.starts_with("--webhook-conversion")),
        "{:?}",
        args(&unconverting)
    );
    assert_eq!(
        named(&unconverting, "ClusterRole", &format!("{full}-webhook"))["rules"]
            .as_sequence()
            .map(Vec::len),
        Some(2)
    );
    let binding = named(&docs, "ClusterRoleBinding", &format!("{full}-webhook"));
    assert_eq!(
        binding["roleRef"],
        yaml(&format!(
            "{{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {full}-webhook}}"
        ))
    );
    assert_eq!(
        binding["subjects"],
        yaml(&format!(
            "[{{kind: ServiceAccount, name: {full}, namespace: {h}}}]"
        ))
    );
    // The certificate's Secret: the main ClusterRole's secrets rule covers it.
    let secrets_rule = named(&docs, "ClusterRole", &full)["rules"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|r| r["resources"] == yaml("[secrets]"))
        .ok_or("no secrets rule in the ClusterRole")?;
    for verb in ["get", "create", "patch"] {
        assert!(
            secrets_rule["verbs"]
                .as_sequence()
                .is_some_and(|v| v.contains(&yaml(verb))),
            "secrets {verb}: {secrets_rule:?}"
        );
    }

    // The other values; and without rbac.create, no RBAC.
    let custom = template(
        h,
        h,
        "webhook: {enabled: true, port: 10443, failurePolicy: Fail, timeoutSeconds: 10}\n",
    )?;
    assert_eq!(flag(&custom, "--webhook-bind-address=")?, ":10443");
    assert_eq!(
        container(&custom)["ports"][1],
        yaml("{name: webhook, containerPort: 10443, protocol: TCP}")
    );
    assert_eq!(
        one(&custom, "ValidatingWebhookConfiguration")["webhooks"],
        expected_webhooks(&service, h, "Fail", 10, None)
    );
    let no_rbac = template(h, h, "webhook: {enabled: true}\nrbac: {create: false}\n")?;
    assert_eq!(
        objects(&no_rbac),
        [
            format!("Deployment {h}/{full}"),
            format!("MutatingWebhookConfiguration {full}"),
            format!("Service {h}/{full}-metrics"),
            format!("Service {h}/{service}"),
            format!("ServiceAccount {h}/{full}"),
            format!("ValidatingWebhookConfiguration {full}"),
        ]
    );

    // One watched namespace, not the release's: the configuration matches it only, and a
    // Role in the release namespace covers the certificate's Secret.
    let ns_full = format!("{nh}-operator");
    let ns_service = format!("{ns_full}-webhook");
    let ns_docs = template(nh, nh, &format!("watchNamespaces: [{w}]\n{WEBHOOKS}"))?;
    let ns_defaults = template(nh, nh, &format!("watchNamespaces: [{w}]\n"))?;
    let mut expected = objects(&ns_defaults);
    expected.extend([
        format!("ClusterRole {ns_full}-webhook"),
        format!("ClusterRoleBinding {ns_full}-webhook"),
        format!("MutatingWebhookConfiguration {ns_full}"),
        format!("Role {nh}/{ns_full}-webhook"),
        format!("RoleBinding {nh}/{ns_full}-webhook"),
        format!("Service {nh}/{ns_service}"),
        format!("ValidatingWebhookConfiguration {ns_full}"),
    ]);
    expected.sort();
    assert_eq!(objects(&ns_docs), expected);
    assert_eq!(
        flag(&ns_docs, "--webhook-name=")?,
        format!("{ns_service}.{nh}.svc,{ns_service}.{nh}.svc.cluster.local")
    );
    assert_eq!(
        one(&ns_docs, "ValidatingWebhookConfiguration")["webhooks"],
        expected_webhooks(
            &ns_service,
            nh,
            "Ignore",
            5,
            Some(&format!(
                "{{matchExpressions: [{{key: kubernetes.io/metadata.name, operator: In, values: [{w}]}}]}}"
            ))
        )
    );
    assert_eq!(
        one(&ns_docs, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"],
        one(&ns_docs, "ValidatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]
    );
    let role = docs_in(&ns_docs, "Role", nh, &format!("{ns_full}-webhook"));
    assert_eq!(
        role["rules"],
        yaml(&format!(
            "[{{apiGroups: [''], resources: [secrets], resourceNames: [{ns_full}-webhook-tls], verbs: [get, patch]}},
              {{apiGroups: [''], resources: [secrets], verbs: [create]}}]"
        ))
    );
    let role_binding = docs_in(&ns_docs, "RoleBinding", nh, &format!("{ns_full}-webhook"));
    assert_eq!(
        role_binding["roleRef"],
        yaml(&format!(
            "{{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {ns_full}-webhook}}"
        ))
    );
    assert_eq!(
        role_binding["subjects"],
        yaml(&format!(
            "[{{kind: ServiceAccount, name: {ns_full}, namespace: {nh}}}]"
        ))
    );
    // The release namespace among the watched ones: its Role covers the Secret.
    let with_home = template(
        nh,
        nh,
        &format!("watchNamespaces: [team-a, {nh}]\n{WEBHOOKS}"),
    )?;
    assert!(
        !objects(&with_home)
            .iter()
            .any(|o| o.starts_with("Role") && o.ends_with("-webhook")),
        "{:?}",
        objects(&with_home)
    );
    assert_eq!(
        one(&with_home, "ValidatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"],
        yaml(&format!(
            "{{matchExpressions: [{{key: kubernetes.io/metadata.name, operator: In, values: [team-a, {nh}]}}]}}"
        ))
    );

    // Applied (nothing is created in the namespaces the configurations match), and the
    // certificate kept as each release's ServiceAccount.
    apply(&admin, &narrowed(&docs, h)).await?;
    apply(&admin, &ns_docs).await?;
    keeps_the_certificate(plane, &admin, &docs, &ns_full).await?;
    keeps_the_certificate(plane, &admin, &ns_docs, &full).await?;
    // Namespace-scoped: no other Secret of the release namespace.
    let mut config = plane.config().clone();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{nh}:{ns_full}"));
    let other_secret = Api::<Secret>::namespaced(Client::try_from(config)?, nh)
        .get_opt("another-secret")
        .await;
    assert!(
        matches!(&other_secret, Err(kube::Error::Api(e)) if e.code == 403),
        "{other_secret:?}"
    );

    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    for name in [&full, &ns_full] {
        configurations.delete(name, &Default::default()).await?;
        mutating.delete(name, &Default::default()).await?;
    }
    watched.delete().await?;
    ns_home.delete().await?;
    home.delete().await?;
    Ok(())
}

/// The namespaced document of this kind, namespace and name.
fn docs_in<'a>(docs: &'a [Value], kind: &str, namespace: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| {
            kind_of(d) == kind
                && d["metadata"]["namespace"].as_str() == Some(namespace)
                && d["metadata"]["name"].as_str() == Some(name)
        })
        .unwrap_or_else(|| panic!("no {kind} {namespace}/{name} in {:?}", objects(docs)))
}
