{{/* Names and labels. */}}
{{- define "codeq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "codeq.fullname" -}}
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

{{- define "codeq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "codeq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "codeq.labels" -}}
{{ include "codeq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "codeq.jobsServiceAccount" -}}{{ include "codeq.fullname" . }}-jobs{{- end -}}
{{- define "codeq.workflowServiceAccount" -}}{{ include "codeq.fullname" . }}-workflow{{- end -}}
{{- define "codeq.configMap" -}}{{ include "codeq.fullname" . }}-config{{- end -}}
{{- define "codeq.workflowTemplate" -}}{{ include "codeq.fullname" . }}-round{{- end -}}

{{- define "codeq.s3Secret" -}}
{{- default (printf "%s-s3" (include "codeq.fullname" .)) .Values.s3Credentials.existingSecret -}}
{{- end -}}

{{/* Image of a stage: train uses the train image, every other stage the infer image. */}}
{{- define "codeq.image" -}}
{{- $image := ternary .root.Values.images.train .root.Values.images.infer (eq .stage "train") -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $image.tag -}}
{{- end -}}
{{- end -}}

{{/*
One stage as a batch/v1 Job manifest, embedded in an Argo resource template. Argo expressions are
escaped ({{`{{...}}`}}) so Helm leaves them for Argo to substitute at submit time.
Arguments: dict "root" $ "stage" NAME.
*/}}
{{- define "codeq.job" -}}
{{- $root := .root -}}
{{- $stage := .stage -}}
{{- $s := index $root.Values.stages $stage -}}
{{- $pool := index $root.Values.pools $s.pool -}}
{{- $indexed := eq $stage "collect" -}}
apiVersion: batch/v1
kind: Job
metadata:
  generateName: "{{`{{workflow.name}}`}}-{{ $stage }}-"
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "codeq.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $stage }}
    codeq.io/stage: {{ $stage }}
    codeq.io/round: {{`"{{workflow.parameters.round}}"`}}
    workflows.argoproj.io/workflow: {{`"{{workflow.name}}"`}}
  annotations:
    codeq.io/run: {{`"{{workflow.parameters.run}}"`}}
    checkov.io/skip1: CKV_K8S_43=Images are referenced by tag by default so a release can be installed as-is; set images.*.digest to pin digests in production.
    {{- if $s.sandbox }}
    checkov.io/skip2: CKV_K8S_31=Sandbox stages run rootless gVisor (runsc), which needs unshare(CLONE_NEWUSER), mount and pivot_root that RuntimeDefault seccomp denies without CAP_SYS_ADMIN; the profile is sandbox.seccompProfile (Localhost supported), no capability is added.
    {{- end }}
    {{- if ne $root.Values.images.pullPolicy "Always" }}
    checkov.io/skip3: CKV_K8S_15=images.pullPolicy is set to {{ $root.Values.images.pullPolicy }} on purpose (kind loads locally built images into its nodes; Always would try a registry that does not hold them).
    {{- end }}
spec:
  {{- if $indexed }}
  completionMode: Indexed
  completions: {{ $s.shards }}
  parallelism: {{ $s.shards }}
  backoffLimitPerIndex: {{ $s.backoffLimitPerIndex }}
  {{- if not (kindIs "invalid" $s.maxFailedIndexes) }}
  maxFailedIndexes: {{ $s.maxFailedIndexes }}
  {{- end }}
  {{- else }}
  completions: 1
  parallelism: 1
  backoffLimit: {{ $s.backoffLimit }}
  {{- end }}
  podReplacementPolicy: Failed
  activeDeadlineSeconds: {{ $s.activeDeadlineSeconds }}
  ttlSecondsAfterFinished: {{ $root.Values.jobs.ttlSecondsAfterFinished }}
  podFailurePolicy:
    rules:
      # Preemption, eviction, node drain: not the program's fault, retry without counting.
      - action: Ignore
        onPodConditions:
          - type: DisruptionTarget
      # Exit 2 (bad input) and 3 (stage failed deterministically): retrying cannot help.
      - action: {{ ternary "FailIndex" "FailJob" $indexed }}
        onExitCodes:
          containerName: {{ $stage }}
          operator: In
          values: [2, 3]
  template:
    metadata:
      labels:
        {{- include "codeq.selectorLabels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $stage }}
        codeq.io/stage: {{ $stage }}
        codeq.io/job: "true"
        codeq.io/round: {{`"{{workflow.parameters.round}}"`}}
        workflows.argoproj.io/workflow: {{`"{{workflow.name}}"`}}
    spec:
      restartPolicy: Never
      serviceAccountName: {{ include "codeq.jobsServiceAccount" $root }}
      automountServiceAccountToken: false
      enableServiceLinks: false
      {{- with $root.Values.images.pullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      {{- with $pool.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $pool.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: {{ $root.Values.jobs.runAsUser }}
        runAsGroup: {{ $root.Values.jobs.runAsGroup }}
        fsGroup: {{ $root.Values.jobs.runAsGroup }}
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: {{ $stage }}
          image: {{ include "codeq.image" (dict "root" $root "stage" $stage) }}
          imagePullPolicy: {{ $root.Values.images.pullPolicy }}
          command: ["python", "-m", "jobs.{{ $stage }}"]
          workingDir: /scratch
          env:
            - name: CODEQ_CONFIG_FILE
              value: /etc/codeq/config.yaml
            - name: CODEQ_STORE__URI
              value: {{ $root.Values.store.uri | quote }}
            - name: CODEQ_STORE__RUN
              value: {{`"{{workflow.parameters.run}}"`}}
            - name: CODEQ_STORE__ROUND
              value: {{`"{{workflow.parameters.round}}"`}}
            {{- with $root.Values.store.endpointUrl }}
            - name: CODEQ_STORE__ENDPOINT_URL
              value: {{ . | quote }}
            {{- end }}
            {{- with $root.Values.store.region }}
            - name: CODEQ_STORE__REGION
              value: {{ . | quote }}
            - name: AWS_DEFAULT_REGION
              value: {{ . | quote }}
            {{- end }}
            {{- if eq $root.Values.s3Credentials.mode "secret" }}
            - name: AWS_SHARED_CREDENTIALS_FILE
              value: /var/run/secrets/codeq/s3/credentials
            {{- end }}
            {{- if $indexed }}
            - name: JOB_COMPLETION_COUNT
              value: {{ $s.shards | quote }}
            {{- end }}
            - name: CODEQ_SCRATCH_DIR
              value: /scratch
            - name: CODEQ_WORK_DIR
              value: /scratch/work
            - name: CODEQ_POLICY__CACHE_DIR
              value: /scratch/cache/codeq
            - name: HOME
              value: /scratch
            - name: XDG_CACHE_HOME
              value: /scratch/cache
            - name: HF_HOME
              value: /scratch/cache/huggingface
            - name: TMPDIR
              value: /tmp
            - name: PYTHONUNBUFFERED
              value: "1"
            {{- with $root.Values.jobs.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          resources:
            requests:
              {{- toYaml $s.resources.requests | nindent 14 }}
            limits:
              {{- toYaml $s.resources.limits | nindent 14 }}
              nvidia.com/gpu: {{ $s.gpus }}
          securityContext:
            runAsNonRoot: true
            runAsUser: {{ $root.Values.jobs.runAsUser }}
            runAsGroup: {{ $root.Values.jobs.runAsGroup }}
            allowPrivilegeEscalation: false
            privileged: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: ["ALL"]
            {{- if $s.sandbox }}
            seccompProfile:
              {{- toYaml $root.Values.sandbox.seccompProfile | nindent 14 }}
            appArmorProfile:
              {{- toYaml $root.Values.sandbox.appArmorProfile | nindent 14 }}
            {{- else }}
            seccompProfile:
              type: RuntimeDefault
            appArmorProfile:
              type: RuntimeDefault
            {{- end }}
          volumeMounts:
            - name: config
              mountPath: /etc/codeq
              readOnly: true
            {{- if eq $root.Values.s3Credentials.mode "secret" }}
            - name: s3-credentials
              mountPath: /var/run/secrets/codeq/s3
              readOnly: true
            {{- end }}
            - name: dshm
              mountPath: /dev/shm
            - name: scratch
              mountPath: /scratch
            - name: tmp
              mountPath: /tmp
            {{- if $root.Values.model.existingClaim }}
            - name: models
              mountPath: /models
              readOnly: true
            {{- end }}
      volumes:
        - name: config
          configMap:
            name: {{ include "codeq.configMap" $root }}
        {{- if eq $root.Values.s3Credentials.mode "secret" }}
        - name: s3-credentials
          secret:
            secretName: {{ include "codeq.s3Secret" $root }}
            defaultMode: 0440
        {{- end }}
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $root.Values.jobs.shmSizeLimit }}
        - name: scratch
          emptyDir:
            sizeLimit: {{ $root.Values.jobs.scratchSizeLimit }}
        - name: tmp
          emptyDir:
            sizeLimit: {{ $root.Values.jobs.tmpSizeLimit }}
        {{- if $root.Values.model.existingClaim }}
        - name: models
          persistentVolumeClaim:
            claimName: {{ $root.Values.model.existingClaim }}
            readOnly: true
        {{- end }}
{{- end -}}
