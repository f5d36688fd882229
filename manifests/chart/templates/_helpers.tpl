{{/* Name of the release's objects: the release name if it already says kai-scheduler. */}}
{{- define "kai-scheduler.fullname" -}}
{{- if contains "kai-scheduler" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-kai-scheduler" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kai-scheduler.serviceAccountName" -}}
{{- default (include "kai-scheduler.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "kai-scheduler.labels" -}}
app.kubernetes.io/name: kai-scheduler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kai-scheduler.selectorLabels" -}}
app.kubernetes.io/name: kai-scheduler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{/* "true" or "false": leader election, "auto" meaning on when replicas > 1. */}}
{{- define "kai-scheduler.leaderElect" -}}
{{- $le := toString .Values.leaderElection.enabled -}}
{{- if eq $le "auto" -}}
{{- gt (int .Values.replicas) 1 -}}
{{- else if or (eq $le "true") (eq $le "false") -}}
{{- if and (eq $le "false") (gt (int .Values.replicas) 1) -}}
{{- fail "leaderElection.enabled=false with replicas > 1 would run several active schedulers; set leaderElection.enabled to auto or true, or replicas to 1" -}}
{{- end -}}
{{- $le -}}
{{- else -}}
{{- fail (printf "leaderElection.enabled is %q; use auto, true or false" $le) -}}
{{- end -}}
{{- end -}}

{{- define "kai-scheduler.placement" -}}
{{- $default := .Values.placementStrategy -}}
gpu: {{ default $default .Values.placement.gpu }}
cpu: {{ default $default .Values.placement.cpu }}
scoring: {{ default "packing" .Values.placement.scoring }}
{{- if .Values.placement.holdStrandingShares }}
holdStrandingShares: true
{{- end }}
{{- with .Values.placement.holdStrandingMaxWait }}
holdStrandingMaxWait: {{ . | quote }}
{{- end }}
{{- if ne (toString .Values.placement.sharePriceWeight) "" }}
sharePriceWeight: {{ .Values.placement.sharePriceWeight }}
{{- end }}
{{- end -}}
