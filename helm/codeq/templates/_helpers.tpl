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
{{- define "codeq.scriptsConfigMap" -}}{{ include "codeq.fullname" . }}-scripts{{- end -}}
{{- define "codeq.workflowTemplate" -}}{{ include "codeq.fullname" . }}-round{{- end -}}

{{- define "codeq.s3Secret" -}}
{{- default (printf "%s-s3" (include "codeq.fullname" .)) .Values.s3Credentials.existingSecret -}}
{{- end -}}

{{/* The model cache claim: an existing one, the chart-made one, or empty. */}}
{{- define "codeq.modelClaim" -}}
{{- if .Values.model.cache.existingClaim -}}
{{- .Values.model.cache.existingClaim -}}
{{- else if .Values.model.cache.create -}}
{{- include "codeq.fullname" . }}-models
{{- end -}}
{{- end -}}

{{/* Which image a stage runs in: the train image for the stages that train a LoRA (train, and
the learned verifier), the infer image (which holds runsc) for every other stage and the helpers. */}}
{{- define "codeq.imageKind" -}}{{ ternary "train" "infer" (has . (list "train" "verifier")) }}{{- end -}}

{{/* Image of a stage (codeq.imageKind). Arguments: dict "root" $ "stage" NAME. */}}
{{- define "codeq.image" -}}
{{- $image := index .root.Values.images (include "codeq.imageKind" .stage) -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $image.tag -}}
{{- end -}}
{{- end -}}

{{/*
Scheduling of a pod: the node selector and tolerations of its pool, each replaced by the
stage's own when set, and the pool's affinity and (for pod specs, not Argo's workflow spec)
RuntimeClass. Arguments: dict "root" $ "pool" NAME "nodeSelector" X "tolerations" Y, and
"runtimeClass" BOOL.
*/}}
{{- define "codeq.pool" -}}
{{- $pool := index .root.Values.pools .pool -}}
{{- if not $pool -}}
{{- fail (printf "pool %q is not defined under `pools` (defined: %s)" .pool (keys .root.Values.pools | sortAlpha | join ", ")) -}}
{{- end -}}
{{- toJson $pool -}}
{{- end -}}

{{- define "codeq.placement" -}}
{{- $pool := include "codeq.pool" . | fromJson -}}
{{- $selector := ternary $pool.nodeSelector .nodeSelector (kindIs "invalid" .nodeSelector) -}}
{{- $tolerations := ternary $pool.tolerations .tolerations (kindIs "invalid" .tolerations) -}}
{{- with $selector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $pool.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .runtimeClass }}
{{- with $pool.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level security context of every CodeQ pod. */}}
{{- define "codeq.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.jobs.runAsUser }}
runAsGroup: {{ .Values.jobs.runAsGroup }}
fsGroup: {{ .Values.jobs.runAsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
The sandbox seccomp profile as the chart installs it (files/seccomp/codeq-sandbox.json, one file
for the chart and the tests). Its path under the kubelet's seccomp root depends on who installs
it: the chart's DaemonSet, the Security Profiles Operator, or you (sandbox.seccompInstall).
*/}}
{{- define "codeq.seccompFile" -}}files/seccomp/codeq-sandbox.json{{- end -}}
{{- define "codeq.seccompName" -}}{{ include "codeq.fullname" . }}-sandbox{{- end -}}
{{- define "codeq.seccompDaemonSetDir" -}}codeq/{{ .Release.Namespace }}{{- end -}}
{{- define "codeq.seccompLocalhostPath" -}}
{{- $method := .Values.sandbox.seccompInstall.method -}}
{{- if eq $method "daemonset" -}}
{{ include "codeq.seccompDaemonSetDir" . }}/{{ include "codeq.seccompName" . }}.json
{{- else if eq $method "operator" -}}
operator/{{ .Release.Namespace }}/{{ include "codeq.seccompName" . }}.json
{{- end -}}
{{- end -}}

{{/* seccompProfile of the sandbox stages' containers (sandbox.seccompProfile, with an empty
localhostProfile filled in from sandbox.seccompInstall). */}}
{{- define "codeq.sandboxSeccompProfile" -}}
{{- $profile := .Values.sandbox.seccompProfile -}}
type: {{ $profile.type }}
{{- if eq $profile.type "Localhost" }}
{{- $path := $profile.localhostProfile | default (include "codeq.seccompLocalhostPath" .) }}
{{- if not $path }}
{{- fail "sandbox.seccompProfile is Localhost with no localhostProfile and sandbox.seccompInstall.method=none: name the profile installed on your nodes, or let the chart install its own (method daemonset or operator)" }}
{{- end }}
localhostProfile: {{ $path }}
{{- end }}
{{- end -}}

{{/*
Container security context. Sandbox containers get the seccomp and AppArmor profiles of
`sandbox` (runsc needs unshare/mount); the others RuntimeDefault seccomp and, only when asked
for, an AppArmor profile (nodes without AppArmor reject pods that name one).
Arguments: dict "root" $ "sandbox" BOOL.
*/}}
{{- define "codeq.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .root.Values.jobs.runAsUser }}
runAsGroup: {{ .root.Values.jobs.runAsGroup }}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- if .sandbox }}
seccompProfile:
  {{- include "codeq.sandboxSeccompProfile" .root | nindent 2 }}
appArmorProfile:
  {{- toYaml .root.Values.sandbox.appArmorProfile | nindent 2 }}
{{- else }}
seccompProfile:
  type: RuntimeDefault
{{- with .root.Values.jobs.appArmorProfile }}
appArmorProfile:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
Environment of a CodeQ container. Arguments: dict "root" $ "stage" NAME "round" EXPR, where
EXPR is the (Argo) expression of the round number or request.
*/}}
{{- define "codeq.env" -}}
{{- $root := .root -}}
- name: CODEQ_CONFIG_FILE
  value: /etc/codeq/config.yaml
