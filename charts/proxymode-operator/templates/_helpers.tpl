{{/*
Named templates for the proxymode-operator chart. Every name starts with
"proxymode-operator." because defined templates are global across a release.
*/}}

{{/* The chart name, overridable. */}}
{{- define "proxymode-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name: "<release>-<chart>", or just the release name when it already contains the
chart name. Truncated to 63 characters (the DNS label limit).
*/}}
{{- define "proxymode-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "proxymode-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the operator. */}}
{{- define "proxymode-operator.labels" -}}
{{ include "proxymode-operator.selectorLabels" . }}
{{ include "proxymode-operator.commonLabels" . }}
{{- end }}

{{/* Labels on every object, without the name/instance pair (for objects that have their own). */}}
{{- define "proxymode-operator.commonLabels" -}}
helm.sh/chart: {{ include "proxymode-operator.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: proxymode
{{- end }}

{{/* Labels that select the operator pod (immutable in a Deployment: never add to these). */}}
{{- define "proxymode-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "proxymode-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "proxymode-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "proxymode-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: repository plus digest, or tag (default: the appVersion). */}}
{{- define "proxymode-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* kopf's liveness endpoint, exactly as passed to --liveness. */}}
{{- define "proxymode-operator.livenessURL" -}}
{{- printf "http://0.0.0.0:%d%s" (int .Values.liveness.port) .Values.liveness.path }}
{{- end }}

{{/* The name of the objects that serve kube-proxy's metrics to the ServiceMonitor. */}}
{{- define "proxymode-operator.kubeProxyMetricsName" -}}
{{- printf "%s-kube-proxy" (include "proxymode-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of the kube-proxy metrics Service (what the ServiceMonitor selects). */}}
{{- define "proxymode-operator.kubeProxyMetricsLabels" -}}
app.kubernetes.io/name: {{ include "proxymode-operator.name" . }}-kube-proxy-metrics
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The kube-proxy metrics Service's labels; k8s-app becomes the job label ("kube-proxy"). */}}
{{- define "proxymode-operator.kubeProxyMetricsServiceLabels" -}}
{{ include "proxymode-operator.kubeProxyMetricsLabels" . }}
{{ include "proxymode-operator.commonLabels" . }}
k8s-app: kube-proxy
{{- end }}

{{/* A namespace override or the release namespace. Usage: include "...namespaceOr" (list . .Values.x.namespace) */}}
{{- define "proxymode-operator.namespaceOr" -}}
{{- $root := index . 0 }}
{{- default $root.Release.Namespace (index . 1) }}
{{- end }}

{{/* The kube-state-metrics custom-resource metric prefix for ProxyModePolicy. */}}
{{- define "proxymode-operator.ksmPrefix" -}}
kube_customresource_proxymodepolicy
{{- end }}

{{/* The Role (and RoleBinding) for kube-proxy's objects, in each kube-proxy namespace. */}}
{{- define "proxymode-operator.kubeProxyRoleName" -}}
{{- printf "%s-kube-proxy" (include "proxymode-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
