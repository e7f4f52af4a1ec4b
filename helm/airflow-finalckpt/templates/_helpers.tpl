{{/*
Names. fullname: the release name when it already contains "finalckpt", else
"<release>-finalckpt"; truncated to 40 characters so that suffixed names stay DNS labels.
*/}}
{{- define "finalckpt.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "finalckpt.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else if contains "finalckpt" .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-finalckpt" .Release.Name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "finalckpt.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "finalckpt.selectorLabels" -}}
app.kubernetes.io/name: {{ include "finalckpt.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "finalckpt.labels" -}}
helm.sh/chart: {{ include "finalckpt.chart" . }}
{{ include "finalckpt.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: airflow-finalckpt
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Resource names, shared by the templates, NOTES and the tests. */}}
{{- define "finalckpt.configMapName" -}}{{ include "finalckpt.fullname" . }}-config{{- end }}
{{- define "finalckpt.sparkConfigMapName" -}}{{ include "finalckpt.fullname" . }}-spark-defaults{{- end }}
{{- define "finalckpt.migrationJobName" -}}{{ include "finalckpt.fullname" . }}-db-migrate{{- end }}
{{- define "finalckpt.gcName" -}}{{ include "finalckpt.fullname" . }}-gc{{- end }}

{{- define "finalckpt.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Coordination database. This chart renders no credential: the password (airflowPostgres mode)
or the whole store URL (external mode) comes from a Secret you manage, named in the values,
as env from a secretKeyRef. The URL the chart builds holds no password and asks for TLS
(sslmode, default require).
*/}}
{{- define "finalckpt.storeSecretName" -}}
{{- if eq .Values.coordinationDb.mode "external" }}
{{- required "coordinationDb.external.existingSecret.name is required: name an existing Secret whose key holds the whole store URL, e.g. kubectl create secret generic finalckpt-store --from-literal=url='postgresql+psycopg://USER:PASSWORD@HOST:5432/finalckpt?sslmode=require' (this chart renders no credential)" .Values.coordinationDb.external.existingSecret.name }}
{{- else }}
{{- required (printf "coordinationDb.airflowPostgres.passwordSecret.name is required: name an existing Secret holding the password of the store's least-privilege user %s, e.g. kubectl create secret generic finalckpt-store --from-literal=password=... and --set coordinationDb.airflowPostgres.passwordSecret.name=finalckpt-store (the migration Job creates that user with it); this chart renders no credential" .Values.coordinationDb.airflowPostgres.user) .Values.coordinationDb.airflowPostgres.passwordSecret.name }}
{{- end }}
{{- end }}

{{- define "finalckpt.storeSecretKey" -}}
{{- if eq .Values.coordinationDb.mode "external" }}
{{- .Values.coordinationDb.external.existingSecret.key | default "url" }}
{{- else }}
{{- .Values.coordinationDb.airflowPostgres.passwordSecret.key | default "postgres-password" }}
{{- end }}
{{- end }}

{{/* The env variable the store Secret's key becomes: the whole URL, or the password only. */}}
{{- define "finalckpt.storeSecretEnv" -}}
{{- if eq .Values.coordinationDb.mode "external" -}}
AIRFLOW__FINALCKPT__STORE_URL
{{- else -}}
AIRFLOW__FINALCKPT__STORE_PASSWORD
{{- end }}
{{- end }}

{{/*
The migration Job's administrative user (airflowPostgres mode): its Secret defaults to the
official chart's PostgreSQL Secret. Only the migration Job gets its password.
*/}}
{{- define "finalckpt.adminSecretName" -}}
{{- .Values.coordinationDb.airflowPostgres.admin.passwordSecret.name | default (printf "%s-postgresql" .Values.airflow.releaseName) }}
{{- end }}

{{- define "finalckpt.adminSecretKey" -}}
{{- .Values.coordinationDb.airflowPostgres.admin.passwordSecret.key | default "postgres-password" }}
{{- end }}

{{/* The migration Job's administrative URL (no password) and password (its Secret). */}}
{{- define "finalckpt.migrationAdminEnv" -}}
- name: FINALCKPT_ADMIN_STORE_URL
  value: {{ include "finalckpt.adminStoreUrl" . | quote }}
- name: FINALCKPT_ADMIN_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "finalckpt.adminSecretName" . }}
      key: {{ include "finalckpt.adminSecretKey" . }}
{{- end }}