- name: CODEQ_STORE__URI
  value: {{ $root.Values.store.uri | quote }}
- name: CODEQ_STORE__RUN
  value: {{`"{{workflow.parameters.run}}"`}}
- name: CODEQ_STORE__ROUND
  value: {{ .round | quote }}
- name: CODEQ_FORCE
  value: {{`"{{workflow.parameters.force}}"`}}
{{- with $root.Values.store.endpointUrl }}
- name: CODEQ_STORE__ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with $root.Values.store.checksums }}
- name: CODEQ_STORE__CHECKSUMS
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
{{- if eq .stage "collect" }}
- name: JOB_COMPLETION_COUNT
  value: {{ $root.Values.stages.collect.shards | quote }}
{{- else if and (eq .stage "evaluate") (gt (int $root.Values.stages.evaluate.shards) 1) }}
- name: JOB_COMPLETION_COUNT
  value: {{ $root.Values.stages.evaluate.shards | quote }}
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
{{- if $root.Values.huggingface.tokenSecret }}
- name: HF_TOKEN_PATH
  value: /var/run/secrets/codeq/huggingface/token
{{- end }}
- name: TMPDIR
  value: /tmp
- name: PYTHONUNBUFFERED
  value: "1"
{{- if eq .stage "train" }}
{{- include "codeq.trainProcesses" $root }}
{{- end }}
{{- if and (eq .stage "train") (ne $root.Values.tracking.reportTo "none") }}
- name: CODEQ_TRAIN__REPORT_TO
  value: {{ $root.Values.tracking.reportTo | quote }}
{{- range $key, $value := $root.Values.tracking.env }}
- name: {{ $key }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- with $root.Values.jobs.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Data-parallel training: a train Job with N > 1 GPUs runs N training processes, one per GPU
(codeq/train/distributed.py). config.train.processes set beside GPUs must agree with them.
*/}}
{{- define "codeq.trainProcesses" -}}
{{- $gpus := int .Values.stages.train.gpus -}}
{{- $processes := dig "train" "processes" nil (.Values.config | default dict) -}}
{{- if and (ge $gpus 1) (not (kindIs "invalid" $processes)) (ne (int $processes) $gpus) -}}
{{- fail (printf "config.train.processes=%v but stages.train.gpus=%d: on GPUs the train Job runs one process per GPU; remove config.train.processes" $processes $gpus) -}}
{{- end -}}
{{- if gt $gpus 1 }}
- name: CODEQ_TRAIN__PROCESSES
  value: {{ $gpus | quote }}
{{- end -}}
{{- end -}}

