{{/*
Checks that need more than one value, which values.schema.json cannot express.
Each failure names the keys at fault.
*/}}
{{- define "infergrid.validate" -}}
{{- $dp := .Values.devicePlugin }}
{{- $ext := .Values.scheduler.extender }}
{{- if and $dp.enabled .Values.scheduler.enabled (le (float64 $ext.staleAfterSeconds) (float64 $dp.config.usageIntervalSeconds)) }}
{{- fail (printf "scheduler.extender.staleAfterSeconds (%v) must exceed devicePlugin.config.usageIntervalSeconds (%v): every node's heartbeat would look stale" $ext.staleAfterSeconds $dp.config.usageIntervalSeconds) }}
{{- end }}
{{- if and .Values.scheduler.enabled (eq (int $ext.port) (int .Values.scheduler.kubeScheduler.securePort)) }}
{{- fail (printf "scheduler.extender.port and scheduler.kubeScheduler.securePort are both %v: the two containers share the pod's network" $ext.port) }}
{{- end }}
{{- if and .Values.scheduler.enabled $ext.exposeMetrics (has (int $ext.metricsPort) (list (int $ext.port) (int .Values.scheduler.kubeScheduler.securePort))) }}
{{- fail (printf "scheduler.extender.metricsPort (%v) must differ from scheduler.extender.port and scheduler.kubeScheduler.securePort: the containers share the pod's network" $ext.metricsPort) }}
{{- end }}
{{- if and .Values.gateway.enabled (not .Values.gateway.apiKeysSecret.name) (not .Values.gateway.allowAnonymous) }}
{{- fail "gateway.apiKeysSecret.name is empty: name the Secret of API keys (deploy/samples/gateway/api-keys.yaml), or set gateway.allowAnonymous=true to let anyone who reaches the gateway call every model it serves" }}
{{- end }}
{{- if and .Values.gateway.enabled .Values.gateway.apiKeysSecret.name .Values.gateway.allowAnonymous }}
{{- fail (printf "gateway.allowAnonymous=true contradicts gateway.apiKeysSecret.name=%s: a gateway with keys has no anonymous callers; set gateway.apiKeysSecret.name=\"\" as well to serve without keys" .Values.gateway.apiKeysSecret.name) }}
{{- end }}
{{- if and .Values.gateway.enabled (eq (int .Values.gateway.metricsPort) 8080) }}
{{- fail "gateway.metricsPort (8080) must differ from the gateway's API port, 8080" }}
{{- end }}
{{- $selectors := dict }}
{{- $poolNames := dict }}
{{- range .Values.nodePools }}
{{- if hasKey $poolNames .name }}
{{- fail (printf "nodePools: the name %s is used twice" .name) }}
{{- end }}
{{- $_ := set $poolNames .name true }}
{{- if and (eq .mode "dra") (not .nodeSelector) }}
{{- fail (printf "nodePools %s: a dra pool needs a nodeSelector: {} would take every GPU node from the device plugin" .name) }}
{{- end }}
{{- $key := toJson .nodeSelector }}
{{- if hasKey $selectors $key }}
{{- fail (printf "nodePools %s: its nodeSelector is the same as pool %s's; a node must be in one pool, in one mode" .name (get $selectors $key)) }}
{{- end }}
{{- $_ := set $selectors $key .name }}
{{- end }}
{{- $ignored := list }}
{{- range .Values.scheduler.managedResources }}{{ if .ignoredByScheduler }}{{ $ignored = append $ignored .name }}{{ end }}{{ end }}
{{- if and .Values.scheduler.enabled (not (has "infergrid.io/gpu-memory" $ignored)) }}
{{- fail "scheduler.managedResources: infergrid.io/gpu-memory must be listed with ignoredByScheduler: true (no node advertises it)" }}
{{- end }}
{{- if and .Values.scheduler.enabled (not (has "infergrid.io/gpu-cores" $ignored)) }}
{{- fail "scheduler.managedResources: infergrid.io/gpu-cores must be listed with ignoredByScheduler: true (no node advertises it)" }}
{{- end }}
{{- end }}