{{- define "finalckpt.airflowPostgresHost" -}}
{{- $pg := .Values.coordinationDb.airflowPostgres }}
{{- $pg.host | default (printf "%s-postgresql.%s.svc" .Values.airflow.releaseName .Release.Namespace) }}
{{- end }}

{{/* The store URL this chart builds (airflowPostgres mode, psycopg 3): no password, TLS. */}}
{{- define "finalckpt.storeUrl" -}}
{{- include "finalckpt.storeUrlOf" (dict "root" . "user" .Values.coordinationDb.airflowPostgres.user) }}
{{- end }}

{{/* The same URL for the migration Job's administrative user. */}}
{{- define "finalckpt.adminStoreUrl" -}}
{{- include "finalckpt.storeUrlOf" (dict "root" . "user" .Values.coordinationDb.airflowPostgres.admin.user) }}
{{- end }}

{{- define "finalckpt.storeUrlOf" -}}
{{- $pg := .root.Values.coordinationDb.airflowPostgres }}
{{- /* urlquery writes a space as "+" (a literal "+" becomes %2B): userinfo needs %20. */}}
{{- printf "postgresql+psycopg://%s@%s:%d/%s?sslmode=%s" (.user | urlquery | replace "+" "%20") (include "finalckpt.airflowPostgresHost" .root) (int $pg.port) $pg.database ($pg.sslmode | default "require" | urlquery) }}
{{- end }}

{{/*
The finalckpt CLI's way to Airflow's REST API (finalckpt restore): the official chart's
api-server Service inside the cluster (port 8080, its ports.apiServer default) unless
airflow.api.url says otherwise.
*/}}
{{- define "finalckpt.apiUrl" -}}
{{- $api := .Values.airflow.api | default dict }}
{{- $api.url | default (printf "http://%s-api-server.%s.svc:8080" .Values.airflow.releaseName .Release.Namespace) | trimSuffix "/" }}
{{- end }}

{{/*
The CLI's Airflow login as entries of the official chart's `secret` list (env from a Secret
key, never a value in a ConfigMap): a token key, else the username and password keys; nothing
without airflow.api.existingSecret.
*/}}
{{- define "finalckpt.apiLoginSecretEnv" -}}
{{- $api := .Values.airflow.api | default dict }}
{{- if $api.existingSecret }}
{{- if $api.tokenKey }}
- envName: AIRFLOW__FINALCKPT__API_TOKEN
  secretName: {{ $api.existingSecret }}
  secretKey: {{ $api.tokenKey }}
{{- else }}
- envName: AIRFLOW__FINALCKPT__API_USERNAME
  secretName: {{ $api.existingSecret }}
  secretKey: {{ $api.usernameKey | default "username" }}
- envName: AIRFLOW__FINALCKPT__API_PASSWORD
  secretName: {{ $api.existingSecret }}
  secretKey: {{ $api.passwordKey | default "password" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Checkpoint storage.
*/}}
{{- define "finalckpt.pvcName" -}}
{{- .Values.checkpointStorage.pvc.existingClaim | default (printf "%s-checkpoints" (include "finalckpt.fullname" .)) }}
{{- end }}

{{- define "finalckpt.storageUri" -}}
{{- if eq .Values.checkpointStorage.mode "pvc" }}
{{- .Values.checkpointStorage.pvc.mountPath }}
{{- else }}
{{- .Values.checkpointStorage.objectStore.uri }}
{{- end }}
{{- end }}