{{/*
Volume mounts of a CodeQ container (the volumes below). Arguments: dict "root" $ "models" BOOL,
and "extraMounts" LIST (extra VolumeMounts; one at /scratch, /tmp or /dev/shm replaces the
chart's emptyDir there).
*/}}
{{- define "codeq.volumeMounts" -}}
{{- $taken := list -}}
{{- range .extraMounts }}{{ $taken = append $taken .mountPath }}{{ end -}}
- name: config
  mountPath: /etc/codeq
  readOnly: true
{{- if eq .root.Values.s3Credentials.mode "secret" }}
- name: s3-credentials
  mountPath: /var/run/secrets/codeq/s3
  readOnly: true
{{- end }}
{{- if .root.Values.huggingface.tokenSecret }}
- name: huggingface-token
  mountPath: /var/run/secrets/codeq/huggingface
  readOnly: true
{{- end }}
{{- range $name, $path := dict "dshm" "/dev/shm" "scratch" "/scratch" "tmp" "/tmp" }}
{{- if not (has $path $taken) }}
- name: {{ $name }}
  mountPath: {{ $path }}
{{- end }}
{{- end }}
{{- if and .models (include "codeq.modelClaim" .root) }}
- name: models
  mountPath: /models
  readOnly: true
{{- end }}
{{- with .extraMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Volumes of a CodeQ pod. Arguments: dict "root" $ "sizes" {scratch, tmp, shm} "models" BOOL, and
"extraVolumes" / "extraMounts" LISTs (an emptyDir whose path an extra mount takes is left out).
*/}}
{{- define "codeq.volumes" -}}
{{- $taken := list -}}
{{- range .extraMounts }}{{ $taken = append $taken .mountPath }}{{ end -}}
- name: config
  configMap:
    name: {{ include "codeq.configMap" .root }}
{{- if eq .root.Values.s3Credentials.mode "secret" }}
- name: s3-credentials
  secret:
    secretName: {{ include "codeq.s3Secret" .root }}
    defaultMode: 0440
{{- end }}
{{- with .root.Values.huggingface.tokenSecret }}
- name: huggingface-token
  secret:
    secretName: {{ . }}
    defaultMode: 0440
    items:
      - key: {{ $.root.Values.huggingface.tokenSecretKey }}
        path: token
{{- end }}
{{- if not (has "/dev/shm" $taken) }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .sizes.shm }}
{{- end }}
{{- if not (has "/scratch" $taken) }}
- name: scratch
  emptyDir:
    sizeLimit: {{ .sizes.scratch }}
{{- end }}
{{- if not (has "/tmp" $taken) }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .sizes.tmp }}
{{- end }}
{{- if .models }}
{{- with include "codeq.modelClaim" .root }}
- name: models
  persistentVolumeClaim:
    claimName: {{ . }}
    readOnly: true
{{- end }}
{{- end }}
{{- with .extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The extra volumes and mounts of a stage (jobs.* then stages.<stage>.*), checked at render time:
no name the chart uses, no two mounts on one path, every mount naming a volume of the pod.
Arguments: dict "root" $ "stage" NAME; prints {"volumes": [...], "mounts": [...]} as JSON.
*/}}
{{- define "codeq.extraVolumes" -}}
{{- $root := .root -}}
{{- $s := index $root.Values.stages .stage -}}
{{- $volumes := concat ($root.Values.jobs.extraVolumes | default list) ($s.extraVolumes | default list) -}}
{{- $mounts := concat ($root.Values.jobs.extraVolumeMounts | default list) ($s.extraVolumeMounts | default list) -}}
{{- $chart := list "config" "s3-credentials" "huggingface-token" "dshm" "scratch" "tmp" "models" -}}
{{- $names := list -}}
{{- range $volumes -}}
{{- if or (has .name $chart) (has .name $names) -}}
{{- fail (printf "stages.%s: extra volume %q is used twice or is one of the chart's own (%s)" $.stage .name (join ", " $chart)) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $paths := list -}}
{{- range $mounts -}}
{{- if not (has .name $names) -}}
{{- fail (printf "stages.%s: extra volume mount %q at %s names no volume in jobs.extraVolumes or stages.%s.extraVolumes" $.stage .name .mountPath $.stage) -}}
{{- end -}}
{{- if has .mountPath $paths -}}
{{- fail (printf "stages.%s: two extra volume mounts at %s" $.stage .mountPath) -}}
{{- end -}}
{{- $paths = append $paths .mountPath -}}
{{- end -}}
{{- toJson (dict "volumes" $volumes "mounts" $mounts) -}}
{{- end -}}

