{{/* Name of the release's objects: the release name, or "<release>-ipam-bridge". */}}
{{- define "ipam-bridge.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object: the clusterctl provider label plus Helm's standard labels. */}}
{{- define "ipam-bridge.labels" -}}
cluster.x-k8s.io/provider: ipam-bridge
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector of the manager Pods (the same as deploy/manager/deployment.yaml). */}}
{{- define "ipam-bridge.selectorLabels" -}}
app.kubernetes.io/name: ipam-bridge
app.kubernetes.io/component: manager
{{- end -}}

{{- define "ipam-bridge.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default (printf "v%s" .Chart.AppVersion)) -}}
{{- end -}}

{{/*
The namespaces served (IPAM_BRIDGE_NAMESPACE): settings.namespace; the deprecated value
watchNamespace when that is empty. Both set to different namespaces fails the install.
*/}}
{{- define "ipam-bridge.namespaceScope" -}}
{{- $namespace := (.Values.settings | default dict).namespace | default "" | toString -}}
{{- $former := .Values.watchNamespace | default "" | toString -}}
{{- if and $former $namespace (ne $former $namespace) -}}
{{- fail "watchNamespace is deprecated: set settings.namespace only" -}}
{{- end -}}
{{- $namespace | default $former -}}
{{- end -}}

{{/*
The settings the chart sets from values of their own: a settings key for one of them would
give the manager two values (the value to use instead is named).
*/}}
{{- define "ipam-bridge.checkSettings" -}}
{{- $owned := dict "metrics_port" "metrics.port" "health_port" "health.port" "leader_election" "leaderElection.enabled" "leader_election_lease_seconds" "leaderElection.leaseSeconds" "leader_election_renew_deadline_seconds" "leaderElection.renewDeadlineSeconds" "leader_election_retry_seconds" "leaderElection.retrySeconds" "namespace_scope" "settings.namespace" -}}
{{- range $key, $value := (.Values.settings | default dict) -}}
{{- if hasKey $owned $key -}}
{{- fail (printf "settings.%s: set %s instead" $key (get $owned $key)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
