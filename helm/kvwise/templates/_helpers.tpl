{{/*
Names, labels, images, secrets and the Redis connection shared by every template.
*/}}

{{/* Chart name, overridable. */}}
{{- define "kvwise.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name, at most 63 characters (DNS label). A release whose name already
contains the chart name is not repeated.
*/}}
{{- define "kvwise.fullname" -}}
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

{{/*
Name of one component's resources: <fullname>-<component>, at most "max" characters: 63 (a
DNS label, as a Service name is) unless given; a StatefulSet's takes 52, since its pods'
controller-revision-hash label adds a hash to it. The fullname part is cut to 52 at most,
so a name that fits is left as it was. Takes (dict "ctx" . "component" name ["max" n]).
*/}}
{{- define "kvwise.componentName" -}}
{{- $room := min 52 (sub (default 63 .max) (add1 (len .component))) }}
{{- printf "%s-%s" (include "kvwise.fullname" .ctx | trunc (int $room) | trimSuffix "-") .component }}
{{- end }}

{{/* Chart name and version for the helm.sh/chart label. */}}
{{- define "kvwise.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades, so never the version. Takes (dict "ctx" . "component" name). */}}
{{- define "kvwise.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvwise.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Every resource's labels. Takes (dict "ctx" . "component" name). */}}
{{- define "kvwise.labels" -}}
helm.sh/chart: {{ include "kvwise.chart" .ctx }}
{{ include "kvwise.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: kvwise
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* metadata.annotations of every resource, with extra ones. Takes (dict "ctx" . "extra" map). */}}
{{- define "kvwise.annotations" -}}
{{- $all := merge (deepCopy (default dict .extra)) (deepCopy .ctx.Values.commonAnnotations) }}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest. Takes (dict "image" map "default" tag). */}}
{{- define "kvwise.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (toString (default .default .image.tag)) }}
{{- end }}
{{- end }}

{{/* The controller's image, also the workers' plugin bundle. None is published. */}}
{{- define "kvwise.controller.image" -}}
{{- if not .Values.controller.image.repository }}
{{- fail "controller.image.repository is not set: no kvwise image is published; build helm/Dockerfile, push it and set controller.image.repository (see docs/deploy.md)" }}
{{- end }}
{{- include "kvwise.image" (dict "image" .Values.controller.image "default" .Chart.AppVersion) }}
{{- end }}

{{- define "kvwise.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "kvwise.componentName" (dict "ctx" . "component" "controller")) .Values.controller.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvwise.workers.serviceAccountName" -}}
{{- if .Values.workers.serviceAccount.create }}
{{- default (include "kvwise.componentName" (dict "ctx" . "component" "worker")) .Values.workers.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.workers.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
A secret value that survives upgrades: the given value, else the one already in the
cluster (lookup; empty during `helm template`), else 32 random letters and digits.
Takes (dict "ctx" . "name" secretName "key" key "value" explicit).
*/}}
{{- define "kvwise.secretValue" -}}
{{- if .value }}
{{- .value }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .name | default dict }}
{{- $old := dig "data" .key "" $existing }}
{{- if $old }}
{{- $old | b64dec }}
{{- else }}
{{- randAlphaNum 32 }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret holding the API token, and its key. */}}
{{- define "kvwise.controller.tokenSecretName" -}}
{{- default (include "kvwise.componentName" (dict "ctx" . "component" "api-token")) .Values.controller.auth.existingSecret }}
{{- end }}

{{/*
A checksum of the credential values given to the chart, for a pod annotation: a changed
Secret reaches no running pod, so a changed token or password must roll the pods that read
it (generated ones are kept on upgrade and roll nothing). Takes the values to hash.
*/}}
{{- define "kvwise.credentialsChecksum" -}}
{{- toJson . | sha256sum }}
{{- end }}

{{/* The Secret holding the in-chart Redis password. */}}
{{- define "kvwise.redis.secretName" -}}
{{- default (include "kvwise.componentName" (dict "ctx" . "component" "redis")) .Values.redis.auth.existingSecret }}
{{- end }}

{{/* Host of the in-chart Redis Service, fully qualified so pods in any namespace resolve it. */}}
{{- define "kvwise.redis.host" -}}
{{- printf "%s.%s.svc.%s" (include "kvwise.componentName" (dict "ctx" . "component" "redis")) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/* Mount path of the external Redis TLS files. */}}
{{- define "kvwise.redis.tlsDir" -}}
/etc/kvwise/redis-tls
{{- end }}

{{/*
KVWISE_REDIS_URL. The settings take one URL, so credentials go into its userinfo through
Kubernetes' $(VAR) expansion of REDIS_USERNAME / REDIS_PASSWORD (defined just before it
by kvwise.redis.env); the password itself never appears in a rendered manifest. TLS files
become redis-py URL options (ssl_ca_certs, ssl_certfile, ssl_keyfile).
*/}}
{{- define "kvwise.redis.url" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://:$(REDIS_PASSWORD)@%s:%d/%d" (include "kvwise.redis.host" .) (int .Values.redis.service.port) (int .Values.redis.database) }}
{{- else }}
{{- $ext := .Values.redis.external }}
{{- $u := urlParse $ext.url }}
{{- $auth := "" }}
{{- if and $ext.existingSecret $ext.existingSecretUsernameKey }}
{{- $auth = "$(REDIS_USERNAME):$(REDIS_PASSWORD)@" }}
{{- else if $ext.existingSecret }}
{{- $auth = ":$(REDIS_PASSWORD)@" }}
{{- end }}
{{- $query := list }}
{{- with $u.query }}
{{- $query = append $query . }}
{{- end }}
{{- with $ext.tls.existingSecret }}
{{- $dir := include "kvwise.redis.tlsDir" $ }}
{{- if $ext.tls.caKey }}
{{- $query = append $query (printf "ssl_ca_certs=%s/%s" $dir $ext.tls.caKey) }}
{{- end }}
{{- if $ext.tls.certKey }}
{{- $query = append $query (printf "ssl_certfile=%s/%s" $dir $ext.tls.certKey) }}
{{- end }}
{{- if $ext.tls.keyKey }}
{{- $query = append $query (printf "ssl_keyfile=%s/%s" $dir $ext.tls.keyKey) }}
{{- end }}
{{- end }}
{{- printf "%s://%s%s%s" $u.scheme $auth $u.host $u.path }}
{{- with $query }}?{{ join "&" . }}{{ end }}
{{- end }}
{{- end }}

{{/* Redis credentials and URL as container env entries (controller and workers). */}}
{{- define "kvwise.redis.env" -}}
{{- if .Values.redis.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "kvwise.redis.secretName" . }}
      key: {{ .Values.redis.auth.existingSecretPasswordKey }}
{{- else }}
{{- with .Values.redis.external }}
{{- if and .existingSecret .existingSecretUsernameKey }}
- name: REDIS_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .existingSecretUsernameKey }}
{{- end }}
{{- if .existingSecret }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .existingSecretPasswordKey }}
{{- end }}
{{- end }}
{{- end }}
- name: KVWISE_REDIS_URL
  value: {{ include "kvwise.redis.url" . | quote }}
- name: KVWISE_REDIS_CLUSTER
  value: {{ and (not .Values.redis.enabled) .Values.redis.external.cluster | quote }}
{{- end }}

{{/* The read-only TLS volume of an external Redis, if any. */}}
{{- define "kvwise.redis.tlsVolume" -}}
{{- if and (not .Values.redis.enabled) .Values.redis.external.tls.existingSecret }}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.external.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "kvwise.redis.tlsVolumeMount" -}}
{{- if and (not .Values.redis.enabled) .Values.redis.external.tls.existingSecret }}
- name: redis-tls
  mountPath: {{ include "kvwise.redis.tlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
A settings value as an environment string: whole numbers without a decimal point or an
exponent (Helm holds every number as a float64 and would print 1000000 as "1e+06", which
an int setting rejects), other values as they are.
*/}}
{{- define "kvwise.envValue" -}}
{{- if kindIs "float64" . }}
{{- if eq (floor .) . }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "bool" . }}
{{- if . }}1{{ else }}0{{ end }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/*
Settings map -> KVWISE_* env names and values. Helm drops a key set to null from the merged
values, so the map holds no null: a key named in "nullable" that is missing was set to null
and becomes "none" (the setting's own null, e.g. lifeSOverride: per category). The schema
requires every other key, so a null for one of them is refused at install.
Takes (dict "values" map "nullable" list-of-keys).
*/}}
{{- define "kvwise.settingsData" -}}
{{- range $key, $value := .values }}
{{ printf "KVWISE_%s" ($key | snakecase | upper) }}: {{ include "kvwise.envValue" $value | quote }}
{{- end }}
{{- range $key := .nullable }}
{{- if not (hasKey $.values $key) }}
{{ printf "KVWISE_%s" ($key | snakecase | upper) }}: "none"
{{- end }}
{{- end }}
{{- end }}