{{/*
Spark.
*/}}
{{/* Not the Airflow namespace by default: a driver runs DAG code and the Spark Role lets it
create pods, which could mount any Secret of the namespace they run in. */}}
{{- define "finalckpt.sparkNamespace" -}}
{{- .Values.spark.kubernetes.namespace | default (printf "%s-spark" .Release.Namespace) }}
{{- end }}

{{- define "finalckpt.sparkServiceAccountName" -}}
{{- .Values.spark.kubernetes.serviceAccount.name | default (printf "%s-spark" (include "finalckpt.fullname" .)) }}
{{- end }}

{{- define "finalckpt.sparkSubmitters" -}}
{{- $names := .Values.spark.kubernetes.submitterServiceAccounts }}
{{- if not $names }}{{ $names = list (printf "%s-worker" .Values.airflow.releaseName) }}{{ end }}
{{- toJson $names }}
{{- end }}

{{/* The Airflow connection (JSON form) read by the Spark provider's SparkSubmitHook. */}}
{{- define "finalckpt.sparkConnection" -}}
{{- $s := .Values.spark }}
{{- $extra := dict }}
{{- if ne $s.mode "connect" }}{{ $_ := set $extra "deploy-mode" $s.deployMode }}{{ end }}
{{- if eq $s.mode "kubernetes" }}{{ $_ := set $extra "namespace" (include "finalckpt.sparkNamespace" .) }}{{ end }}
{{- $extra = merge (deepCopy $s.connectionExtra) $extra }}
{{- $master := ternary "yarn" $s.master (eq $s.mode "yarn") }}
{{- toJson (dict "conn_type" "spark" "host" $master "extra" $extra) }}
{{- end }}

{{/* spark-defaults.conf: derived Kubernetes settings first, user entries override. */}}
{{- define "finalckpt.sparkDefaults" -}}
{{- $conf := dict }}
{{- if eq .Values.spark.mode "kubernetes" }}
{{- $_ := set $conf "spark.kubernetes.namespace" (include "finalckpt.sparkNamespace" .) }}
{{- $_ := set $conf "spark.kubernetes.authenticate.driver.serviceAccountName" (include "finalckpt.sparkServiceAccountName" .) }}
{{- $_ := set $conf "spark.kubernetes.container.image" .Values.spark.kubernetes.containerImage }}
{{- if eq .Values.spark.deployMode "cluster" }}
{{- /* a cluster-mode driver pod takes the store credential from the Secret (in the Spark namespace), never from its spec */}}
{{- $_ := set $conf (printf "spark.kubernetes.driver.secretKeyRef.%s" (include "finalckpt.storeSecretEnv" .)) (printf "%s:%s" (include "finalckpt.storeSecretName" .) (include "finalckpt.storeSecretKey" .)) }}
{{- if ne .Values.coordinationDb.mode "external" }}
{{- $_ := set $conf "spark.kubernetes.driverEnv.AIRFLOW__FINALCKPT__STORE_URL" (include "finalckpt.storeUrl" .) }}
{{- end }}
{{- with .Values.codeSigningKey.existingSecret }}
{{- $_ := set $conf "spark.kubernetes.driver.secretKeyRef.AIRFLOW__FINALCKPT__CODE_SIGNING_KEY" (printf "%s:%s" . ($.Values.codeSigningKey.key | default "code-signing-key")) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $k, $v := .Values.spark.conf }}{{ $_ := set $conf $k (toString $v) }}{{ end }}
{{- range $k := keys $conf | sortAlpha }}
{{ $k }} {{ get $conf $k }}
{{- end }}
{{- end }}

{{/*
Pod wiring shared by the jobs of this chart, and printed in NOTES for the official chart:
env from the settings ConfigMap, the store URL Secret, storage credentials, volumes.
*/}}
{{- define "finalckpt.envFrom" -}}
- configMapRef:
    name: {{ include "finalckpt.configMapName" . }}
{{- end }}

