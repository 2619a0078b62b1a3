{{/* Names and labels. */}}
{{- define "s3-gateway.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "s3-gateway.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "s3-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "s3-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "s3-gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "s3-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "s3-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "s3-gateway.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "s3-gateway.clientSecretName" -}}
{{- default (printf "%s-client" (include "s3-gateway.fullname" .)) .Values.clientCredentials.existingSecret -}}
{{- end -}}

{{- define "s3-gateway.adminSecretName" -}}
{{- default (printf "%s-admin" (include "s3-gateway.fullname" .)) .Values.admin.token.existingSecret -}}
{{- end -}}

{{- define "s3-gateway.peerSecretName" -}}
{{- default (printf "%s-fleet" (include "s3-gateway.fullname" .)) .Values.fleet.secret.existingSecret -}}
{{- end -}}

{{- define "s3-gateway.peerServiceName" -}}
{{- printf "%s-peers" (include "s3-gateway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "s3-gateway.hasAdminToken" -}}
{{- if or .Values.admin.token.create .Values.admin.token.existingSecret -}}true{{- end -}}
{{- end -}}

{{/*
The grace period the kubelet gives the pod: the preStop drain, then the gateway's own
drain after SIGTERM, then a margin. A smaller explicit value is refused: the kubelet would
kill the gateway in the middle of its drain.
*/}}
{{- define "s3-gateway.minGraceSeconds" -}}
{{- $drain := ternary (int .Values.drain.timeoutSeconds) 0 .Values.drain.enabled -}}
{{- add $drain (int .Values.gateway.shutdownDrainTimeoutSeconds) -}}
{{- end -}}

{{- define "s3-gateway.graceSeconds" -}}
{{- $min := int (include "s3-gateway.minGraceSeconds" .) -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- add $min 30 -}}
{{- else if le (int .Values.terminationGracePeriodSeconds) $min -}}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed drain.timeoutSeconds + gateway.shutdownDrainTimeoutSeconds (%d): the kubelet would kill the gateway mid-drain" (int .Values.terminationGracePeriodSeconds) $min) -}}
{{- else -}}
{{- int .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/* Refuse values that would deploy a gateway that loses data or cannot start. */}}
{{- define "s3-gateway.validate" -}}
{{- if not .Values.upstream.endpoint -}}
{{- fail "upstream.endpoint is required (e.g. https://s3.us-east-1.amazonaws.com): without it the gateway runs its in-memory demo upstream" -}}
{{- end -}}
{{- if and (not .Values.clientCredentials.existingSecret) (or (not .Values.clientCredentials.accessKey) (not .Values.clientCredentials.secretKey)) -}}
{{- fail "client credentials: set clientCredentials.existingSecret, or both clientCredentials.accessKey and clientCredentials.secretKey" -}}
{{- end -}}
{{- if not (has .Values.data.type (list "hostPath" "ephemeral")) -}}
{{- fail (printf "data.type must be hostPath or ephemeral, got %q" .Values.data.type) -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) -}}
{{- fail "serviceMonitor.enabled needs service.enabled (the ServiceMonitor selects the Service)" -}}
{{- end -}}
{{- if not (include "s3-gateway.hasAdminToken" .) -}}
{{- fail "admin.token: set create: true or an existingSecret: the admin API binds the pod IP (for the kubelet's probes), and the gateway refuses to start there without a bearer token" -}}
{{- end -}}
{{- if not (has .Values.gateway.durability (list "fsync" "none")) -}}
{{- fail (printf "gateway.durability must be fsync or none, got %q" .Values.gateway.durability) -}}
{{- end -}}
{{- end -}}

{{/*
The init container NOTES.txt prints for training pods (values.yaml, restore): picks the
newest complete checkpoint under restore.prefix and prefetches it into this node's cache.
Exit status: 0 when done, refused (too big: the trainer reads on demand) or nothing to
restore; 1 when the gateway cannot be reached (the kubelet retries).
*/}}
{{- define "s3-gateway.prefetchInitContainer" -}}
- name: prefetch-checkpoint
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  command: ["/bin/sh", "-c"]
  args:
    - |
      latest=$(gateway latest --bucket "$RESTORE_BUCKET" --prefix "$RESTORE_PREFIX" $RESTORE_FLAGS)
      rc=$?
      if [ "$rc" -eq 4 ]; then echo "no checkpoint under s3://$RESTORE_BUCKET/$RESTORE_PREFIX"; exit 0; fi
      if [ "$rc" -ne 0 ]; then exit "$rc"; fi
      echo "prefetching s3://$RESTORE_BUCKET/$latest"
      gateway prefetch --bucket "$RESTORE_BUCKET" --prefix "$latest" --wait --timeout "$RESTORE_TIMEOUT" --progress plain
      rc=$?
      if [ "$rc" -eq 1 ]; then exit 1; fi
      exit 0
  env:
    - name: GATEWAY_ADMIN
      value: "http://{{ include "s3-gateway.fullname" . }}.{{ .Release.Namespace }}.svc:{{ .Values.admin.port }}"
    {{- if include "s3-gateway.hasAdminToken" . }}
    - name: GATEWAY_ADMIN_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ include "s3-gateway.adminSecretName" . }}
          key: {{ .Values.admin.token.key }}
    {{- end }}
    - name: RESTORE_BUCKET
      value: {{ .Values.restore.bucket | quote }}
    - name: RESTORE_PREFIX
      value: {{ .Values.restore.prefix | quote }}
    - name: RESTORE_FLAGS
      value: {{ ternary "--durable" "" .Values.restore.durableOnly | quote }}
    - name: RESTORE_TIMEOUT
      value: {{ .Values.restore.timeoutSeconds | quote }}
{{- end -}}
