{{/*
The node pools (values nodePools): which GPU nodes run the device plugin and which the DRA
driver. A pool is the GPU nodes (devicePlugin.gpuNodeSelectorTerms, ORed) that carry every
label of its nodeSelector. A node is in one mode only: the device plugin's terms exclude
every dra pool (NOT of an AND of labels is an OR of NotIns, so each term is split per label).
*/}}
{{- define "infergrid.nodePools.of" -}}
{{- $pools := list }}
{{- range .root.Values.nodePools }}{{ if eq .mode $.mode }}{{ $pools = append $pools . }}{{ end }}{{ end }}
{{- toJson $pools }}
{{- end }}

{{- /* Whether any pool is in mode: (dict "root" $ "mode" "dra"). */ -}}
{{- define "infergrid.nodePools.any" -}}
{{- if include "infergrid.nodePools.of" . | fromJsonArray }}true{{ end }}
{{- end }}

{{- /* The nodeSelectorTerms of mode's DaemonSet: (dict "root" $ "mode" "devicePlugin"). */ -}}
{{- define "infergrid.nodePools.terms" -}}
{{- $terms := list }}
{{- range $gpu := .root.Values.devicePlugin.gpuNodeSelectorTerms }}
{{- range $pool := include "infergrid.nodePools.of" $ | fromJsonArray }}
{{- $exprs := $gpu.matchExpressions | default list }}
{{- range $key := keys $pool.nodeSelector | sortAlpha }}
{{- $exprs = append $exprs (dict "key" $key "operator" "In" "values" (list (get $pool.nodeSelector $key))) }}
{{- end }}
{{- $terms = append $terms (merge (dict "matchExpressions" $exprs) (omit $gpu "matchExpressions")) }}
{{- end }}
{{- end }}
{{- if eq .mode "devicePlugin" }}
{{- range $dra := include "infergrid.nodePools.of" (dict "root" .root "mode" "dra") | fromJsonArray }}
{{- $split := list }}
{{- range $term := $terms }}
{{- range $key := keys $dra.nodeSelector | sortAlpha }}
{{- $not := dict "key" $key "operator" "NotIn" "values" (list (get $dra.nodeSelector $key)) }}
{{- $split = append $split (merge (dict "matchExpressions" (append $term.matchExpressions $not)) (omit $term "matchExpressions")) }}
{{- end }}
{{- end }}
{{- $terms = $split }}
{{- end }}
{{- end }}
{{- toYaml $terms }}
{{- end }}
