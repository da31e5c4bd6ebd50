{{/* Labels every object carries: the ones the Kustomize base sets, plus Helm's own. */}}
{{- define "duo.labels" -}}
app.kubernetes.io/part-of: duo-chat
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "duo.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* Every pod runs as the image's unprivileged user. */}}
{{- define "duo.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Every container: no privileges, read-only root filesystem. */}}
{{- define "duo.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* A ConfigMap or Secret data map, every value a string. */}}
{{- define "duo.stringMap" -}}
{{- range $key, $value := . }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/* Pod annotations that roll pods when their configuration changes. */}}
{{- define "duo.configChecksum" -}}
checksum/config: {{ toJson .config | sha256sum }}
checksum/secret: {{ toJson .secret | sha256sum }}
{{- end }}

{{/* With tracing on, a Duo container also reads the duo-tracing ConfigMap (last). */}}
{{- define "duo.tracingEnvFrom" -}}
{{- if .Values.tracing.enabled }}
- configMapRef:
    name: duo-tracing
{{- end }}
{{- end }}

{{/* The duo-tracing ConfigMap's data. */}}
{{- define "duo.tracingData" -}}
{{- $data := dict "OTEL_EXPORTER_OTLP_ENDPOINT" (.Values.tracing.endpoint | default "http://duo-trace-collector:4318") }}
{{- toJson (merge $data .Values.tracing.config) }}
{{- end }}

{{/* Rolls a pod when the tracing settings change. */}}
{{- define "duo.tracingChecksum" -}}
{{- if .Values.tracing.enabled }}
checksum/tracing: {{ include "duo.tracingData" . | sha256sum }}
{{- end }}
{{- end }}
