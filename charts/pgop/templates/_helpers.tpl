{{/*
The name of every object: fullnameOverride, else "<release>-operator" (pgop-operator for a
release named pgop), cut to 63 characters.
*/}}
{{- define "pgop.fullname" -}}
{{- default (printf "%s-operator" .Release.Name) .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the operator's Pods; never change them in an upgrade. */}}
{{- define "pgop.selectorLabels" -}}
app.kubernetes.io/name: pgop-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "pgop.labels" -}}
{{ include "pgop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: pgop
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "pgop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pgop.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator's image: repository:tag, the tag defaulting to the appVersion. */}}
{{- define "pgop.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The default image of instance pods: instances.image, else the operator's. */}}
{{- define "pgop.instanceImage" -}}
{{- default (include "pgop.image" .) .Values.instances.image -}}
{{- end -}}

{{/* The webhooks' Service, whose DNS names the operator's serving certificate is for. */}}
{{- define "pgop.webhookService" -}}
{{- printf "%s-webhook" (include "pgop.fullname" .) -}}
{{- end -}}

{{- define "pgop.leaseName" -}}
{{- default (include "pgop.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/*
The namespaces the operator watches, as a JSON list (read it with fromJsonArray):
watchNamespaces, or watchNamespace alone (the older one-namespace value); empty: all
namespaces. Setting both is refused.
*/}}
{{- define "pgop.watchNamespaces" -}}
{{- if and .Values.watchNamespace .Values.watchNamespaces -}}
{{- fail "set watchNamespaces (a list of namespaces) or watchNamespace (one namespace, the older value), not both" -}}
{{- end -}}
{{- if .Values.watchNamespace -}}
{{- list .Values.watchNamespace | toJson -}}
{{- else -}}
{{- .Values.watchNamespaces | default list | uniq | toJson -}}
{{- end -}}
{{- end -}}

{{/*
Cluster-scoped reads, whichever namespaces are watched: Nodes (a watch cache of their names
and cordons: a drained primary's node is left by a switchover, and a volume pinned to a
deleted node is recreated elsewhere) and the PersistentVolume of a claim whose node is gone.
*/}}
{{- define "pgop.clusterRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [persistentvolumes]
  verbs: [get]
{{- end -}}

{{/*
Everything `pgop operator` may do in the namespaces it watches, and nothing more: the rules
of the ClusterRole (cluster-wide) or of the Role in each watched namespace (namespace-scoped).
*/}}
{{- define "pgop.rules" -}}
# Each rule, and each verb, is used; crates/operator/tests/it/rbac_minimal.rs removes them one
# at a time and shows what then fails (docs/security.md has the table).
# The controllers' watches; get: a backup's cluster, a recovery's source cluster (and
# granted to the instance Roles). patch: only to remove the switchover annotation once
# it has been read.
- apiGroups: [database.example.com]
  resources: [postgresclusters]
  verbs: [get, list, watch, patch]
# get: a recovery's source backup. Scheduled backups are created, and those retention
# removed from the store deleted. patch: the ownerReference of a backup made before
# v1beta1 renamed to v1beta1.
- apiGroups: [database.example.com]
  resources: [postgresbackups]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [database.example.com]
  resources: [postgresclusters/status, postgresbackups/status]
  verbs: [patch]
# The children: listed and watched (the operator's caches), written by server-side
# apply (patch, and create for a new object); Pods and generated Secrets are created
# once. Pods and claims of removed instances are deleted, and the superuser's Secret
# once access is turned off; get: a backup's instance Pod, the certificates' Secrets.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [list, watch, create, patch]
# delete: the Service of a pooler removed from spec.poolers.
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create, patch, delete]
# The poolers' Deployments (spec.poolers; deleted when removed from it).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [list, watch, create, patch, delete]
# The primary's budget goes once no switchover could move it.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch, create, patch, delete]
# Each cluster's NetworkPolicy (spec.networkPolicy; deleted when turned off).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [list, watch, create, patch]
# get, create, update: the leader Lease, and the release of a dead primary's Lease. list
# and watch: only because the instance Roles grant them (the manager watches its cluster's
# Lease), and RBAC lets no one grant what it does not hold.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
