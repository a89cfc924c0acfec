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

{{- define "pgop.leaseName" -}}
{{- default (include "pgop.fullname" .) .Values.leaderElection.leaseName -}}
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
of the ClusterRole (cluster-wide) or of the Role in watchNamespace (namespace-scoped).
*/}}
{{- define "pgop.rules" -}}
- apiGroups: [database.example.com]
  resources: [postgresclusters, postgresbackups]
  verbs: [get, list, watch]
# Scheduled backups are created, and those retention removed from the store deleted.
- apiGroups: [database.example.com]
  resources: [postgresbackups]
  verbs: [create, delete]
# Only to remove the switchover annotation once it has been acted on.
- apiGroups: [database.example.com]
  resources: [postgresclusters]
  verbs: [patch]
- apiGroups: [database.example.com]
  resources: [postgresclusters/status, postgresbackups/status]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [pods, persistentvolumeclaims, services, secrets, serviceaccounts]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, update, delete]
# Each cluster's NetworkPolicy (spec.networkPolicy).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch, update, delete]
# The operator grants these to instance pods through their Role, so it must hold them
# (RBAC forbids granting what one does not have); its own leader election uses get,
# create and update on its Lease.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
