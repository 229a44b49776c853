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
