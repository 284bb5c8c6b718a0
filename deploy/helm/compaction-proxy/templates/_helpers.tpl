{{/*
Chart name, truncated to the 63 characters a label value allows.
*/}}
{{- define "compaction-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name of this release's objects.
*/}}
{{- define "compaction-proxy.fullname" -}}
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

{{- define "compaction-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object. Call with (dict "root" $ "component" "gateway").
*/}}
{{- define "compaction-proxy.labels" -}}
helm.sh/chart: {{ include "compaction-proxy.chart" .root }}
{{ include "compaction-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/*
Selector labels. Call with (dict "root" $ "component" "gateway").
*/}}
{{- define "compaction-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "compaction-proxy.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "compaction-proxy.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "compaction-proxy.configMapName" -}}
{{- printf "%s-config" (include "compaction-proxy.fullname" .) }}
{{- end }}

{{- define "compaction-proxy.redisName" -}}
{{- printf "%s-redis" (include "compaction-proxy.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "compaction-proxy.tenantKeySecretName" -}}
{{- if .Values.tenantKey.existingSecret }}
{{- .Values.tenantKey.existingSecret }}
{{- else }}
{{- printf "%s-tenant-key" (include "compaction-proxy.fullname" .) }}
{{- end }}
{{- end }}

{{- define "compaction-proxy.tenantKeySecretKey" -}}
{{- if .Values.tenantKey.existingSecret }}
{{- .Values.tenantKey.existingSecretKey }}
{{- else -}}
tenant-key
{{- end }}
{{- end }}

{{/*
Checks of value combinations that the schema cannot express.
*/}}
{{- define "compaction-proxy.validate" -}}
{{- if not (or .Values.gateway.enabled .Values.sidecar.enabled) }}
{{- fail "compaction-proxy: enable gateway.enabled, sidecar.enabled, or both" }}
{{- end }}
{{- if and .Values.sidecar.enabled (not .Values.sidecar.agent.image) }}
{{- fail "compaction-proxy: sidecar.enabled needs sidecar.agent.image (your agent's image)" }}
{{- end }}
{{- if and .Values.redis.enabled (or .Values.redis.url .Values.redis.existingUrlSecret.name) }}
{{- fail "compaction-proxy: set either redis.enabled (bundled Redis) or redis.url / redis.existingUrlSecret (external Redis), not both" }}
{{- end }}
{{- if and .Values.redis.url .Values.redis.existingUrlSecret.name }}
{{- fail "compaction-proxy: set redis.url or redis.existingUrlSecret, not both" }}
{{- end }}
{{- if and (gt (int .Values.gateway.workers) 1) (not (include "compaction-proxy.sharedState" .)) }}
{{- fail "compaction-proxy: gateway.workers > 1 needs shared state (redis.enabled, redis.url or redis.existingUrlSecret): each worker would keep its own part of every conversation" }}
{{- end }}
{{- end }}

{{/*
The state URL env var of a gateway replica.
*/}}
{{- define "compaction-proxy.stateUrlEnv" -}}
- name: COMPACTION_PROXY_STATE_URL
{{- if .Values.redis.existingUrlSecret.name }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingUrlSecret.name }}
      key: {{ .Values.redis.existingUrlSecret.key }}
{{- else if .Values.redis.url }}
  value: {{ .Values.redis.url | quote }}
{{- else if .Values.redis.enabled }}
  value: {{ printf "redis://%s:6379/0" (include "compaction-proxy.redisName" .) | quote }}
{{- else }}
  value: "memory://"
{{- end }}
{{- end }}

{{/*
Whether the gateway's state is shared (a Redis, bundled or external): only then may a pod run several workers.
*/}}
{{- define "compaction-proxy.sharedState" -}}
{{- if or .Values.redis.enabled .Values.redis.url .Values.redis.existingUrlSecret.name }}true{{ end }}
{{- end }}

{{/*
Proxy processes per gateway pod (--workers): gateway.workers, or when 0 one per whole core of the CPU limit
("2" -> 2, "1500m" -> 1, "500m" or none -> 1); always 1 without shared state.
*/}}
{{- define "compaction-proxy.workers" -}}
{{- $gateway := .Values.gateway -}}
{{- if not (include "compaction-proxy.sharedState" .) -}}
1
{{- else if $gateway.workers -}}
{{- $gateway.workers -}}
{{- else -}}
{{- $cpu := toString (dig "limits" "cpu" "1" ($gateway.resources | default dict)) -}}
{{- $cores := 1 -}}
{{- if hasSuffix "m" $cpu -}}
{{- $cores = div (atoi (trimSuffix "m" $cpu)) 1000 -}}
{{- else -}}
{{- $cores = floor (float64 $cpu) | int -}}
{{- end -}}
{{- max 1 $cores -}}
{{- end -}}
{{- end }}

{{/*
The proxy container, for a gateway pod or as a sidecar in any pod.

  {{- include "compaction-proxy.container" (dict "root" $ "sidecar" true) | nindent 8 }}

As a sidecar it keeps in-memory state and, with sidecar.native, gets restartPolicy: Always (place it
under initContainers) and a startup probe, so that the agent starts only once the proxy is ready.
The pod must have the volumes of "compaction-proxy.volumes".
*/}}
{{- define "compaction-proxy.container" -}}
{{- $root := .root -}}
{{- $values := $root.Values -}}
- name: compaction-proxy
  image: {{ include "compaction-proxy.image" $root | quote }}
  imagePullPolicy: {{ $values.image.pullPolicy }}
  {{- if and .sidecar $values.sidecar.native }}
  restartPolicy: Always
  {{- end }}
  ports:
    - name: http
      containerPort: 8080
      protocol: TCP
  env:
    - name: COMPACTION_PROXY_UPSTREAM
      value: {{ $values.upstream | quote }}
    {{- with $values.anthropicUpstream }}
    - name: COMPACTION_PROXY_ANTHROPIC_UPSTREAM
      value: {{ . | quote }}
    {{- end }}
    - name: COMPACTION_PROXY_PORT
      value: "8080"
    - name: COMPACTION_PROXY_MODE
      value: {{ $values.mode | quote }}
    {{- if .sidecar }}
    - name: COMPACTION_PROXY_STATE_URL
      value: "memory://"
    {{- else }}
    {{- include "compaction-proxy.stateUrlEnv" $root | nindent 4 }}
    - name: COMPACTION_PROXY_WORKERS
      value: {{ include "compaction-proxy.workers" $root | quote }}
    {{- end }}
    - name: COMPACTION_PROXY_TENANT_KEY
      valueFrom:
        secretKeyRef:
          name: {{ include "compaction-proxy.tenantKeySecretName" $root }}
          key: {{ include "compaction-proxy.tenantKeySecretKey" $root }}
    - name: COMPACTION_PROXY_CONFIG
      value: /etc/compaction-proxy/config.yaml
    - name: COMPACTION_PROXY_SHUTDOWN_GRACE_SECONDS
      value: {{ $values.shutdownGraceSeconds | quote }}
    - name: COMPACTION_PROXY_LOG_LEVEL
      value: {{ $values.logLevel | quote }}
    {{- with $values.otelEndpoint }}
    - name: COMPACTION_PROXY_OTEL_ENDPOINT
      value: {{ . | quote }}
    {{- end }}
    {{- with $values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if not .sidecar }}
  lifecycle:
    preStop:
      exec:
        command: ["sleep", {{ $values.gateway.preStopSleepSeconds | quote }}]
  {{- end }}
  {{- if .sidecar }}
  startupProbe:
    httpGet:
      path: /readyz
      port: http
    {{- toYaml $values.probes.startup | nindent 4 }}
  {{- end }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: http
    {{- toYaml $values.probes.readiness | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: http
    {{- toYaml $values.probes.liveness | nindent 4 }}
  resources:
    {{- if .sidecar }}
    {{- toYaml $values.sidecar.resources | nindent 4 }}
    {{- else }}
    {{- toYaml $values.gateway.resources | nindent 4 }}
    {{- end }}
  securityContext:
    {{- toYaml $values.securityContext | nindent 4 }}
  volumeMounts:
    - name: compaction-proxy-config
      mountPath: /etc/compaction-proxy
      readOnly: true
    - name: compaction-proxy-tmp
      mountPath: /tmp
{{- end }}

{{/*
The volumes the proxy container mounts.
*/}}
{{- define "compaction-proxy.volumes" -}}
- name: compaction-proxy-config
  configMap:
    name: {{ include "compaction-proxy.configMapName" . }}
- name: compaction-proxy-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}
