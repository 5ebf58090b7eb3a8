{{/* The chart's name, for the app.kubernetes.io/name label. */}}
{{- define "csi-volmgr.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of object names: the release name if it holds the chart's name
(release csi-volmgr: csi-volmgr, csi-volmgr-register-node, ...), else
<release>-<name>.
*/}}
{{- define "csi-volmgr.fullname" -}}
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
The labels that select the agent's pods, as in deploy/base. The release is
not among them: one agent per host, whatever the release.
*/}}
{{- define "csi-volmgr.selectorLabels" -}}
app.kubernetes.io/name: {{ include "csi-volmgr.name" . }}
app.kubernetes.io/component: agent
{{- end }}

{{/*
The labels of every object: deploy/base's (name, component, part-of) and
Helm's (instance, version, managed-by, chart). Called with a dict of the
root context "ctx" and the "component".
*/}}
{{- define "csi-volmgr.labels" -}}
{{- $ctx := .ctx -}}
app.kubernetes.io/name: {{ include "csi-volmgr.name" $ctx }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: csi-volmgr
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/version: {{ include "csi-volmgr.imageTag" $ctx | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $ctx.Chart.Name $ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The image tag: image.tag, else the chart's appVersion. */}}
{{- define "csi-volmgr.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The ServiceAccount of the agent, the subject of its bindings. */}}
{{- define "csi-volmgr.subject" -}}
- kind: ServiceAccount
  name: {{ include "csi-volmgr.fullname" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}

{{/*
The host directory of the registration sockets; rendering fails when it is
the root directory, which holds the API socket (the agent refuses it too).
*/}}
{{- define "csi-volmgr.registrationDir" -}}
{{- $dir := .Values.registrationDir | default (printf "%s/plugins_registry" (trimSuffix "/" .Values.rootDir)) }}
{{- if eq (clean $dir) (clean .Values.rootDir) }}
{{- fail (printf "registrationDir %q is rootDir: the registration sockets need a directory of their own" $dir) }}
{{- end }}
{{- $dir }}
{{- end }}

{{/*
The prefix of the agents' Node names: nodeName is <prefix>$(NODE_NAME), and
the approver approves system:node:<prefix><host> for the agent on <host>.
Rendering fails for any other nodeName: no agent would get a certificate.
*/}}
{{- define "csi-volmgr.nodeNamePrefix" -}}
{{- if not (hasSuffix "$(NODE_NAME)" .Values.nodeName) }}
{{- fail (printf "nodeName %q must end with $(NODE_NAME): csi-volmgr-csr-approver approves system:node:<prefix><host> for the agent on <host>, and nothing else" .Values.nodeName) }}
{{- end }}
{{- $prefix := trimSuffix "$(NODE_NAME)" .Values.nodeName }}
{{- if not $prefix }}
{{- fail "nodeName $(NODE_NAME) is the host's own Node, the kubelet's: give it a prefix, e.g. csi-volmgr-$(NODE_NAME)" }}
{{- end }}
{{- $prefix }}
{{- end }}

{{/* The labels that select the CSR approver's pod. */}}
{{- define "csi-volmgr.approverSelectorLabels" -}}
app.kubernetes.io/name: {{ include "csi-volmgr.name" . }}
app.kubernetes.io/component: csr-approver
{{- end }}
