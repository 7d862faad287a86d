{{/*
Names. Kubernetes names (and label values) stop at 63 characters, so every composed name is truncated to 63 and
loses a trailing "-" the cut may leave.
*/}}
{{- define "moelora.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "moelora.fullname" -}}
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

{{/* "<fullname>-<suffix>" in at most 63 characters: the prefix is cut, never the suffix. Call with (list $ "suffix"). */}}
{{- define "moelora.componentName" -}}
{{- $root := index . 0 }}
{{- $suffix := index . 1 }}
{{- printf "%s-%s" (include "moelora.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{- define "moelora.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "moelora.labels" -}}
helm.sh/chart: {{ include "moelora.chart" . }}
app.kubernetes.io/name: {{ include "moelora.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "moelora.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "moelora.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "moelora.operatorServiceAccountName" -}}
{{- if .Values.operator.serviceAccount.name }}
{{- .Values.operator.serviceAccount.name }}
{{- else }}
{{- include "moelora.componentName" (list . "operator") }}
{{- end }}
{{- end }}

{{/* An image reference from {repository, tag, digest}; call with (list image defaultTag). */}}
{{- define "moelora.image" -}}
{{- $image := index . 0 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default (index . 1) $image.tag) }}
{{- end }}
{{- end }}

{{- define "moelora.serverImage" -}}
{{- include "moelora.image" (list .Values.server.image .Chart.AppVersion) }}
{{- end }}

{{- define "moelora.agentImage" -}}
{{- if .Values.server.agentImage.repository }}
{{- $image := dict "repository" .Values.server.agentImage.repository "tag" .Values.server.agentImage.tag "digest" "" }}
{{- include "moelora.image" (list $image (default .Chart.AppVersion .Values.server.image.tag)) }}
{{- else }}
{{- include "moelora.serverImage" . }}
{{- end }}
{{- end }}

{{/* kopf peering: required as soon as two operators could run at once. */}}
{{- define "moelora.peeringEnabled" -}}
{{- if or .Values.operator.peering.enabled (gt (int .Values.operator.replicas) 1) }}true{{ end }}
{{- end }}

{{- define "moelora.peeringName" -}}
{{- default (include "moelora.fullname" .) .Values.operator.peering.name }}
{{- end }}

{{/* Namespaces of the server ServiceAccount, as a JSON list (use with fromJsonArray). */}}
{{- define "moelora.serverNamespaces" -}}
{{- if .Values.server.namespaces }}
{{- toJson (.Values.server.namespaces | uniq) }}
{{- else if .Values.watchNamespaces }}
{{- toJson (.Values.watchNamespaces | uniq) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/* Labels the operator puts on every server pod and Service it creates (moelora.operator.render.naming): the monitors select by them. */}}
{{- define "moelora.serverSelectorLabels" -}}
app.kubernetes.io/name: moelora-server
app.kubernetes.io/managed-by: moelora
{{- end }}

{{/* Where server pods can run, as a Prometheus Operator namespaceSelector: the watched namespaces, or all. */}}
{{- define "moelora.serverNamespaceSelector" -}}
{{- if .Values.watchNamespaces }}
matchNames:
  {{- toYaml (.Values.watchNamespaces | uniq) | nindent 2 }}
{{- else }}
any: true
{{- end }}
{{- end }}