{{/* The name of a stage's Job in a round (the template's `round` input): deterministic, so a
retried Argo step adopts it, and one per round of a multi-round workflow. */}}
{{- define "codeq.jobName" -}}
{{`{{workflow.name}}-r{{inputs.parameters.round}}`}}-{{ . }}
{{- end -}}


{{/*
One stage as a batch/v1 Job manifest, embedded in an Argo resource template. Argo expressions are
escaped ({{`{{...}}`}}) so Helm leaves them for Argo to substitute at run time.
Arguments: dict "root" $ "stage" NAME.
*/}}
{{- define "codeq.job" -}}
{{- $root := .root -}}
{{- $stage := .stage -}}
{{- $s := index $root.Values.stages $stage -}}
{{- /* Indexed: collect always; evaluate above one shard (one shard stays the plain Job it was). */ -}}
{{- $indexed := or (eq $stage "collect") (and (eq $stage "evaluate") (gt (int $s.shards) 1)) -}}
{{- $imageKind := include "codeq.imageKind" $stage -}}
{{- $round := `{{inputs.parameters.round}}` -}}
{{- $tracking := and (eq $stage "train") (ne $root.Values.tracking.reportTo "none") $root.Values.tracking.existingSecret -}}
{{- $extra := include "codeq.extraVolumes" (dict "root" $root "stage" $stage) | fromJson -}}
{{- $annotations := merge (dict) ($s.podAnnotations | default dict) ($root.Values.jobs.podAnnotations | default dict) -}}
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ include "codeq.jobName" $stage | quote }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "codeq.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $stage }}
    codeq.io/stage: {{ $stage }}
    codeq.io/round: {{ $round | quote }}
    workflows.argoproj.io/workflow: {{`"{{workflow.name}}"`}}
    {{- with $root.Values.scheduling.kueue.queueName }}
    kueue.x-k8s.io/queue-name: {{ . | quote }}
    {{- end }}
    {{- with $root.Values.scheduling.kueue.priorityClass }}
    kueue.x-k8s.io/priority-class: {{ . | quote }}
    {{- end }}
  annotations:
    codeq.io/run: {{`"{{workflow.parameters.run}}"`}}
    {{- include "codeq.checkovSkips" (dict "root" $root "image" $imageKind "sandbox" $s.sandbox "tracking" $tracking) | trim | nindent 4 }}
