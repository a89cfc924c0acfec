//! Cluster DNS: CoreDNS as a real Deployment behind the `kube-dns` Service at
//! [`super::CLUSTER_DNS`], the address every kubelet gives its Pods. It answers for
//! `cluster.local` only: there is no upstream to forward other names to.

use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

const FIELD_MANAGER: &str = "pgop-testenv";
/// CoreDNS listens on an unprivileged port (it runs as a non-root user with no
/// capabilities); the Service maps port 53 to it.
const PORT: i32 = 1053;

const COREFILE: &str = ".:1053 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
    loop
}
";

fn objects(image: &str) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "coredns", "namespace": "kube-system"}
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": ["list", "watch"]}
            ]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": "coredns",
                          "namespace": "kube-system"}]
        }),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "data": {"Corefile": COREFILE}
        }),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "coredns", "namespace": "kube-system",
                         "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                "template": {
                    "metadata": {"labels": {"k8s-app": "kube-dns"}},
                    "spec": {
                        "serviceAccountName": "coredns",
                        // Its own Service's address does not answer until it is ready.
                        "dnsPolicy": "Default",
                        // On the infrastructure node when there is one, away from the
                        // nodes fault tests break.
                        "tolerations": [{"key": super::INFRA_LABEL, "operator": "Exists",
                                         "effect": "NoSchedule"}],
                        "affinity": {"nodeAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [{
                                "weight": 100,
                                "preference": {"matchExpressions": [{
                                    "key": super::INFRA_LABEL, "operator": "In",
                                    "values": ["true"]}]}
                            }]
                        }},
                        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                            "runAsGroup": 65532,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "coredns",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "ports": [
                                {"name": "dns", "containerPort": PORT, "protocol": "UDP"},
                                {"name": "dns-tcp", "containerPort": PORT, "protocol": "TCP"}
                            ],
                            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                               "periodSeconds": 1},
                            "livenessProbe": {"httpGet": {"path": "/health", "port": 8080},
                                              "periodSeconds": 10},
                            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                          "limits": {"memory": "128Mi"}},
                            "securityContext": {"allowPrivilegeEscalation": false,
                                                "readOnlyRootFilesystem": true,
                                                "capabilities": {"drop": ["ALL"]}},
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns",
                                              "readOnly": true}]
                        }],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}]
                    }
                }
            }
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system",
                         "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "clusterIP": super::CLUSTER_DNS.to_string(),
                "selector": {"k8s-app": "kube-dns"},
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": PORT, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": PORT, "protocol": "TCP"}
                ]
            }
        }),
    ]
}

/// Applies CoreDNS's objects server-side (idempotent).
pub async fn install(client: &kube::Client, image: &str) -> Result<(), super::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for object in objects(image) {
        let obj: DynamicObject = serde_json::from_value(object).map_err(|e| super::Error::Io {
            what: "CoreDNS's objects".into(),
            source: std::io::Error::other(e),
        })?;
        let types = obj.types.clone().unwrap_or_default();
        let (group, version) = match types.api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), types.api_version.clone()),
        };
        let resource = ApiResource {
            group: group.clone(),
            version: version.clone(),
            api_version: types.api_version.clone(),
            kind: types.kind.clone(),
            plural: format!("{}s", types.kind.to_lowercase()),
        };
        let name = obj.metadata.name.clone().unwrap_or_default();
        let api: Api<DynamicObject> = match &obj.metadata.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        api.patch(&name, &params, &Patch::Apply(&obj)).await?;
    }
    Ok(())
}
