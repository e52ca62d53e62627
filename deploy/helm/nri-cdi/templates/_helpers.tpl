{{/*
Names and labels as Helm's own chart scaffold and NVIDIA's charts make them: two releases
never share a name or a selector.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "nri-cdi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: fullnameOverride, else the release name when it already contains the
chart's name (helm install nri-cdi gives DaemonSet nri-cdi, as the docs use it), else
RELEASE-NAME. 63 characters: it is also a label value.
*/}}
{{- define "nri-cdi.fullname" -}}
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

{{- define "nri-cdi.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The DaemonSet's selector: name and instance only. A selector cannot be changed after the
DaemonSet is made, so nothing that changes on an upgrade (the version) may be in it.
*/}}
{{- define "nri-cdi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nri-cdi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "nri-cdi.labels" -}}
helm.sh/chart: {{ include "nri-cdi.chart" . }}
{{ include "nri-cdi.selectorLabels" . }}
{{- with .Chart.AppVersion }}
app.kubernetes.io/version: {{ . | replace "+" "_" | trunc 63 | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "nri-cdi.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nri-cdi.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "nri-cdi.image" -}}
{{ required "image.repository: build the nri-cdi image and push it to your registry (docs/install/kubernetes.md)" .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
nri-cdi's metrics.address, made from metrics.bindAddress and metrics.port: the probes and
the container port are made from the same two values, so they cannot point elsewhere.
*/}}
{{- define "nri-cdi.metricsAddress" -}}
{{- printf "%s:%d" .Values.metrics.bindAddress (int .Values.metrics.port) }}
{{- end }}

{{/*
Where the kubelet sends the probes. It probes from the node's network namespace, which is
the pod's (hostNetwork), so the loopback address reaches a server bound to it or to all.
*/}}
{{- define "nri-cdi.probeHost" -}}
{{- if eq .Values.metrics.bindAddress "0.0.0.0" }}127.0.0.1{{ else }}{{ .Values.metrics.bindAddress }}{{ end }}
{{- end }}

{{/* A loopback bind address: reachable from the node only. */}}
{{- define "nri-cdi.metricsLocal" -}}
{{- if hasPrefix "127." .Values.metrics.bindAddress }}true{{ end }}
{{- end }}

{{/* nri-cdi's configuration file: the values' config with what the chart derives. */}}
{{- define "nri-cdi.config" -}}
{{- if hasKey .Values.config "metrics" }}
{{- fail "config.metrics: the chart makes metrics.address from the values metrics.bindAddress and metrics.port, which the probes use too: set those instead" }}
{{- end }}
{{- if hasKey (.Values.config.plugin | default dict) "ready_file" }}
{{- fail "config.plugin.ready_file: the chart sets it, to the file the readiness probe asks for in the pod's own folder" }}
{{- end }}
{{- $config := deepCopy .Values.config }}
{{- $_ := set $config "metrics" (dict "address" (include "nri-cdi.metricsAddress" .)) }}
{{- $_ = set $config.plugin "ready_file" (include "nri-cdi.readyFile" .) }}
{{- toYaml $config }}
{{- end }}

{{/*
The spec folders the plugin reads (config.plugin.spec_dirs), cleaned, one hostPath volume
each: the list in the configuration is the only place they are named.
*/}}
{{- define "nri-cdi.specDirs" -}}
{{- $dirs := list }}
{{- range .Values.config.plugin.spec_dirs }}
{{- $dirs = append $dirs (clean .) }}
{{- end }}
{{- toJson $dirs }}
{{- end }}

{{/*
The index in the spec folders of the folder the generator writes (config.generate.output's);
a folder the plugin does not read would give a spec nothing serves, so that fails.
*/}}
{{- define "nri-cdi.outputDirIndex" -}}
{{- $dirs := include "nri-cdi.specDirs" . | fromJsonArray }}
{{- $out := dir (clean .Values.config.generate.output) }}
{{- $found := "" }}
{{- range $i, $d := $dirs }}
{{- if and (eq $d $out) (eq $found "") }}{{ $found = toString $i }}{{ end }}
{{- end }}
{{- if eq $found "" }}
{{- fail (printf "config.generate.output: %s is written to %s, which is not one of config.plugin.spec_dirs (%s): the plugin would never read the spec" .Values.config.generate.output $out (join ", " $dirs)) }}
{{- end }}
{{- $found }}
{{- end }}

{{/* What the generator (the init container and the watcher) mounts. */}}
{{- define "nri-cdi.generatorMounts" -}}
- {name: config, mountPath: /etc/nri-cdi, readOnly: true}
- {name: cdi-specs-{{ include "nri-cdi.outputDirIndex" . }}, mountPath: {{ dir (clean .Values.config.generate.output) }}}
- {name: dev, mountPath: /dev, readOnly: true}
# A driver container that restarts mounts its root again: without
# propagation the pod would keep the old driver's files.
- {name: driver-root, mountPath: {{ .Values.config.generate.driver_root }}, readOnly: true, mountPropagation: HostToContainer}
{{- end }}

{{/*
The plugin's ready file, in a folder of the pod's own: during an upgrade two plugins run on a
node, and the metrics address is the node's (the older one's until it ends), so readiness
is asked of the process itself.
*/}}
{{- define "nri-cdi.readyDir" -}}/run/nri-cdi-pod{{- end }}
{{- define "nri-cdi.readyFile" -}}{{ include "nri-cdi.readyDir" . }}/ready{{- end }}
