#!/usr/bin/env python3
"""Writes pgop's OLM bundle (registry+v1) from the chart's rendering; run by
hack/render-bundle.sh, which says where every input comes from.

    render_bundle.py --root DIR --helm FILE --namespace NS --version V --kube-version V --out DIR

--helm is `helm template` of charts/pgop with the values the bundle needs (webhook.certDir
set to OLM's certificate directory), rendered into --namespace, which must then appear in
nothing the bundle takes from it: OLM installs into a namespace of its choosing.
Needs PyYAML.
"""

import argparse
import base64
import copy
import json
import re
import sys
from pathlib import Path

import yaml

PACKAGE = "pgop"
# A channel name of OLM's convention (candidate, fast, stable): pre-releases.
CHANNEL = "candidate"
# Where OLM mounts the certificate it issues for a deployment with webhooks (tls.crt,
# tls.key); hack/render-bundle.sh renders the chart with webhook.certDir set to it.
OLM_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"
# Labels Helm's rendering carries that mean nothing in an OLM install.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


class Fail(Exception):
    pass


class Dumper(yaml.SafeDumper):
    """Block style, keys in the order given, multi-line strings as literal blocks."""


def _str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _str)


def dump(doc):
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)


def load_all(text, what):
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise Fail(f"{what} is not valid YAML: {e}") from e


def one(docs, kind, name=None):
    found = [
        d for d in docs
        if d.get("kind") == kind and (name is None or d.get("metadata", {}).get("name") == name)
    ]
    if len(found) != 1:
        raise Fail(f"expected one {kind} {name or ''} in the chart's rendering, found {len(found)}")
    return found[0]


def clean_labels(metadata):
    labels = metadata.get("labels") or {}
    for key in HELM_LABELS:
        labels.pop(key, None)
    if labels:
        metadata["labels"] = labels
    else:
        metadata.pop("labels", None)


def schema_node(schema, path, what):
    """The schema of a dotted path under spec or status, or Fail naming it."""
    node = schema
    for part in path.split("."):
        props = node.get("properties") or {}
        if part not in props:
            raise Fail(f"{what}: the descriptor path {path!r} is not in the CRD's schema")
        node = props[part]
    return node


def summary(description):
    """The first sentence of a schema description, on one line."""
    text = " ".join((description or "").split())
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    return match.group(1) if match else text


def crd_versions(crds):
    out = {}
    for crd in crds:
        for version in crd["spec"]["versions"]:
            out[(crd["metadata"]["name"], version["name"])] = version
    return out


def owned_crds(base_owned, crds):
    versions = crd_versions(crds)
    owned = []
    for entry in base_owned:
        entry = copy.deepcopy(entry)
        key = (entry["name"], entry["version"])
        if key not in versions:
            raise Fail(f"owned CRD {key[0]} {key[1]} is not in charts/pgop/crds/crds.yaml")
        schema = versions[key]["schema"]["openAPIV3Schema"]
        what = f"{entry['kind']} {entry['version']}"
        out = {}
        for field in ("name", "version", "kind", "displayName"):
            out[field] = entry.pop(field)
        out["description"] = summary(schema.get("description"))
        if not out["description"]:
            raise Fail(f"{what}: the CRD's schema has no description")
        for field, under in (("specDescriptors", "spec"), ("statusDescriptors", "status")):
            described = []
            for descriptor in entry.pop(field, []):
                node = schema_node(schema["properties"][under], descriptor["path"], what)
                described.append({
                    "path": descriptor["path"],
                    "displayName": descriptor["displayName"],
                    "description": summary(node.get("description")),
                    "x-descriptors": descriptor["x-descriptors"],
                })
            out[field] = described
        out.update(entry)
        owned.append(out)
    served = {(n, v) for (n, v), ver in versions.items() if ver.get("served")}
    names = {n for (n, _) in served}
    missing = names - {o["name"] for o in owned}
    if missing:
        raise Fail(f"CRDs of the chart without an owned entry in hack/olm/csv.yaml: {sorted(missing)}")
    return owned


