{{/* Chart name, possibly overridden. */}}
{{- define "dedup-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name: the release name, plus the chart name unless it is in it. */}}
{{- define "dedup-gateway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dedup-gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dedup-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dedup-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dedup-gateway.labels" -}}
helm.sh/chart: {{ include "dedup-gateway.chart" . }}
{{ include "dedup-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "dedup-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dedup-gateway.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dedup-gateway.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "dedup-gateway.configMapName" -}}
{{- .Values.existingConfigMap | default (printf "%s-config" (include "dedup-gateway.fullname" .)) -}}
{{- end -}}

{{- define "dedup-gateway.secretName" -}}
{{- .Values.existingSecret | default (printf "%s-env" (include "dedup-gateway.fullname" .)) -}}
{{- end -}}

{{/*
One TOML value. Strings are written as JSON strings (a JSON string is a valid TOML
basic string). Helm reads YAML numbers as float64: whole ones are written as integers,
so `max_entries: 1000000` stays an integer instead of becoming 1e+06.
*/}}
{{- define "dedup-gateway.tomlValue" -}}
{{- $v := . -}}
{{- $k := kindOf $v -}}
{{- if eq $k "string" -}}
{{- toJson $v -}}
{{- else if eq $k "bool" -}}
{{- ternary "true" "false" $v -}}
{{- else if or (eq $k "float64") (eq $k "float32") -}}
{{- if eq (float64 (int64 $v)) (float64 $v) -}}{{ int64 $v }}{{- else -}}{{ $v }}{{- end -}}
{{- else if or (hasPrefix "int" $k) (hasPrefix "uint" $k) -}}
{{- $v -}}
{{- else if eq $k "slice" -}}
[{{- range $i, $e := $v -}}{{- if $i }}, {{ end -}}{{- include "dedup-gateway.tomlValue" $e -}}{{- end -}}]
{{- else if eq $k "map" -}}
{ {{- range $i, $key := keys $v | sortAlpha -}}{{- if $i }},{{ end }} {{ $key }} = {{ include "dedup-gateway.tomlValue" (get $v $key) -}}{{- end }} }
{{- else -}}
{{- fail (printf "config: cannot write %v (%s) as TOML" $v $k) -}}
{{- end -}}
{{- end -}}

{{/* The keys of one TOML table: `first` keys in that order, then the rest sorted; nulls dropped. */}}
{{- define "dedup-gateway.tomlKeys" -}}
{{- $table := index . 0 -}}
{{- $first := index . 1 -}}
{{- $keys := list -}}
{{- range $first -}}{{- if hasKey $table . -}}{{- $keys = append $keys . -}}{{- end -}}{{- end -}}
{{- range keys $table | sortAlpha -}}{{- if not (has . $first) -}}{{- $keys = append $keys . -}}{{- end -}}{{- end -}}
{{- range $keys -}}
{{- $val := get $table . -}}
{{- if not (kindIs "invalid" $val) }}
{{ . }} = {{ include "dedup-gateway.tomlValue" $val }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The store.url_env that applies: config.store.url_env only with backend "redis" and
neither url, cluster nor cluster_env set (non-empty); "" otherwise. The chart's default url_env
(REDIS_URL) would otherwise stay in the rendering after a user switches to `url`,
`cluster` or the memory store (Helm merges maps), and the gateway refuses both
together. The rendering, the checks below and NOTES.txt all use this value.
*/}}
{{- define "dedup-gateway.storeUrlEnv" -}}
{{- $store := .Values.config.store | default dict -}}
{{- if and (eq (toString ($store.backend | default "memory")) "redis") (empty $store.url) (empty $store.cluster) (empty $store.cluster_env) -}}
{{- toString ($store.url_env | default "") -}}
{{- end -}}
{{- end -}}

{{/*
The admin token's environment variable (config.server.admin_token_env) when the chart
renders the config; "" with existingConfigMap (the chart cannot see that config).
*/}}
{{- define "dedup-gateway.adminTokenEnv" -}}
{{- if not .Values.existingConfigMap -}}
{{- $server := .Values.config.server | default dict -}}
{{- toString ($server.admin_token_env | default "") -}}
{{- end -}}
{{- end -}}

{{/*
gateway.toml from .Values.config: top-level values, then tables ([server], [store],
[defaults], then any other), then arrays of tables ([[routes]]).
*/}}
{{- define "dedup-gateway.gatewayToml" -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- /* The default url_env applies only where it can: see dedup-gateway.storeUrlEnv. */ -}}
{{- $store := get $cfg "store" -}}
{{- if and (kindIs "map" $store) (hasKey $store "url_env") (not (include "dedup-gateway.storeUrlEnv" .)) -}}
{{- $_ := unset $store "url_env" -}}
{{- end -}}
{{- /* tls.secretName: the mounted pair, unless config.server names files itself. */ -}}
{{- if .Values.tls.secretName -}}
{{- $server := get $cfg "server" | default dict -}}
{{- if not (hasKey $server "tls_cert") -}}
{{- $_ := set $server "tls_cert" "/etc/dedup-gateway-tls/tls.crt" -}}
{{- $_ := set $server "tls_key" "/etc/dedup-gateway-tls/tls.key" -}}
{{- end -}}
{{- $_ := set $cfg "server" $server -}}
{{- end -}}
{{- $order := list "server" "store" "defaults" -}}
{{- $names := concat $order (without (keys $cfg | sortAlpha) "server" "store" "defaults") -}}
# Rendered by the dedup-gateway Helm chart from .Values.config.
{{- $scalars := dict -}}
{{- range $name := $names -}}
{{- $v := get $cfg $name -}}
{{- if and (hasKey $cfg $name) (not (kindIs "map" $v)) (not (and (kindIs "slice" $v) (gt (len $v) 0) (kindIs "map" (first $v)))) -}}
{{- $_ := set $scalars $name $v -}}
{{- end -}}
{{- end -}}
{{- include "dedup-gateway.tomlKeys" (list $scalars (list)) -}}
{{- range $name := $names -}}
{{- $v := get $cfg $name -}}
{{- if kindIs "map" $v }}

[{{ $name }}]
{{- include "dedup-gateway.tomlKeys" (list $v (list)) -}}
{{- end -}}
{{- end -}}
{{- range $name := $names -}}
{{- $v := get $cfg $name -}}
{{- if and (kindIs "slice" $v) (gt (len $v) 0) (kindIs "map" (first $v)) -}}
{{- range $v }}

[[{{ $name }}]]
{{- include "dedup-gateway.tomlKeys" (list . (list "name" "path" "upstream")) -}}
{{- end -}}
{{- end -}}
{{- end }}
{{ end -}}

{{/* A duration of the form "30s", "5m", "250ms", "0s" in milliseconds; -1 if not that simple. */}}
{{- define "dedup-gateway.durationMs" -}}
{{- $d := toString . | trim -}}
{{- if regexMatch "^[0-9]+ms$" $d -}}
{{- trimSuffix "ms" $d -}}
{{- else if regexMatch "^[0-9]+s$" $d -}}
{{- mul (trimSuffix "s" $d | int64) 1000 -}}
{{- else if regexMatch "^[0-9]+m$" $d -}}
{{- mul (trimSuffix "m" $d | int64) 60000 -}}
{{- else -}}
-1
{{- end -}}
{{- end -}}

{{/* Fail early on combinations that cannot work. */}}
{{- define "dedup-gateway.validate" -}}
{{- if not .Values.existingConfigMap -}}
{{- $server := .Values.config.server | default dict -}}
{{- $store := .Values.config.store | default dict -}}
{{- if and (gt (int .Values.replicaCount) 1) (ne (toString ($store.backend | default "memory")) "redis") -}}
{{- fail "config.store.backend: the memory store is per process; with replicaCount > 1 use \"redis\"" -}}
{{- end -}}
{{- if not (hasSuffix (printf ":%v" .Values.containerPorts.http) (toString $server.listen)) -}}
{{- fail (printf "config.server.listen (%v) must use containerPorts.http (%v)" $server.listen .Values.containerPorts.http) -}}
{{- end -}}
{{- if not $server.admin_listen -}}
{{- fail "config.server.admin_listen: required, the probes use /livez and /readyz" -}}
{{- end -}}
{{- if not (hasSuffix (printf ":%v" .Values.containerPorts.admin) (toString $server.admin_listen)) -}}
{{- fail (printf "config.server.admin_listen (%v) must use containerPorts.admin (%v)" $server.admin_listen .Values.containerPorts.admin) -}}
{{- end -}}
{{- if regexMatch "^(127\\.|localhost:|\\[::1\\]:)" (toString $server.admin_listen) -}}
{{- fail (printf "config.server.admin_listen (%v): loopback is unreachable for the kubelet's probes; use 0.0.0.0" $server.admin_listen) -}}
{{- end -}}
{{- $delay := include "dedup-gateway.durationMs" ($server.shutdown_delay | default "0s") | int64 -}}
{{- $grace := include "dedup-gateway.durationMs" ($server.shutdown_grace | default "30s") | int64 -}}
{{- if and (ge $delay 0) (ge $grace 0) (lt (mul (int64 .Values.terminationGracePeriodSeconds) 1000) (add $delay $grace 3000)) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed shutdown_delay + shutdown_grace (%v ms) by 3s or more (releases and their 503s come after the grace)" .Values.terminationGracePeriodSeconds (add $delay $grace)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (not .Values.adminService.enabled) -}}
{{- fail "serviceMonitor.enabled needs adminService.enabled" -}}
{{- end -}}
{{- $store := .Values.config.store | default dict -}}
{{- if and (not .Values.existingConfigMap) (not (empty $store.url)) (not (empty $store.cluster)) -}}
{{- fail "config.store: set either url or cluster, not both" -}}
{{- end -}}
{{- $urlEnv := include "dedup-gateway.storeUrlEnv" . -}}
{{- if and (not .Values.existingConfigMap) $urlEnv .Values.secret.create (not (hasKey .Values.secret.stringData $urlEnv)) -}}
{{- fail (printf "config.store.url_env = %s: secret.stringData has no %s (or use existingSecret)" $urlEnv $urlEnv) -}}
{{- end -}}
{{- if and (not .Values.existingConfigMap) $urlEnv (not .Values.secret.create) (not .Values.existingSecret) -}}
{{- fail (printf "config.store.url_env = %s needs a Secret with that key: secret.create or existingSecret" $urlEnv) -}}
{{- end -}}
{{- $tokenEnv := include "dedup-gateway.adminTokenEnv" . -}}
{{- if and $tokenEnv (not .Values.secret.create) (not .Values.existingSecret) -}}
{{- fail (printf "config.server.admin_token_env = %s needs a Secret with the key %s: secret.create (the chart generates the token unless secret.stringData.%s is set) or existingSecret holding %s; config.server.admin_token_env: null leaves POST /reload and DELETE /keys open to anyone reaching the admin port" $tokenEnv $tokenEnv $tokenEnv $tokenEnv) -}}
{{- end -}}
{{- if and .Values.secret.create .Values.existingSecret -}}
{{- fail "set either secret.create or existingSecret, not both" -}}
{{- end -}}
{{- end -}}
