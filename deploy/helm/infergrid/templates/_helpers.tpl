{{/*
Names, labels and images shared by every template.
*/}}

{{- define "infergrid.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's base name. Component names append at most "-device-plugin"
(14 characters), so it is cut to 48 to keep every object name within 63.
*/}}
{{- define "infergrid.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 48 | trimSuffix "-" }}
{{- else if contains (include "infergrid.name" .) .Release.Name }}
{{- .Release.Name | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "infergrid.name" .) | trunc 48 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "infergrid.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "infergrid.labels" -}}
helm.sh/chart: {{ include "infergrid.chart" . }}
app.kubernetes.io/name: {{ include "infergrid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: infergrid
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of one component: (dict "root" $ "component" "operator"). */}}
{{- define "infergrid.componentLabels" -}}
{{ include "infergrid.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The selector of one component's pods; never changes across upgrades. */}}
{{- define "infergrid.selectorLabels" -}}
app.kubernetes.io/name: {{ include "infergrid.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Object names of the components. */}}
{{- define "infergrid.operator.fullname" -}}{{ include "infergrid.fullname" . }}-operator{{- end }}
{{- define "infergrid.scheduler.fullname" -}}{{ include "infergrid.fullname" . }}-scheduler{{- end }}
{{- define "infergrid.extender.fullname" -}}{{ include "infergrid.fullname" . }}-extender{{- end }}
{{- define "infergrid.devicePlugin.fullname" -}}{{ include "infergrid.fullname" . }}-device-plugin{{- end }}
{{- define "infergrid.gateway.fullname" -}}{{ include "infergrid.fullname" . }}-gateway{{- end }}
{{/* The gateway's metrics Service (a DNS label: cut to 63 for the longest base names). */}}
{{- define "infergrid.gateway.metricsService" -}}
{{- printf "%s-metrics" (include "infergrid.gateway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{/* Where the operator reads the gateway's infergrid_gateway_pending_requests. */}}
{{- define "infergrid.gateway.metricsUrl" -}}
http://{{ include "infergrid.gateway.metricsService" . }}.{{ .Release.Namespace }}.svc:{{ .Values.gateway.metricsPort }}/metrics
{{- end }}
{{/* namespace/name of the Secret of API keys; empty when none is named. */}}
{{- define "infergrid.gateway.apiKeysSecret" -}}
{{- with .Values.gateway.apiKeysSecret.name }}{{ default $.Release.Namespace $.Values.gateway.apiKeysSecret.namespace }}/{{ . }}{{ end }}
{{- end }}

{{/* ServiceAccount names: one per component. */}}
{{- define "infergrid.operator.serviceAccount" -}}
{{- default (include "infergrid.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- end }}
{{- define "infergrid.scheduler.serviceAccount" -}}
{{- default (include "infergrid.scheduler.fullname" .) .Values.scheduler.kubeScheduler.serviceAccount.name }}
{{- end }}
{{- define "infergrid.extender.serviceAccount" -}}
{{- default (include "infergrid.extender.fullname" .) .Values.scheduler.extender.serviceAccount.name }}
{{- end }}
{{- define "infergrid.devicePlugin.serviceAccount" -}}
{{- default (include "infergrid.devicePlugin.fullname" .) .Values.devicePlugin.serviceAccount.name }}
{{- end }}
{{- define "infergrid.gateway.serviceAccount" -}}
{{- default (include "infergrid.gateway.fullname" .) .Values.gateway.serviceAccount.name }}
{{- end }}

{{/* The user name a ServiceAccount's requests carry: (dict "root" $ "sa" "name"). */}}
{{- define "infergrid.saUser" -}}
system:serviceaccount:{{ .root.Release.Namespace }}:{{ .sa }}
{{- end }}

{{/* Where the extender writes the token it mints for kube-scheduler (an emptyDir). */}}
{{- define "infergrid.scheduler.tokenDir" -}}/var/run/infergrid/scheduler-token{{- end }}

{{/* Lease names of the two leader elections, in the release namespace. */}}
{{- define "infergrid.scheduler.lease" -}}{{ include "infergrid.scheduler.fullname" . }}{{- end }}
{{- define "infergrid.extender.lease" -}}{{ include "infergrid.extender.fullname" . }}{{- end }}

{{/*
An image reference: (dict "root" $ "image" .Values.operator.image).
registry/repository:tag, or @digest when a digest is given (a digest wins over
the tag). An empty tag means the chart's appVersion. With "external" true (an
upstream image) the InferGrid registry (.Values.image.registry) is not prefixed.
*/}}
{{- define "infergrid.image" -}}
{{- $registry := .image.registry -}}
{{- if not .external }}{{ $registry = default .root.Values.image.registry .image.registry }}{{ end -}}
{{- $repository := .image.repository -}}
{{- if $registry }}{{ $repository = printf "%s/%s" $registry $repository }}{{ end -}}
{{- if .image.digest -}}
{{ $repository }}@{{ .image.digest }}
{{- else -}}
{{ $repository }}:{{ default .root.Chart.AppVersion .image.tag }}
{{- end -}}
{{- end }}

{{- define "infergrid.pullPolicy" -}}
{{- default .root.Values.image.pullPolicy .image.pullPolicy }}
{{- end }}

{{/* The engine image the operator gives InferenceServices that name none. */}}
{{- define "infergrid.engineImage" -}}
{{- include "infergrid.image" (dict "root" . "image" .Values.operator.engineImage) }}
{{- end }}

{{- define "infergrid.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The container security context of InferGrid's own unprivileged processes. */}}
{{- define "infergrid.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The pod security context of the same. */}}
{{- define "infergrid.restrictedPod" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}
