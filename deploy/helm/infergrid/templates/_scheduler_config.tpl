{{/*
The infergrid-scheduler's KubeSchedulerConfiguration: the same settings as the
local cluster's (e2e/cluster/components.py), with leader election on a Lease in
the release namespace and the extender on localhost.
*/}}
{{- define "infergrid.scheduler.config" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceLock: leases
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: {{ include "infergrid.scheduler.lease" . }}
  leaseDuration: {{ .Values.scheduler.kubeScheduler.leaderElection.leaseDuration }}
  renewDeadline: {{ .Values.scheduler.kubeScheduler.leaderElection.renewDeadline }}
  retryPeriod: {{ .Values.scheduler.kubeScheduler.leaderElection.retryPeriod }}
percentageOfNodesToScore: {{ .Values.scheduler.kubeScheduler.percentageOfNodesToScore }}
profiles:
  # The extender's score decides for InferGrid pods: the score plugins with a placement
  # policy of their own are off, and so is the default spreading of a Deployment's replicas.
  - schedulerName: {{ .Values.schedulerName }}
    plugins:
      score:
        disabled:
          - name: NodeResourcesFit
          - name: NodeResourcesBalancedAllocation
    pluginConfig:
      - name: PodTopologySpread
        args:
          defaultingType: List
          defaultConstraints: []
extenders:
  - urlPrefix: http://127.0.0.1:{{ .Values.scheduler.extender.port }}
    filterVerb: filter
    prioritizeVerb: prioritize
    preemptVerb: preempt
    bindVerb: bind
    weight: 1
    nodeCacheCapable: true
    enableHTTPS: false
    httpTimeout: {{ .Values.scheduler.extender.httpTimeout }}
    ignorable: false
    managedResources:
      {{- range .Values.scheduler.managedResources }}
      - name: {{ .name }}
        ignoredByScheduler: {{ .ignoredByScheduler }}
      {{- end }}
{{- end }}

{{/* The extender's settings (scheduler_extender/config.py). */}}
{{- define "infergrid.extender.config" -}}
version: v1
# The verbs answer on loopback only: kube-scheduler calls them from inside the pod.
host: 127.0.0.1
port: {{ .Values.scheduler.extender.port }}
{{- if .Values.scheduler.extender.exposeMetrics }}
metricsAddress: 0.0.0.0
metricsPort: {{ .Values.scheduler.extender.metricsPort }}
{{- end }}
schedulerTokenDir: {{ include "infergrid.scheduler.tokenDir" . }}
schedulerServiceAccount: {{ include "infergrid.scheduler.serviceAccount" . }}
defaultPolicy: {{ .Values.scheduler.extender.defaultPolicy }}
staleAfterSeconds: {{ .Values.scheduler.extender.staleAfterSeconds }}
resyncSeconds: {{ .Values.scheduler.extender.resyncSeconds }}
bindWaitSeconds: {{ .Values.scheduler.extender.bindWaitSeconds }}
tentativeReservationSeconds: {{ .Values.scheduler.extender.tentativeReservationSeconds }}
preemptionHoldSeconds: {{ .Values.scheduler.extender.preemptionHoldSeconds }}
preemptibleClasses: {{ prepend .Values.scheduler.extender.preemptibleClasses .Values.priorityClasses.offline.name | uniq | toJson }}
preemptPodsWithoutClass: {{ .Values.scheduler.extender.preemptPodsWithoutClass }}
leaderElection: true
leaseNamespace: {{ .Release.Namespace }}
leaseName: {{ include "infergrid.extender.lease" . }}
{{- end }}