{{/* Milliseconds of a one-unit duration the schema took (90s, 1m, 500ms, 1h). */}}
{{- define "kvwise.durationMs" -}}
{{- $unit := regexReplaceAll "^[0-9]+" . "" }}
{{- mul (regexFind "^[0-9]+" . | int64) (get (dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000) $unit) }}
{{- end }}

{{/* Checks of combinations the schema cannot express, each with a message that says what to set. */}}
{{- define "kvwise.validate" -}}
{{- include "kvwise.validate.redis" . }}
{{- include "kvwise.validate.tlsReadable" . }}
{{- include "kvwise.validate.controller" . }}
{{- include "kvwise.validate.auth" . }}
{{- include "kvwise.validate.workers" . }}
{{- end }}

{{/* The Redis the pods meet in: the in-chart one's password, an external one's URL and TLS. */}}
{{- define "kvwise.validate.redis" -}}
{{- if and .Values.redis.auth.password (not (regexMatch "^[A-Za-z0-9._~-]+$" .Values.redis.auth.password)) }}
{{- fail "redis.auth.password may hold only letters, digits and -._~ (it is placed in a Redis URL)" }}
{{- end }}
{{- /* A memory limit alone turns a stream backlog into an OOM kill (and a restart loop once
the append-only file no longer loads within it); with --maxmemory Redis refuses writes.
The Redis forks for its snapshots and AOF rewrites, whose copy-on-write pages count against
the same limit: maxmemory about half of it. */}}
{{- $memoryLimit := dig "limits" "memory" "" (default dict .Values.redis.resources) }}
{{- if and .Values.redis.enabled (ne (toString $memoryLimit) "") }}
{{- $capped := false }}
{{- range .Values.redis.extraArgs }}
{{- if regexMatch "^--maxmemory(\\s|$)" . }}{{ $capped = true }}{{ end }}
{{- end }}
{{- if not $capped }}
{{- fail (printf "redis.resources.limits.memory (%v) needs --maxmemory in redis.extraArgs, about half the limit (e.g. [\"--maxmemory\", \"1gb\"] for 2Gi; its snapshot and append-only-file rewrites fork, and the pages they copy count against the same limit): without it a backlog gets Redis OOM-killed instead of refusing writes (docs/deploy.md, Sizing)" $memoryLimit) }}
{{- end }}
{{- end }}
{{- if not .Values.redis.enabled }}
{{- $ext := .Values.redis.external }}
{{- if not $ext.url }}
{{- fail "redis.enabled=false needs redis.external.url (redis://host:6379/0 or rediss://host:6380/0)" }}
{{- end }}
{{- $u := urlParse $ext.url }}
{{- if not (has $u.scheme (list "redis" "rediss")) }}
{{- fail (printf "redis.external.url must start with redis:// or rediss://, got %q" $ext.url) }}
{{- end }}
{{- if $u.userinfo }}
{{- fail "redis.external.url must not contain credentials: put them in the Secret named by redis.external.existingSecret" }}
{{- end }}
{{- if and $ext.tls.existingSecret (ne $u.scheme "rediss") }}
{{- fail "redis.external.tls.existingSecret is set but redis.external.url is not rediss://" }}
{{- end }}
{{- if and $ext.existingSecretUsernameKey (not $ext.existingSecret) }}
{{- fail "redis.external.existingSecretUsernameKey needs redis.external.existingSecret" }}
{{- end }}
{{- if ne (int .Values.redis.database) 0 }}
{{- fail (printf "redis.database (%d) is the in-chart Redis's: put an external one's in redis.external.url (redis://host:6379/%d)" (int .Values.redis.database) (int .Values.redis.database)) }}
{{- end }}
{{- if and $ext.cluster (not (has $u.path (list "" "/" "/0"))) }}
{{- fail (printf "redis.external.cluster=true takes database 0 only (a Redis Cluster has no other): got %s" $ext.url) }}
{{- end }}
{{- if ne (empty $ext.tls.certKey) (empty $ext.tls.keyKey) }}
{{- fail "redis.external.tls.certKey and redis.external.tls.keyKey go together (mutual TLS)" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The controller's settings and what serves it: bounds, metrics, disruption budget. */}}
{{- define "kvwise.validate.controller" -}}
{{- $config := .Values.controller.config }}
{{- /* The pairs the controller checks at start (it would crash-loop on them). */}}
{{- range $pair := list (list "rateMin" "rateMax") (list "lifeMinS" "lifeMaxS") (list "maxCategoriesPerWorker" "maxCategories") }}
{{- $low := index $pair 0 }}{{- $high := index $pair 1 }}
{{- if and (hasKey $config $low) (hasKey $config $high) (gt (float64 (index $config $low)) (float64 (index $config $high))) }}
{{- fail (printf "controller.config.%s (%v) must not exceed controller.config.%s (%v)" $low (index $config $low) $high (index $config $high)) }}
{{- end }}
{{- end }}
{{- include "kvwise.validate.window" . }}
{{- with .Values.controller.metrics.serviceMonitor }}
{{- if and .enabled (gt (include "kvwise.durationMs" .scrapeTimeout | int64) (include "kvwise.durationMs" .interval | int64)) }}
{{- fail (printf "controller.metrics.serviceMonitor.scrapeTimeout (%s) must not exceed controller.metrics.serviceMonitor.interval (%s): Prometheus refuses such a scrape" .scrapeTimeout .interval) }}
{{- end }}
{{- /* Prometheus reads the scrape's token Secret in the ServiceMonitor's namespace; the
chart's own Secret is in the release's. An existing one may be copied there by hand. */}}
{{- $auth := $.Values.controller.auth }}
{{- if and .enabled $auth.readToken.enabled (not $auth.existingSecret) .namespace (ne .namespace $.Release.Namespace) }}
{{- fail (printf "controller.metrics.serviceMonitor.namespace (%s) is not the release's namespace (%s), where the chart's token Secret is: Prometheus reads the read token from the ServiceMonitor's namespace and could not scrape. Leave the namespace empty, or set controller.auth.existingSecret to a Secret you create in both" .namespace $.Release.Namespace) }}
{{- end }}
{{- end }}
{{- with .Values.controller.metrics.grafanaDashboard }}
{{- if and .enabled (hasKey .labels .sidecarLabel) }}
{{- fail (printf "controller.metrics.grafanaDashboard.labels must not set %s: the chart sets it to sidecarLabelValue" .sidecarLabel) }}
{{- end }}
{{- end }}
{{- with .Values.controller.pdb }}
{{- if and .create (eq (toString .minAvailable) "") (eq (toString .maxUnavailable) "") }}
{{- fail "controller.pdb.create=true needs controller.pdb.minAvailable or controller.pdb.maxUnavailable: a PodDisruptionBudget with neither protects nothing (controller.pdb.create=false for none)" }}
{{- end }}
{{- /* How many pods the budget lets go at once (Kubernetes rounds a percentage up); none
means every node drain waits on the controller forever. */}}
{{- $replicas := int $.Values.controller.replicaCount }}
{{- $key := ternary "minAvailable" "maxUnavailable" (ne (toString .minAvailable) "") }}
{{- $given := toString (index . $key) }}
{{- $pods := int $given }}
{{- if hasSuffix "%" $given }}
{{- $pods = div (add (mul (int (trimSuffix "%" $given)) $replicas) 99) 100 }}
{{- end }}
{{- $evictable := ternary (sub $replicas $pods) $pods (eq $key "minAvailable") }}
{{- if and .create (gt $replicas 0) (le (int $evictable) 0) }}
{{- fail (printf "controller.pdb.%s (%s) lets no controller pod be evicted with controller.replicaCount %d: every node drain (a cluster upgrade too) would wait on it forever. Raise controller.replicaCount, loosen the budget, or set controller.pdb.create=false" $key $given $replicas) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Who may call the API: the tokens, and where it listens. */}}
{{- define "kvwise.validate.auth" -}}
{{- $auth := .Values.controller.auth }}
{{- if and $auth.readToken.enabled (not $auth.enabled) }}
{{- fail "controller.auth.readToken.enabled=true needs controller.auth.enabled=true (a read token with open mutations)" }}
{{- end }}
{{- $host := .Values.controller.config.host }}
{{- if regexMatch "^(127\\.|::1$|localhost$)" $host }}
{{- fail (printf "controller.config.host=%s is a loopback address of the pod: the kubelet's probes, the Service and the ServiceMonitor could not reach the API. Leave 0.0.0.0 (or :: for IPv6) and keep the API token" $host) }}
{{- end }}
{{- if and (not $auth.enabled) (not .Values.controller.config.allowOpenApi) }}
{{- fail (printf "controller.auth.enabled=false serves the API open on %s: set controller.config.allowOpenApi=true to accept that (the controller refuses to start otherwise)" .Values.controller.config.host) }}
{{- end }}
{{- if and $auth.readToken.enabled (eq $auth.existingSecretKey $auth.readToken.existingSecretKey) }}
{{- fail "controller.auth.readToken.existingSecretKey must differ from controller.auth.existingSecretKey: the two tokens are two keys of one Secret" }}
{{- end }}
{{- if and $auth.enabled $auth.readToken.enabled (not $auth.existingSecret) $auth.apiToken (eq $auth.apiToken $auth.readToken.value) }}
{{- fail "controller.auth.readToken.value must differ from controller.auth.apiToken (the controller refuses to start otherwise): give another or leave it empty to have one generated" }}
{{- end }}
{{- range $key, $token := dict "controller.auth.apiToken" $auth.apiToken "controller.auth.readToken.value" $auth.readToken.value }}
{{- if and $token (not (trim $token)) }}
{{- fail (printf "%s is blank: give a real token or leave it empty to have one generated" $key) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The external Redis's TLS files are mounted 0440, owned by root and by the pod's fsGroup
(root's group without one): a pod whose security contexts run its container as another
user must have an fsGroup, or a group 0, to read the CA. An image's own USER is not seen.
*/}}
{{- define "kvwise.validate.tlsReadable" -}}
{{- if and (not .Values.redis.enabled) .Values.redis.external.tls.existingSecret }}
{{- $pods := dict "controller" .Values.controller }}
{{- if .Values.workers.enabled }}
{{- $_ := set $pods "workers" .Values.workers }}
{{- end }}
{{- range $name, $v := $pods }}
{{- $pod := default dict $v.podSecurityContext }}
{{- $ctr := default dict $v.containerSecurityContext }}
{{- $user := hasKey $ctr "runAsUser" | ternary $ctr.runAsUser $pod.runAsUser }}
{{- $group := hasKey $ctr "runAsGroup" | ternary $ctr.runAsGroup $pod.runAsGroup }}
{{- $nonRoot := hasKey $ctr "runAsNonRoot" | ternary $ctr.runAsNonRoot $pod.runAsNonRoot }}
{{- $asOther := kindIs "invalid" $user | ternary $nonRoot (ne (int64 $user) 0) }}
{{- $rootGroup := and (not (kindIs "invalid" $group)) (eq (int64 $group) 0) }}
{{- range $g := default list $pod.supplementalGroups }}
{{- $rootGroup = or $rootGroup (eq (int64 $g) 0) }}
{{- end }}
{{- if and $asOther (kindIs "invalid" $pod.fsGroup) (not $rootGroup) }}
{{- fail (printf "%s run as a non-root user (%s.podSecurityContext or %s.containerSecurityContext) but the Redis TLS Secret %s is mounted readable by root and the pod's fsGroup only: set %s.podSecurityContext.fsGroup (any group id; the kubelet gives the files that group)" $name $name $name $.Values.redis.external.tls.existingSecret $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The chart's workers: a model, and agent settings the controller takes. */}}
{{- define "kvwise.validate.workers" -}}
{{- if .Values.workers.enabled }}
{{- if not .Values.workers.model.name }}
{{- fail "workers.enabled=true needs workers.model.name (a Hugging Face id or a path)" }}
{{- end }}
{{- /* The engine answers GET /health only once its model is downloaded and loaded: without
the startup probe, the liveness probe counts that time as failures and restarts the worker. */}}
{{- $live := .Values.workers.livenessProbe }}
{{- if and $live.enabled (not .Values.workers.startupProbe.enabled) }}
{{- fail (printf "workers.startupProbe.enabled=false leaves workers.livenessProbe probing GET /health from the engine's start, which answers only once the model is downloaded and loaded: a worker whose model takes more than %d s (periodSeconds x failureThreshold) would be restarted again and again. Keep the startup probe (raise its failureThreshold for a slow download) or set workers.livenessProbe.enabled=false too" (mul $live.periodSeconds $live.failureThreshold)) }}
{{- end }}
{{- range $kind := list "requests" "limits" }}
{{- $given := dig $kind $.Values.workers.gpu.resourceName "" (default dict $.Values.workers.resources) }}
{{- if and (ne (toString $given) "") (ne (toString $given) (toString (int $.Values.workers.gpu.count))) }}
{{- fail (printf "workers.resources.%s.%s (%v) must equal workers.gpu.count (%d): the pod's GPUs and the engine's tensor-parallel size come from workers.gpu.count; leave them out of workers.resources" $kind $.Values.workers.gpu.resourceName $given (int $.Values.workers.gpu.count)) }}
{{- end }}
{{- end }}
{{- /* The chart's agents and the controller must agree: what an agent sends must fit what
the controller takes (it dead-letters an entry over a limit, and an agent sends its whole
category table with every entry), and a policy restore waits for their heartbeats. */}}
{{- $agent := .Values.workers.agent }}
{{- $config := .Values.controller.config }}
{{- $perEntry := min (int64 $agent.batchEvents) (div (int64 $agent.bufferEvents) 2) }}
{{- if gt $perEntry (int64 $config.ingestMaxEvents) }}
{{- fail (printf "workers.agent.batchEvents (%d per entry) must not exceed controller.config.ingestMaxEvents (%d): the controller dead-letters larger entries" $perEntry (int64 $config.ingestMaxEvents)) }}
{{- end }}
{{- if le (float64 $agent.heartbeatTtlS) (float64 $agent.heartbeatIntervalS) }}
{{- fail (printf "workers.agent.heartbeatTtlS (%v) must exceed workers.agent.heartbeatIntervalS (%v): the heartbeat would expire between beats, and the agent refuses to start so" $agent.heartbeatTtlS $agent.heartbeatIntervalS) }}
{{- end }}
{{- if lt (float64 $config.restoreWaitS) (float64 $agent.heartbeatIntervalS) }}
{{- fail (printf "controller.config.restoreWaitS (%v) must be at least workers.agent.heartbeatIntervalS (%v): a leader restoring the policy into an emptied Redis waits that long for the workers' heartbeats, to number it after every version they hold" $config.restoreWaitS $agent.heartbeatIntervalS) }}
{{- end }}
{{- if gt (int64 $agent.maxTrackedCategories) (int64 $config.maxCategoriesPerWorker) }}
{{- fail (printf "workers.agent.maxTrackedCategories (%d) must not exceed controller.config.maxCategoriesPerWorker (%d): once a worker names more, the controller dead-letters its every entry" (int64 $agent.maxTrackedCategories) (int64 $config.maxCategoriesPerWorker)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Settings map -> container env entries (KVWISE_*); the schema takes no null among them. */}}
{{- define "kvwise.settingsEnv" -}}
{{- range $key, $value := . }}
- name: {{ printf "KVWISE_%s" ($key | snakecase | upper) }}
  value: {{ include "kvwise.envValue" $value | quote }}
{{- end }}
{{- end }}

{{/*
An HTTP GET probe on the container port named http, from probe values (enabled,
periodSeconds, timeoutSeconds, failureThreshold, optional initialDelaySeconds).
Takes (dict "kind" "livenessProbe" "probe" values "path" "/healthz"); empty when disabled.
*/}}
{{- define "kvwise.httpProbe" -}}
{{- if .probe.enabled }}
{{ .kind }}:
  httpGet:
    path: {{ .path }}
    port: http
  {{- with .probe.initialDelaySeconds }}
  initialDelaySeconds: {{ . }}
  {{- end }}
  periodSeconds: {{ .probe.periodSeconds }}
  timeoutSeconds: {{ .probe.timeoutSeconds }}
  failureThreshold: {{ .probe.failureThreshold }}
{{- end }}
{{- end }}
