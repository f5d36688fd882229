{{/* Name of the pod grouper's objects (Deployment, ServiceAccount, ClusterRole/Binding). */}}
{{- define "kai-scheduler.podgrouperName" -}}
{{- printf "%s-podgrouper" (include "kai-scheduler.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kai-scheduler.podgrouperSelectorLabels" -}}
app.kubernetes.io/name: kai-scheduler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: podgrouper
{{- end -}}