spec:
  {{- if $indexed }}
  completionMode: Indexed
  completions: {{ $s.shards }}
  parallelism: {{ $s.shards }}
  {{- if eq $stage "evaluate" }}
  backoffLimitPerIndex: {{ $s.backoffLimit }}
  # The merge needs every shard: the first one that fails for good fails the Job.
  maxFailedIndexes: 0
  {{- else }}
  backoffLimitPerIndex: {{ $s.backoffLimitPerIndex }}
  {{- if not (kindIs "invalid" $s.maxFailedIndexes) }}
  maxFailedIndexes: {{ $s.maxFailedIndexes }}
  {{- end }}
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
            status: "True"
      # Exit 2 (bad input) and 3 (stage failed deterministically): retrying cannot help.
      - action: {{ ternary "FailIndex" "FailJob" $indexed }}
        onExitCodes:
          containerName: main
          operator: In
          values: [2, 3]
  template:
    metadata:
      labels:
        {{- include "codeq.selectorLabels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $stage }}
        codeq.io/stage: {{ $stage }}
        codeq.io/job: "true"
        codeq.io/round: {{ $round | quote }}
        # `argo logs <workflow>` lists the workflow's pods by this label and reads container "main".
        workflows.argoproj.io/workflow: {{`"{{workflow.name}}"`}}
      {{- with $annotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      restartPolicy: Never
      serviceAccountName: {{ include "codeq.jobsServiceAccount" $root }}
      automountServiceAccountToken: false
      enableServiceLinks: false
      terminationGracePeriodSeconds: {{ $root.Values.jobs.terminationGracePeriodSeconds }}
      {{- with (default $root.Values.scheduling.priorityClassName $s.priorityClassName) }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $root.Values.images.pullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      {{- include "codeq.placement" (dict "root" $root "pool" $s.pool "nodeSelector" $s.nodeSelector "tolerations" $s.tolerations "runtimeClass" true) | trim | nindent 6 }}
      securityContext:
        {{- include "codeq.podSecurityContext" $root | nindent 8 }}
      containers:
        - name: main
          image: {{ include "codeq.image" (dict "root" $root "stage" $stage) }}
          imagePullPolicy: {{ $root.Values.images.pullPolicy }}
          # `args`, not `command`: the image's ENTRYPOINT (an init, then `exec`) stays in front,
          # so SIGTERM reaches python, which stops the stage cleanly (exit 143).
          args: ["python", "-m", "jobs.{{ $stage }}"]
          workingDir: /scratch
          env:
            {{- include "codeq.env" (dict "root" $root "stage" $stage "round" $round) | nindent 12 }}
          {{- if $tracking }}
          envFrom:
            - secretRef:
                name: {{ $root.Values.tracking.existingSecret }}
          {{- end }}
          resources:
            requests:
              {{- toYaml $s.resources.requests | nindent 14 }}
            limits:
              {{- toYaml $s.resources.limits | nindent 14 }}
              nvidia.com/gpu: {{ $s.gpus }}
          securityContext:
            {{- include "codeq.containerSecurityContext" (dict "root" $root "sandbox" $s.sandbox) | nindent 12 }}
          volumeMounts:
            {{- include "codeq.volumeMounts" (dict "root" $root "models" true "extraMounts" $extra.mounts) | nindent 12 }}
      volumes:
        {{- include "codeq.volumes" (dict "root" $root "sizes" $s.volumes "models" true "extraVolumes" $extra.volumes "extraMounts" $extra.mounts) | nindent 8 }}
{{- end -}}

{{/* NetworkPolicy egress rules shared by stage and workflow pods: cluster DNS and S3. */}}
{{- define "codeq.egressDnsAndS3" -}}
- to:
    - namespaceSelector:
        matchLabels:
          {{- toYaml .Values.networkPolicy.dns.namespaceSelector | nindent 10 }}
      podSelector:
        matchLabels:
          {{- toYaml .Values.networkPolicy.dns.podSelector | nindent 10 }}
  ports:
    - protocol: UDP
      port: 53
    - protocol: TCP
      port: 53
- to:
    {{- if .Values.networkPolicy.s3.podSelector }}
    - podSelector:
        matchLabels:
          {{- toYaml .Values.networkPolicy.s3.podSelector | nindent 10 }}
      {{- with .Values.networkPolicy.s3.namespaceSelector }}
      namespaceSelector:
        matchLabels:
          {{- toYaml . | nindent 10 }}
      {{- end }}
    {{- else }}
    {{- range .Values.networkPolicy.s3.cidrs }}
    - ipBlock:
        cidr: {{ . }}
        {{- with $.Values.networkPolicy.s3.exceptCidrs }}
        except:
          {{- toYaml . | nindent 10 }}
        {{- end }}
    {{- end }}
    {{- end }}
  ports:
    {{- range .Values.networkPolicy.s3.ports }}
    - protocol: TCP
      port: {{ . }}
    {{- end }}
{{- end -}}

{{/*
checkov skips, as `checkov.io/skipN: CHECK=reason` annotations (checkov reads the check before "="
and the reason is the text after it); each one is emitted only where its reason holds.
Arguments: dict "root" $ "image" infer|train, and the booleans "sandbox" (runs runsc),
"tracking" (tracking credentials from env), "oneShot" (an Argo step pod, no Job around it),
"token" (talks to the Kubernetes API), "installer" (the seccomp profile DaemonSet).
*/}}
{{- define "codeq.checkovSkips" -}}
{{- $root := .root -}}
{{- if not (index $root.Values.images .image).digest }}
checkov.io/skip1: "CKV_K8S_43=images.{{ .image }}.digest is empty, so this install pulls by tag; set the digests that .github/workflows/images.yml prints to pin the image."
{{- end }}
{{- if .sandbox }}
checkov.io/skip2: "CKV_K8S_31=Sandbox stages run rootless gVisor (runsc), which needs clone with namespace flags, mount, umount2, pivot_root and chroot that RuntimeDefault seccomp denies without CAP_SYS_ADMIN; the profile is sandbox.seccompProfile ({{ $root.Values.sandbox.seccompProfile.type }}{{ if eq $root.Values.sandbox.seccompProfile.type "Localhost" }}: the runtime default plus those five calls, files/seccomp/codeq-sandbox.json{{ end }}), no capability is added."
{{- end }}
{{- if ne $root.Values.images.pullPolicy "Always" }}
checkov.io/skip3: "CKV_K8S_15=images.pullPolicy is set to {{ $root.Values.images.pullPolicy }} on purpose (kind loads locally built images into its nodes; Always would try a registry that does not hold them)."
{{- end }}
{{- if .tracking }}
checkov.io/skip4: "CKV_K8S_35=The W&B and MLflow clients read their credentials only from environment variables (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN); tracking.existingSecret reaches the train container only, and only when tracking.reportTo is set."
{{- end }}
{{- if .oneShot }}
checkov.io/skip5: "CKV_K8S_8=A run-to-completion Argo step (it prints a number, or waits for, fences or releases Jobs, then exits); there is no long-running service whose liveness a probe could check."
checkov.io/skip6: "CKV_K8S_9=A run-to-completion Argo step with no server and no traffic to route, so a readiness probe has nothing to report."
{{- end }}
{{- if .installer }}
checkov.io/skip8: "CKV_K8S_8=The seccomp installer's container only keeps its pod on the node after the init container wrote the profile; restarting it could not repair anything, so its readiness probe reports whether the node's file is the chart's instead."
{{- end }}
{{- if .token }}
checkov.io/skip7: "CKV_K8S_38=This step reads, stops or labels the run's Jobs (and reads its Workflow) through the Kubernetes API, so it needs the workflow ServiceAccount's token (Role: Jobs in this namespace, get on Workflows)."
{{- end }}
{{- end -}}

{{/* Seconds in a Go duration such as "6h", "90m" or "1h30m" (workflow.startTimeout), rounded up. */}}
{{- define "codeq.durationSeconds" -}}
{{- $scale := dict "ns" 0.000000001 "us" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h)" . -1 -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 -}}
{{- $unit := regexReplaceAll "^[0-9]+(\\.[0-9]+)?" . "" -}}
{{- $total = addf $total (mulf $number (index $scale $unit)) -}}
{{- end -}}
{{- ceil $total | int -}}
{{- end -}}

{{/*
A round's deadline: what its stages may take, each its Job's activeDeadlineSeconds (counted from
the Job's start) plus workflow.startTimeout (how long it may wait to start), plus an hour for the
workflow's own steps (pod starts, image pulls, the round number, the fence, `continue`).
*/}}
{{- define "codeq.stageNames" -}}
prepare collect {{ if include "codeq.verifierEnabled" . }}verifier {{ end }}pairs train evaluate promote report
{{- end -}}
{{- define "codeq.roundDeadline" -}}
{{- $stages := splitList " " (include "codeq.stageNames" .) -}}
{{- $start := include "codeq.durationSeconds" .Values.workflow.startTimeout | int -}}
{{- $needed := 3600 -}}
{{- range $stages -}}
{{- $needed = add $needed (index $.Values.stages .).activeDeadlineSeconds $start -}}
{{- end -}}
{{- $needed -}}
{{- end -}}

{{/*
The workflow's activeDeadlineSeconds: workflow.maxRounds rounds, each its round deadline (a
submission asks for its `rounds` only when Argo runs it, too late to compute anything here;
resolve-round refuses more than workflow.maxRounds). workflow.activeDeadlineSeconds replaces
it, but never with less.
*/}}
{{- define "codeq.workflowDeadline" -}}
{{- $round := include "codeq.roundDeadline" . | int -}}
{{- $rounds := int .Values.workflow.maxRounds -}}
{{- $needed := mul $round $rounds -}}
{{- $set := .Values.workflow.activeDeadlineSeconds -}}
{{- if kindIs "invalid" $set -}}
{{- $needed -}}
{{- else if lt (int $set) (int $needed) -}}
{{- fail (printf "workflow.activeDeadlineSeconds=%d is shorter than workflow.maxRounds=%d round(s) may take (%d s: %d s a round, the stages' activeDeadlineSeconds, workflow.startTimeout per stage and 3600 s for the workflow's own steps); leave it null to derive it, or lower workflow.maxRounds or the stages' deadlines" (int $set) $rounds (int $needed) $round) -}}
{{- else -}}
{{- int $set -}}
{{- end -}}
{{- end -}}

{{/*
Store and identity combinations that cannot work fail `helm install` with one line naming the
value: an identity the store cannot use is worse than none, because it fails hours later in a
pod. The jobs reach the store with boto3 (S3 API) only.
*/}}
{{- define "codeq.validateStore" -}}
{{- $endpoint := .Values.store.endpointUrl | default "" -}}
{{- $host := (urlParse (default "https://s3.amazonaws.com" $endpoint)).host | default "" -}}
{{- $gcs := or (eq $host "storage.googleapis.com") (hasSuffix ".storage.googleapis.com" $host) -}}
{{- $annotations := .Values.serviceAccount.jobs.annotations | default dict -}}
{{- if hasKey $annotations "iam.gke.io/gcp-service-account" -}}
{{- fail "serviceAccount.jobs.annotations.iam.gke.io/gcp-service-account: GKE Workload Identity yields Google credentials, which the store's S3 client (boto3) cannot use; for GCS use s3Credentials.mode=secret with HMAC keys and store.endpointUrl=https://storage.googleapis.com (docs/cluster.md)" -}}
{{- end -}}
{{- if eq .Values.s3Credentials.mode "serviceAccount" -}}
{{- if not (hasKey $annotations "eks.amazonaws.com/role-arn") -}}
{{- fail "s3Credentials.mode=serviceAccount needs serviceAccount.jobs.annotations.eks.amazonaws.com/role-arn (EKS IRSA, the one ServiceAccount identity boto3 turns into S3 credentials); elsewhere use s3Credentials.mode=secret" -}}
{{- end -}}
{{- if and $endpoint (not (regexMatch "(^|\\.)amazonaws\\.com(\\.cn)?$" $host)) -}}
{{- fail (printf "store.endpointUrl=%s cannot be reached with s3Credentials.mode=serviceAccount: IRSA yields AWS credentials, which only AWS S3 accepts; use s3Credentials.mode=secret with that store's keys" $endpoint) -}}
{{- end -}}
{{- end -}}
{{- if and $gcs (ne .Values.store.checksums "when_required") -}}
{{- fail (printf "store.checksums=%s: GCS's S3 interface (store.endpointUrl=%s) refuses the checksums boto3 sends by default; set store.checksums=when_required" .Values.store.checksums $endpoint) -}}
{{- end -}}
{{- end -}}

{{/*
The learned verifier (codeq/pipeline/verifier.py): unless config.verifier.enabled is false (codeq's
default is true) every round runs the `verifier` stage between collect and pairs, as its own Job
in the train image on stages.verifier's pool. Prints "true" when it does, nothing otherwise.
*/}}
{{- define "codeq.verifierEnabled" -}}
{{- if dig "verifier" "enabled" true (.Values.config | default dict) -}}true{{- end -}}
{{- end -}}

{{/*
Verifier settings that cannot work fail `helm install` with one line naming the value, not a
stage hours into a round: a stage that asks for a verifier no stage trains, a verifier without
the GPU its config trains on, and a verifier that would have to run programs in a sandbox its
image does not hold. (Pairs reads the scores the verifier stage wrote: no GPU of its own.)
*/}}
{{- define "codeq.validateVerifier" -}}
{{- $config := .Values.config | default dict -}}
{{- $enabled := include "codeq.verifierEnabled" . -}}
{{- $device := dig "policy" "device" "auto" $config -}}
{{- $fallback := dig "verifier" "fallback" "critique" $config -}}
{{- range .Values.jobs.extraEnv -}}
{{- if eq .name "CODEQ_VERIFIER__ENABLED" -}}
{{- fail "jobs.extraEnv sets CODEQ_VERIFIER__ENABLED: the chart decides from config.verifier.enabled whether rounds run the verifier stage; set it there" -}}
{{- end -}}
{{- end -}}
{{- range $key := list "pairs.q_ai" "evaluate.tie_break" -}}
{{- $asked := dig (splitList "." $key | first) (splitList "." $key | last) "verifier" $config -}}
{{- if and (eq $asked "verifier") (not $enabled) (ne $fallback "critique") -}}
{{- fail (printf "config.%s=verifier asks for the round's learned verifier, but config.verifier.enabled is not true, so no verifier stage trains one and that stage would stop (config.verifier.fallback=%s); set config.verifier.enabled=true, or config.verifier.fallback=critique" $key $fallback) -}}
{{- end -}}
{{- end -}}
{{- if $enabled -}}
{{- if and (eq $device "cuda") (eq (int .Values.stages.verifier.gpus) 0) -}}
{{- fail "stages.verifier.gpus=0 but config.policy.device=cuda: the verifier stage trains its LoRA on the policy's device; give it stages.verifier.gpus=1, or run on CPU (config.policy.device=cpu)" -}}
{{- end -}}
{{- if and (eq (dig "search" "reward_tests" "all" $config) "visible") (ne (dig "sandbox" "backend" "auto" $config) "subprocess") -}}
{{- fail "config.search.reward_tests=visible with config.verifier.enabled: the verifier stage would label collect's programs by running them on all tests in the sandbox, but it runs in the train image, which has no runsc; collect with config.search.reward_tests=all, which labels every program" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The pod of a workflow step that runs one of the chart's scripts (files/*.py, mounted from the
scripts ConfigMap) in the infer image, with the workflow ServiceAccount and its token: the
fence, each stage's `finish` and the exit handler. Arguments: dict "root" $ "args" LIST (the
script and its arguments, after `python`).
*/}}
{{- define "codeq.scriptStep" -}}
securityContext:
  {{- include "codeq.podSecurityContext" .root | nindent 2 }}
container:
  name: main
  image: {{ include "codeq.image" (dict "root" .root "stage" "script") }}
  imagePullPolicy: {{ .root.Values.images.pullPolicy }}
  command:
    {{- toYaml (concat (list "python") .args) | nindent 4 }}
  resources:
    {{- toYaml .root.Values.workflow.helperResources | nindent 4 }}
  securityContext:
    {{- include "codeq.containerSecurityContext" (dict "root" .root "sandbox" false) | nindent 4 }}
  volumeMounts:
    - name: scripts
      mountPath: /etc/codeq-scripts
      readOnly: true
    - name: tmp
      mountPath: /tmp
volumes:
  - name: scripts
    configMap:
      name: {{ include "codeq.scriptsConfigMap" .root }}
  - name: tmp
    emptyDir:
      sizeLimit: 64Mi
{{- end -}}