def webhook_definitions(docs, crds, deployment, target_port):
    """OLM's webhookdefinitions from the chart's webhook configurations and the CRDs'
    conversion webhooks: the same paths, rules and policies; OLM makes the Service,
    the configurations (scoped to its operator group's namespaces), the certificate and
    the caBundles."""
    definitions = []
    configurations = (
        ("ValidatingWebhookConfiguration", "ValidatingAdmissionWebhook"),
        ("MutatingWebhookConfiguration", "MutatingAdmissionWebhook"),
    )
    for kind, olm_type in configurations:
        configuration = one(docs, kind)
        for hook in configuration["webhooks"]:
            service = hook["clientConfig"]["service"]
            definition = {
                "type": olm_type,
                "generateName": hook["name"],
                "deploymentName": deployment,
                "containerPort": service.get("port", 443),
                "targetPort": target_port,
                "webhookPath": service["path"],
                "rules": hook["rules"],
                "admissionReviewVersions": hook["admissionReviewVersions"],
                "sideEffects": hook["sideEffects"],
                "failurePolicy": hook["failurePolicy"],
                "matchPolicy": hook["matchPolicy"],
                "timeoutSeconds": hook["timeoutSeconds"],
            }
            if "reinvocationPolicy" in hook:
                definition["reinvocationPolicy"] = hook["reinvocationPolicy"]
            definitions.append(definition)
    for crd in crds:
        conversion = crd["spec"].get("conversion") or {}
        if conversion.get("strategy") != "Webhook":
            continue
        webhook = conversion["webhook"]
        service = webhook["clientConfig"]["service"]
        definitions.append({
            "type": "ConversionWebhook",
            "generateName": "c" + crd["metadata"]["name"],
            "deploymentName": deployment,
            "containerPort": service.get("port", 443),
            "targetPort": target_port,
            "webhookPath": service["path"],
            "conversionCRDs": [crd["metadata"]["name"]],
            "admissionReviewVersions": webhook["conversionReviewVersions"],
            "sideEffects": "None",
        })
    return definitions


def crd_files(text):
    """charts/pgop/crds/crds.yaml split into one file per CRD, each as `pgop crd` wrote it."""
    files = {}
    chunks = re.split(r"^---[ \t]*\n", text, flags=re.M)
    for chunk in chunks:
        body = "".join(l for l in chunk.splitlines(keepends=True) if not l.startswith("#"))
        if not body.strip():
            continue
        crd = yaml.safe_load(body)
        group = crd["spec"]["group"]
        plural = crd["spec"]["names"]["plural"]
        header = (
            "# Generated by hack/render-bundle.sh from charts/pgop/crds/crds.yaml (`pgop crd`);\n"
            "# do not edit.\n"
        )
        files[f"{group}_{plural}.yaml"] = (crd, header + body.lstrip("\n"))
    return files


