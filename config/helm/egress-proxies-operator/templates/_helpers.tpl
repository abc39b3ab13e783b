{{/*
Names follow config/default: <fullname>-controller-manager and so on, where
fullname is the release name when it already contains the chart's name
(release "egress-proxies-operator" renders the kustomize names exactly).
*/}}
{{- define "epo.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "epo.selectorLabels" -}}
control-plane: controller-manager
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The labels every object carries; helm's own are skipped by the drift test. */}}
{{- define "epo.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "epo.serviceAccountName" -}}
{{ include "epo.fullname" . }}-controller-manager
{{- end -}}

{{/* The gateway's Pods: no control-plane label, so the manager's Services, PDB and NetworkPolicy never select them. */}}
{{- define "epo.gatewaySelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{/*
What the manager's and the gateway's containers share (one binary, one
runtime envelope): the image, the Pod and container security contexts, the
probes, the discovery token and the downward-API and tracing variables.
*/}}
{{- define "epo.image" -}}
{{- if .Values.image.digest -}}
image: "{{ .Values.image.repository }}@{{ .Values.image.digest }}"
{{- else -}}
image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
{{- end }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{- define "epo.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "epo.containerSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities:
    drop:
    - ALL
{{- end -}}

{{- define "epo.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: probes
  initialDelaySeconds: 15
  periodSeconds: 20
readinessProbe:
  httpGet:
    path: /readyz
    port: probes
  initialDelaySeconds: 5
  periodSeconds: 10
{{- end -}}

{{/*
Bearer token of the discovery API (discoveryToken in values.yaml), as
arguments ("epo.tokenArgs") and environment ("epo.tokenEnv"). generate:
the operator creates the Secret with a random token for client "default"
while it is absent, and every container watches it
(--discovery-tokens-secret); nothing random is rendered, so every render
of the chart is the same (helm template, Argo CD) and the token stays.
*/}}
{{- define "epo.tokenArgs" -}}
{{- if .Values.discoveryToken.generate }}
{{- range concat .Values.extraArgs .Values.gateway.extraArgs }}
{{- if hasPrefix "--discovery-tokens-secret" . }}
{{- fail "discoveryToken.generate names the tokens Secret itself: drop --discovery-tokens-secret from extraArgs, or set discoveryToken.generate=false" }}
{{- end }}
{{- end }}
- --discovery-tokens-secret={{ include "epo.discoveryTokenSecret" . }}
{{- end }}
{{- end -}}

{{- define "epo.tokenEnv" -}}
{{- if not .Values.discoveryToken.generate }}
- name: DISCOVERY_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.discoveryToken.existingSecret }}
      key: {{ .Values.discoveryToken.key }}
      optional: true
{{- end }}
{{- end -}}

{{/*
The downward-API variables must come before OTEL_RESOURCE_ATTRIBUTES
("epo.otelEnv"): $(VAR) only expands variables listed earlier.
*/}}
{{- define "epo.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{/* Tracing after OTEL_SERVICE_NAME, which each container names itself; off until otel.endpoint is set. */}}
{{- define "epo.otelEnv" -}}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)
{{- with .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.otel.protocol }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.otel.sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with .Values.otel.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "epo.discoveryTokenSecret" -}}
{{- if .Values.discoveryToken.generate -}}
{{ include "epo.fullname" . }}-discovery-token
{{- else -}}
{{ .Values.discoveryToken.existingSecret }}
{{- end -}}
{{- end -}}

{{/*
An object of the kustomize tree (a file under files/, a symlink into
config/) as config/default's kustomization renders it: names prefixed with
the fullname, the release namespace, the chart's labels; RBAC references
follow the names; the manager's ServiceAccount gets serviceAccount.annotations
(the gateway's does not: it calls no cloud). Call with (list $ "files/rbac/role.yaml").
*/}}
{{- define "epo.fromKustomize" -}}
{{- $root := index . 0 -}}
{{- $obj := $root.Files.Get (index . 1) | fromYaml -}}
{{- $prefix := include "epo.fullname" $root -}}
{{- $meta := $obj.metadata -}}
{{- $manager := eq $meta.name "controller-manager" -}}
{{- $_ := set $meta "name" (printf "%s-%s" $prefix $meta.name | trunc 63 | trimSuffix "-") -}}
{{- if hasKey $meta "namespace" -}}
{{- $_ := set $meta "namespace" $root.Release.Namespace -}}
{{- end -}}
{{- $labels := merge (include "epo.labels" $root | fromYaml) (omit (default dict $meta.labels) "app.kubernetes.io/managed-by") -}}
{{- $_ := set $meta "labels" $labels -}}
{{- if and (eq $obj.kind "ServiceAccount") $manager $root.Values.serviceAccount.annotations -}}
{{- $_ := set $meta "annotations" (merge (dict) $root.Values.serviceAccount.annotations (default dict $meta.annotations)) -}}
{{- end -}}
{{- with $obj.roleRef -}}
{{- $_ := set . "name" (printf "%s-%s" $prefix .name | trunc 63 | trimSuffix "-") -}}
{{- end -}}
{{- if eq $obj.kind "ValidatingAdmissionPolicyBinding" -}}
{{- $_ := set $obj.spec "policyName" (printf "%s-%s" $prefix $obj.spec.policyName | trunc 63 | trimSuffix "-") -}}
{{- $_ := set $obj.spec.paramRef "name" (printf "%s-%s" $prefix $obj.spec.paramRef.name | trunc 63 | trimSuffix "-") -}}
{{- $_ := set $obj.spec.paramRef "namespace" $root.Release.Namespace -}}
{{- end -}}
{{- range $obj.subjects -}}
{{- $_ := set . "name" (printf "%s-%s" $prefix .name | trunc 63 | trimSuffix "-") -}}
{{- $_ := set . "namespace" $root.Release.Namespace -}}
{{- end -}}
{{- toYaml $obj -}}
{{- end -}}

{{/*
Where a workload's Pods run, from its values map (the manager's .Values,
the gateway's .Values.gateway): nodeSelector, tolerations, affinity and
topology spread, each only when set.
*/}}
{{- define "epo.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The manager's --max-leases-per-proxy (in extraArgs, as --max-leases-per-proxy=N)
for the gateway too, unless gateway.extraArgs gives its own: the gateway
judges exclusive leases by the same bound.
*/}}
{{- define "epo.gatewayLeaseArgs" -}}
{{- $own := false }}
{{- range .Values.gateway.extraArgs }}
{{- if hasPrefix "--max-leases-per-proxy" . }}{{ $own = true }}{{ end }}
{{- end }}
{{- if not $own }}
{{- range .Values.extraArgs }}
{{- if hasPrefix "--max-leases-per-proxy=" . }}
- {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