{{- define "finalckpt.secretEnv" -}}
- name: {{ include "finalckpt.storeSecretEnv" . }}
  valueFrom:
    secretKeyRef:
      name: {{ include "finalckpt.storeSecretName" . }}
      key: {{ include "finalckpt.storeSecretKey" . }}
{{- if eq .Values.checkpointStorage.mode "objectStore" }}
{{- $creds := .Values.checkpointStorage.objectStore.credentials }}
{{- range $envName := keys $creds.env | sortAlpha }}
- name: {{ $envName }}
  valueFrom:
    secretKeyRef:
      name: {{ $creds.existingSecret }}
      key: {{ get $creds.env $envName }}
{{- end }}
{{- end }}
{{- end }}

{{- define "finalckpt.volumes" -}}
- name: finalckpt-spark-conf
  configMap:
    name: {{ include "finalckpt.sparkConfigMapName" . }}
{{- if eq .Values.checkpointStorage.mode "pvc" }}
- name: finalckpt-checkpoints
  persistentVolumeClaim:
    claimName: {{ include "finalckpt.pvcName" . }}
{{- end }}
{{- end }}

{{- define "finalckpt.volumeMounts" -}}
- name: finalckpt-spark-conf
  mountPath: {{ .Values.spark.confMountPath }}
  readOnly: true
{{- if eq .Values.checkpointStorage.mode "pvc" }}
- name: finalckpt-checkpoints
  mountPath: {{ .Values.checkpointStorage.pvc.mountPath }}
{{- end }}
{{- end }}

{{/*
The jobs' scratch space: their root filesystem is read-only (jobs.securityContext), so /tmp
is an emptyDir and AIRFLOW_HOME lives there (Airflow writes a default airflow.cfg on start).
*/}}
{{- define "finalckpt.jobScratchVolume" -}}
- name: finalckpt-tmp
  emptyDir: {}
{{- end }}

{{- define "finalckpt.jobScratchMount" -}}
- name: finalckpt-tmp
  mountPath: /tmp
{{- end }}

{{- define "finalckpt.jobScratchEnv" -}}
- name: AIRFLOW_HOME
  value: /tmp/airflow
{{- end }}

{{- define "finalckpt.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.jobs.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
automountServiceAccountToken: false
{{- with .Values.jobs.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.jobs.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.jobs.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.jobs.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The values to merge into the official apache-airflow chart (printed by NOTES, used in
docs/operations.md): the plugin image, env from our ConfigMap and Secrets (the store URL, object
store credentials, the CLI's Airflow login), and the volumes.
*/}}
{{- define "finalckpt.officialChartValues" -}}
images:
  airflow:
    repository: {{ .Values.image.repository }}
    tag: {{ default .Chart.AppVersion .Values.image.tag | quote }}
extraEnvFrom: |
  {{- include "finalckpt.envFrom" . | nindent 2 }}
secret:
  - envName: {{ include "finalckpt.storeSecretEnv" . }}
    secretName: {{ include "finalckpt.storeSecretName" . }}
    secretKey: {{ include "finalckpt.storeSecretKey" . }}
{{- if eq .Values.checkpointStorage.mode "objectStore" }}
{{- $creds := .Values.checkpointStorage.objectStore.credentials }}
{{- range $envName := keys $creds.env | sortAlpha }}
  - envName: {{ $envName }}
    secretName: {{ $creds.existingSecret }}
    secretKey: {{ get $creds.env $envName }}
{{- end }}
{{- end }}
{{- with .Values.codeSigningKey.existingSecret }}
  - envName: AIRFLOW__FINALCKPT__CODE_SIGNING_KEY
    secretName: {{ . }}
    secretKey: {{ $.Values.codeSigningKey.key | default "code-signing-key" }}
{{- end }}
{{- with include "finalckpt.apiLoginSecretEnv" . | trim }}
  {{- . | nindent 2 }}
{{- end }}
volumes:
  {{- include "finalckpt.volumes" . | nindent 2 }}
volumeMounts:
  {{- include "finalckpt.volumeMounts" . | nindent 2 }}
{{- end }}