def main():
    parser = argparse.ArgumentParser()
    for flag in ("--root", "--helm", "--namespace", "--version", "--kube-version", "--out"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    root = Path(args.root)
    out = Path(args.out)

    docs = load_all(Path(args.helm).read_text(), "the chart's rendering")
    crds_text = (root / "charts/pgop/crds/crds.yaml").read_text()
    crds_by_file = crd_files(crds_text)
    crds = [crd for crd, _ in crds_by_file.values()]
    base = yaml.safe_load((root / "hack/olm/csv.yaml").read_text())

    deployment = copy.deepcopy(one(docs, "Deployment"))
    name = deployment["metadata"]["name"]
    pod = deployment["spec"]["template"]["spec"]
    containers = pod["containers"]
    if len(containers) != 1:
        raise Fail("expected one container in the chart's Deployment")
    container = containers[0]
    args_ = container.get("args", [])
    if f"--webhook-cert-dir={OLM_CERT_DIR}" not in args_:
        raise Fail(f"the chart's Deployment does not serve the webhooks from {OLM_CERT_DIR}; render it with webhook.certDir={OLM_CERT_DIR}")
    webhook_ports = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == "webhook"]
    if len(webhook_ports) != 1:
        raise Fail("expected one container port named webhook in the chart's Deployment")
    image = container["image"]
    service_account = pod["serviceAccountName"]

    rules = []
    for role in docs:
        if role.get("kind") == "ClusterRole":
            rules.extend(role["rules"])
    bindings = [d for d in docs if d.get("kind") in ("ClusterRoleBinding", "RoleBinding")]
    for binding in bindings:
        subjects = binding.get("subjects") or []
        if subjects != [{"kind": "ServiceAccount", "name": service_account, "namespace": args.namespace}]:
            raise Fail(f"{binding['kind']} {binding['metadata']['name']} binds {subjects}, not the operator's ServiceAccount")
    unexpected = sorted({d["kind"] for d in docs} - {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
        "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
    })
    if unexpected:
        raise Fail(f"the chart's rendering has kinds the bundle does not carry over: {unexpected}")

    clean_labels(deployment["metadata"])
    deployment_entry = {
        "name": name,
        "label": deployment["metadata"].get("labels", {}),
        "spec": deployment["spec"],
    }

    metrics = copy.deepcopy(one(docs, "Service", f"{name}-metrics"))
    metrics["metadata"].pop("namespace", None)
    clean_labels(metrics["metadata"])

    examples = []
    for example in ("cluster.yaml", "backup.yaml"):
        examples.extend(load_all((root / "examples" / example).read_text(), f"examples/{example}"))

    csv_name = f"{PACKAGE}.v{args.version}"
    annotations = dict(base["metadata"]["annotations"])
    annotations["alm-examples"] = json.dumps(examples, indent=2) + "\n"
    annotations["containerImage"] = image
    annotations = dict(sorted(annotations.items()))

    icon = base64.b64encode((root / "hack/olm/icon.svg").read_bytes()).decode()
    spec = copy.deepcopy(base["spec"])
    owned = owned_crds(spec["customresourcedefinitions"]["owned"], crds)
    spec["customresourcedefinitions"] = {"owned": owned}
    spec["version"] = args.version
    spec["minKubeVersion"] = args.kube_version
    spec["icon"] = [{"base64data": icon, "mediatype": "image/svg+xml"}]
    spec["install"] = {
        "strategy": "deployment",
        "spec": {
            "clusterPermissions": [{"serviceAccountName": service_account, "rules": rules}],
            "deployments": [deployment_entry],
        },
    }
    spec["webhookdefinitions"] = webhook_definitions(docs, crds, name, webhook_ports[0])
    spec["relatedImages"] = [{"name": "pgop", "image": image}]

    csv = {
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {"name": csv_name, "annotations": annotations},
        "spec": spec,
    }

    # Nothing taken from the chart may name the namespace it was rendered into.
    for what, value in (("the ClusterServiceVersion", csv), ("the metrics Service", metrics)):
        if args.namespace in json.dumps(value):
            raise Fail(f"{what} names the namespace {args.namespace!r} the chart was rendered into")

    header = (
        "# Generated by hack/render-bundle.sh from hack/olm/csv.yaml and the chart (docs/olm.md);\n"
        "# do not edit.\n"
    )
    files = {
        "manifests/pgop.clusterserviceversion.yaml": header + dump(csv),
        f"manifests/{name}-metrics_v1_service.yaml": header + dump(metrics),
    }
    for file, (_, text) in crds_by_file.items():
        files[f"manifests/{file}"] = text
    files["metadata/annotations.yaml"] = header + dump({"annotations": {
        "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
        "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
        "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
        "operators.operatorframework.io.bundle.package.v1": PACKAGE,
        "operators.operatorframework.io.bundle.channels.v1": CHANNEL,
        "operators.operatorframework.io.bundle.channel.default.v1": CHANNEL,
    }})
    files["bundle.Dockerfile"] = (
        "# Generated by hack/render-bundle.sh; do not edit. The bundle image, built from this\n"
        "# directory: docker build -f bundle.Dockerfile -t REGISTRY/pgop-bundle:v"
        f"{args.version} bundle/\n"
        "FROM scratch\n"
        "LABEL operators.operatorframework.io.bundle.mediatype.v1=registry+v1\n"
        "LABEL operators.operatorframework.io.bundle.manifests.v1=manifests/\n"
        "LABEL operators.operatorframework.io.bundle.metadata.v1=metadata/\n"
        f"LABEL operators.operatorframework.io.bundle.package.v1={PACKAGE}\n"
        f"LABEL operators.operatorframework.io.bundle.channels.v1={CHANNEL}\n"
        f"LABEL operators.operatorframework.io.bundle.channel.default.v1={CHANNEL}\n"
        "COPY manifests /manifests/\n"
        "COPY metadata /metadata/\n"
    )
    for file, text in files.items():
        path = out / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


if __name__ == "__main__":
    try:
        main()
    except (Fail, OSError, KeyError, TypeError) as e:
        print(f"render-bundle: {type(e).__name__ if not isinstance(e, Fail) else 'error'}: {e}", file=sys.stderr)
        sys.exit(1)
