#!/usr/bin/env bash
# Cloud TPU VM launcher for bert_jax: create a TPU VM or pod slice, install the
# project on every worker, start training on every worker, follow logs, copy
# results, stop, delete, and (optionally) recover spot/preemptible VMs.
# `bash launch/tpu.sh --help` for usage; docs/launch.md for a walk-through.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)

usage() {
  cat <<'EOF'
Usage: bash launch/tpu.sh ACTION --name=NAME --zone=ZONE [flags] [--config.KEY=VALUE ...] [-- MAIN_ARGS...]

Actions
  create   create the TPU VM / pod slice
  setup    copy (or clone) the project onto every worker and pip-install it
  train    start training on every worker (same command, in the background;
           --multihost added on pod slices: jax.distributed.initialize() on every host)
  prepare  tokenize a corpus on every worker at once (input_pipeline.prepare_hosts: worker
           i prepares its share of the input files, worker 0 merges; the prepare flags go
           after --, e.g. -- --input='gs://b/c4/*.json.gz' --vocab=gs://b/vocab
           --output_dir=gs://b/prepared/c4); the same output as one machine's prepare
  logs     tail the training log of one worker (--worker=N, default 0)
  copy     copy results: worker logs (default), a gs:// path, or a worker path
  stop     SIGTERM the training on every worker (it checkpoints and exits 0)
  status   VM state and the training state on every worker
  delete   delete the TPU VM

Common flags
  --name=NAME               TPU VM name (required)
  --zone=ZONE               e.g. us-central2-b (required)
  --project=PROJECT         GCP project (default: gcloud's configured project)
  --accelerator_type=TYPE   v4-8 (default), v4-32, v5litepod-16, v5p-8, v6e-8, ...
  --dry_run                 print every command (prefixed "+ ") instead of running it
  --internal_ip             ssh/scp to the workers' internal IPs (VMs without external IPs;
                            run from a machine inside the VPC)
  --tunnel_through_iap      ssh/scp through Identity-Aware Proxy (uses `gcloud alpha`, the
                            only track with --tunnel-through-iap for tpu-vm ssh/scp)
  --ssh_flag=FLAG           extra flag for every tpu-vm ssh/scp (repeatable), e.g.
                            --ssh_flag=--ssh-key-file=~/.ssh/tpu

create
  --runtime_version=VER     default per family: v2/v3/v4 tpu-ubuntu2204-base,
                            v5p v2-alpha-tpuv5, v5litepod v2-alpha-tpuv5-lite, v6e v2-alpha-tpuv6e
  --spot | --preemptible    spot (recommended) or legacy preemptible VM
  --create_flag=FLAG        extra flag for `gcloud ... create` (repeatable), e.g. --create_flag=--network=my-net
  --queued                  request the TPU as a queued resource (`gcloud compute tpus queued-resources
                            create ID --node-id=NAME`, ID = NAME): Google's queue waits for capacity
                            (WAITING_FOR_RESOURCES) instead of failing; the way to get large spot
                            slices. create/delete/status then act on the queued resource
  --valid_until_duration=D  (with --queued) give up the request if not provisioned within D (e.g. 6h)

setup
  --repo=URL [--ref=REF]    git clone URL (checkout REF) on every worker; default: pack the
                            local checkout (git-tracked + untracked, not ignored) and scp it
  --python=python3.11       interpreter for the venv (installed with apt if missing)
  --remote_dir=bert_jax     project directory on the workers, relative to $HOME
  --venv=bert_jax_venv      virtualenv on the workers, relative to $HOME

train
  --config=configs/X.py[:name]   config file, relative to the repository root (required)
  --workdir=gs://BUCKET/DIR      checkpoints + metrics (required; gs:// for pods and spot VMs)
  --config.KEY=VALUE             passed through to bert_jax.main unchanged (repeatable)
  -- ARGS...                     everything after -- is passed through to bert_jax.main
  --env=NAME=VALUE               environment variable for the trainer (repeatable)
  --restart_on_preemption        stay in the foreground and poll the VM; if it is PREEMPTED,
                                 TERMINATED or missing: delete, create, setup and train again
                                 (training resumes from the last checkpoint in --workdir).
                                 Needs the create and setup flags too. Creates the VM if missing.
  --poll_interval=60             seconds between polls
  --max_recoveries=100           give up after this many preemptions (re-creations)
  --max_failures=10              give up after this many consecutive failed steps
  --max_backoff=1800             a create that fails (no capacity) or a FAILED queued request is
                                 retried after --poll_interval, then twice as long each time, up to
                                 this many seconds; neither counts as a recovery
  --max_capacity_wait=86400      give up after waiting this long in total for capacity (0 = never)
  --fake_states=S1,S2,...        (with --dry_run) VM states the state query returns, in order
                                 (READY, PREEMPTED, TERMINATED, MISSING, CREATING, ...)
  --fake_train_states=T1,T2,...  (with --dry_run) training states worker 0 reports, in order
                                 (RUNNING, DONE, FAILED, STOPPED, LOST, NONE)
  --fake_create=R1,R2,...        (with --dry_run) results of the create commands, in order:
                                 OK, NO_CAPACITY, ERROR (OK once the list is used up)
  With --queued, --fake_states lists the queued resource's states (WAITING_FOR_RESOURCES, ACTIVE,
  SUSPENDED, FAILED, MISSING, ...); after each ACTIVE the next item is the VM's state (READY, ...).

logs     --worker=N (default 0)  --lines=100  --nofollow
copy     --from=gs://...|PATH --to=DIR (default ./tpu_results/NAME)  --worker=N
         without --from: the training log of every worker -> DIR/worker_N.log
         (with a gs:// workdir every worker also uploads its log to WORKDIR/logs/worker_N/,
         one file per training segment, every --log_upload_interval seconds and at exit,
         so a preempted VM's log is kept: copy --from=gs://.../logs)
train    --log_upload_interval=300  seconds between log uploads (0 = only when the trainer exits)
stop     --wait=600  seconds each worker waits for the trainer to exit

Hosts (TPU VM workers) per accelerator type (Cloud TPU docs):
  v2-N, v3-N, v4-N, v5p-N   N = TensorCores, 8 per host      -> N/8 hosts (v4-8: 1, v4-32: 4, v5p-16: 2)
  v5litepod-N, v6e-N        N = chips; N <= 8 is one host      (v5litepod-8: 1, v6e-8: 1)
                            larger slices have 4 chips per host -> N/4 (v5litepod-16: 4, v6e-256: 64)

Examples
  bash launch/tpu.sh create --name=bert --zone=us-central2-b --accelerator_type=v4-32 --spot
  bash launch/tpu.sh setup  --name=bert --zone=us-central2-b --accelerator_type=v4-32
  bash launch/tpu.sh train  --name=bert --zone=us-central2-b --accelerator_type=v4-32 \
      --config=configs/base_pretrain.py --workdir=gs://my-bucket/bert_base \
      --config.data.prepared_dir=gs://my-bucket/data/prepared --config.num_train_steps=100000
  bash launch/tpu.sh logs   --name=bert --zone=us-central2-b --worker=3
  # Spot v5e slice through the queue, kept training across preemptions:
  bash launch/tpu.sh train  --name=bert --zone=us-west4-a --accelerator_type=v5litepod-16 --spot \
      --queued --restart_on_preemption --config=configs/base_pretrain.py --workdir=gs://my-bucket/bert_base
EOF
}

LAUNCHER=tpu.sh
# shellcheck source=launch/lib.sh
source "$SCRIPT_DIR/lib.sh"

# ---------------------------------------------------------------- flags ----
ACTION=""
NAME="" ZONE="" PROJECT="" ACCEL="v4-8" RUNTIME="" SPOT=0 PREEMPTIBLE=0 DRY_RUN=0
REPO="" REF="" PYTHON_BIN="python3.11" REMOTE_DIR="bert_jax" VENV_DIR="bert_jax_venv"
CONFIG="" WORKDIR=""
PASS=() ENVS=() CREATE_FLAGS=()
WORKER=0 LINES=100 FOLLOW=1 FROM="" TO="" STOP_WAIT=600
RESTART=0 POLL=60 MAX_RECOVERIES=100 MAX_FAILURES=10 FAKE_STATES="" FAKE_TRAIN_STATES=""
HAVE_FAKE_STATES=0 HAVE_FAKE_TRAIN_STATES=0 FAKE_CREATE="" HAVE_FAKE_CREATE=0
MAX_BACKOFF=1800 MAX_CAPACITY_WAIT=86400 QUEUED=0 VALID_UNTIL="" LOG_UPLOAD_INTERVAL=300
INTERNAL_IP=0 IAP=0 SSH_FLAGS=()
RUN_DIR="bert_jax_run"   # on the workers, relative to $HOME (see launch/tpu_worker.sh)

parse_flags() {
  local arg
  while (( $# > 0 )); do
    arg=$1
    shift
    case $arg in
      -h | --help) usage; exit 0 ;;
      --name=*) NAME=${arg#*=} ;;
      --zone=*) ZONE=${arg#*=} ;;
      --project=*) PROJECT=${arg#*=} ;;
      --accelerator_type=*) ACCEL=${arg#*=} ;;
      --runtime_version=*) RUNTIME=${arg#*=} ;;
      --spot) SPOT=1 ;;
      --preemptible) PREEMPTIBLE=1 ;;
      --create_flag=*) CREATE_FLAGS+=("${arg#*=}") ;;
      --queued) QUEUED=1 ;;
      --valid_until_duration=*) VALID_UNTIL=${arg#*=} ;;
      --dry_run) DRY_RUN=1 ;;
      --internal_ip) INTERNAL_IP=1 ;;
      --tunnel_through_iap) IAP=1 ;;
      --ssh_flag=*) SSH_FLAGS+=("${arg#*=}") ;;
      --repo=*) REPO=${arg#*=} ;;
      --ref=*) REF=${arg#*=} ;;
      --python=*) PYTHON_BIN=${arg#*=} ;;
      --remote_dir=*) REMOTE_DIR=${arg#*=} ;;
      --venv=*) VENV_DIR=${arg#*=} ;;
      --config=*) CONFIG=${arg#*=} ;;
      --workdir=*) WORKDIR=${arg#*=} ;;
      --config.*=*) PASS+=("$arg") ;;
      --env=*) ENVS+=("${arg#*=}") ;;
      --worker=*) WORKER=${arg#*=} ;;
      --lines=*) LINES=${arg#*=} ;;
      --follow) FOLLOW=1 ;;
      --nofollow) FOLLOW=0 ;;
      --from=*) FROM=${arg#*=} ;;
      --to=*) TO=${arg#*=} ;;
      --wait=*) STOP_WAIT=${arg#*=} ;;
      --restart_on_preemption) RESTART=1 ;;
      --poll_interval=*) POLL=${arg#*=} ;;
      --max_recoveries=*) MAX_RECOVERIES=${arg#*=} ;;
      --max_failures=*) MAX_FAILURES=${arg#*=} ;;
      --max_backoff=*) MAX_BACKOFF=${arg#*=} ;;
      --max_capacity_wait=*) MAX_CAPACITY_WAIT=${arg#*=} ;;
      --log_upload_interval=*) LOG_UPLOAD_INTERVAL=${arg#*=} ;;
      --fake_create=*) FAKE_CREATE=${arg#*=}; HAVE_FAKE_CREATE=1 ;;
      --fake_states=*) FAKE_STATES=${arg#*=}; HAVE_FAKE_STATES=1 ;;
      --fake_train_states=*) FAKE_TRAIN_STATES=${arg#*=}; HAVE_FAKE_TRAIN_STATES=1 ;;
      --) pass_through "$@"; break ;;
      *) die "unknown flag: $arg (see --help)" ;;
    esac
  done
}

# Sets FAMILY, HOSTS, DEFAULT_RUNTIME from ACCEL.
accel_info() {
  local family n re='^(v2|v3|v4|v5p|v5litepod|v6e)-([0-9]+)$'
  [[ $ACCEL =~ $re ]] || die "unknown --accelerator_type=$ACCEL (expected v2-N, v3-N, v4-N, v5p-N, v5litepod-N or v6e-N)"
  family=${BASH_REMATCH[1]}
  n=$((10#${BASH_REMATCH[2]}))
  (( n > 0 )) || die "bad --accelerator_type=$ACCEL"
  case $family in
    v2 | v3 | v4 | v5p)
      # N counts TensorCores; a host has 4 chips = 8 TensorCores.
      (( n % 8 == 0 )) || die "--accelerator_type=$ACCEL: $family sizes are multiples of 8 TensorCores"
      HOSTS=$((n / 8)) ;;
    v5litepod | v6e)
      # N counts chips; up to 8 chips on one VM, larger slices use 4-chip VMs.
      if (( n <= 8 )); then
        HOSTS=1
      else
        (( n % 4 == 0 )) || die "--accelerator_type=$ACCEL: multi-host $family sizes are multiples of 4 chips"
        HOSTS=$((n / 4))
      fi ;;
  esac
  case $family in
    v2 | v3 | v4) DEFAULT_RUNTIME="tpu-ubuntu2204-base" ;;
    v5p) DEFAULT_RUNTIME="v2-alpha-tpuv5" ;;
    v5litepod) DEFAULT_RUNTIME="v2-alpha-tpuv5-lite" ;;
    v6e) DEFAULT_RUNTIME="v2-alpha-tpuv6e" ;;
  esac
}

validate() {
  local safe_path='^[A-Za-z0-9_.][A-Za-z0-9_./-]*$' num='^[0-9]+$'
  [[ -n $NAME ]] || die "--name is required"
  [[ $NAME =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] || die "--name=$NAME: use lowercase letters, digits and hyphens"
  [[ -n $ZONE ]] || die "--zone is required"
  [[ $REMOTE_DIR =~ $safe_path ]] || die "--remote_dir must be a plain path relative to \$HOME"
  [[ $VENV_DIR =~ $safe_path ]] || die "--venv must be a plain path relative to \$HOME"
  [[ $PYTHON_BIN =~ $safe_path ]] || die "--python must be a plain command name"
  local v
  for v in "$WORKER" "$LINES" "$POLL" "$MAX_RECOVERIES" "$MAX_FAILURES" "$STOP_WAIT" \
           "$MAX_BACKOFF" "$MAX_CAPACITY_WAIT" "$LOG_UPLOAD_INTERVAL"; do
    [[ $v =~ $num ]] || die "expected a number, got '$v'"
  done
  (( SPOT && PREEMPTIBLE )) && die "--spot and --preemptible are exclusive"
  (( QUEUED && PREEMPTIBLE )) && die "--queued takes --spot, not the legacy --preemptible"
  [[ -z $VALID_UNTIL ]] || (( QUEUED )) || die "--valid_until_duration needs --queued"
  [[ -z $VALID_UNTIL || $VALID_UNTIL =~ ^([0-9]+[smhd])+$ ]] || \
    die "--valid_until_duration=$VALID_UNTIL: expected a duration such as 6h, 90m or 1d12h"
  if (( HAVE_FAKE_STATES || HAVE_FAKE_TRAIN_STATES || HAVE_FAKE_CREATE )) && (( ! DRY_RUN )); then
    die "--fake_states/--fake_train_states/--fake_create are only for --dry_run"
  fi
  accel_info
  RUNTIME=${RUNTIME:-$DEFAULT_RUNTIME}
  (( WORKER < HOSTS )) || die "--worker=$WORKER but $ACCEL has $HOSTS host(s) (workers 0..$((HOSTS - 1)))"
}

# Flags every gcloud TPU command takes.
loc_flags() {
  LOC=(--zone="$ZONE")
  [[ -n $PROJECT ]] && LOC+=(--project="$PROJECT")
  return 0
}

# gcloud's tpu-vm ssh/scp, with the reachability flags: --internal_ip (no external IP;
# run from inside the VPC) and --tunnel_through_iap (IAP; only `gcloud alpha` has it for
# tpu-vm ssh/scp).
remote() {  # remote ssh|scp -> fills RCMD with the gcloud command prefix
  RCMD=(gcloud)
  (( IAP )) && RCMD+=(alpha)
  RCMD+=(compute tpus tpu-vm "$1")
}

remote_flags() {
  RFLAGS=()
  (( INTERNAL_IP )) && RFLAGS+=(--internal-ip)
  (( IAP )) && RFLAGS+=(--tunnel-through-iap)
  RFLAGS+=(${SSH_FLAGS[@]+"${SSH_FLAGS[@]}"})
  return 0
}

ssh_cmd() {  # ssh_cmd WORKER COMMAND -> fills SSH array
  remote ssh
  remote_flags
  SSH=("${RCMD[@]}" "$NAME" "${LOC[@]}" --worker="$1" ${RFLAGS[@]+"${RFLAGS[@]}"} --command="$2")
}

scp_run() {  # scp_run ARGS... (sources, destination, --worker=...)
  remote scp
  remote_flags
  run "${RCMD[@]}" "$@" "${LOC[@]}" ${RFLAGS[@]+"${RFLAGS[@]}"}
}

# ------------------------------------------------------------- commands ----
do_create() {
  local cmd
  if (( QUEUED )); then
    cmd=(gcloud compute tpus queued-resources create "$NAME" "${LOC[@]}" --node-id="$NAME"
      --accelerator-type="$ACCEL" --runtime-version="$RUNTIME")
    (( SPOT )) && cmd+=(--spot)
    [[ -n $VALID_UNTIL ]] && cmd+=(--valid-until-duration="$VALID_UNTIL")
  else
    cmd=(gcloud compute tpus tpu-vm create "$NAME" "${LOC[@]}"
      --accelerator-type="$ACCEL" --version="$RUNTIME")
    (( SPOT )) && cmd+=(--spot)
    (( PREEMPTIBLE )) && cmd+=(--preemptible)
  fi
  cmd+=(${CREATE_FLAGS[@]+"${CREATE_FLAGS[@]}"})
  run "${cmd[@]}"
}

do_delete() {
  if (( QUEUED )); then
    # --force deletes the queued resource's VM(s) too.
    run gcloud compute tpus queued-resources delete "$NAME" "${LOC[@]}" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$NAME" "${LOC[@]}" --quiet
  fi
}

# The create of the recovery loop. Sets CREATE_RESULT: OK, NO_CAPACITY (the zone has no
# capacity, or the quota is used up: worth waiting for) or ERROR (anything else).
create_for_recovery() {
  local out rc=0
  if (( DRY_RUN )); then
    do_create
    CREATE_RESULT=$(pop_fake "$FAKE_CREATE" "$FAKE_CREATE_IDX") || CREATE_RESULT=OK
    FAKE_CREATE_IDX=$((FAKE_CREATE_IDX + 1))
    [[ $CREATE_RESULT == OK ]] || note "create: $CREATE_RESULT (injected)"
    return 0
  fi
  out=$(do_create 2>&1) || rc=$?
  printf '%s\n' "$out"
  if (( rc == 0 )); then
    CREATE_RESULT=OK
  elif printf '%s' "$out" | grep -qiE 'RESOURCE_EXHAUSTED|no more capacity|insufficient capacity|out of capacity|stockout|quota|ZONE_RESOURCE_POOL_EXHAUSTED'; then
    CREATE_RESULT=NO_CAPACITY
  else
    CREATE_RESULT=ERROR
  fi
}

TARBALL=""
# Pack the local checkout (files git tracks plus untracked, non-ignored files;
# everything but .git and virtualenvs when this is not a git checkout) once.
make_tarball() {
  [[ -n $TARBALL ]] && return 0
  TARBALL="${TMPDIR:-/tmp}/bert_jax-$NAME.tar.gz"
  if [[ -d $REPO_ROOT/.git ]] || [[ -f $REPO_ROOT/.git ]]; then
    echo "+ tar -czf $(q "$TARBALL") -C $(q "$REPO_ROOT") --null -T -  # files: git ls-files --cached --others --exclude-standard"
    (( DRY_RUN )) && return 0
    (cd "$REPO_ROOT" && git ls-files -z --cached --others --exclude-standard) |
      while IFS= read -r -d '' f; do
        if [[ -e $REPO_ROOT/$f ]]; then printf '%s\0' "$f"; fi
      done |
      tar -czf "$TARBALL" -C "$REPO_ROOT" --null -T -
  else
    run tar -czf "$TARBALL" -C "$REPO_ROOT" --exclude=.git --exclude=.venv --exclude=__pycache__ \
      --exclude='*.egg-info' --exclude='./workdir*' .
  fi
}

install_remote_cmd() {
  local py=$PYTHON_BIN
  printf '%s' "if ! command -v $py >/dev/null; then sudo apt-get -o DPkg::Lock::Timeout=600 update -qq && sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq $py $py-venv; fi && $py -m venv ~/$VENV_DIR && cd ~/$REMOTE_DIR && ~/$VENV_DIR/bin/pip install -q --upgrade pip && ~/$VENV_DIR/bin/pip install -c constraints.txt -e \".[tpu]\""
}

do_setup() {
  local fetch
  if [[ -n $REPO ]]; then
    fetch="rm -rf ~/$REMOTE_DIR && git clone --quiet $(q "$REPO") ~/$REMOTE_DIR"
    [[ -n $REF ]] && fetch+=" && git -C ~/$REMOTE_DIR checkout --quiet $(q "$REF")"
  else
    make_tarball || return 1
    scp_run "$TARBALL" "$NAME:bert_jax_src.tar.gz" --worker=all || return 1
    fetch="rm -rf ~/$REMOTE_DIR && mkdir -p ~/$REMOTE_DIR && tar -xzf ~/bert_jax_src.tar.gz -C ~/$REMOTE_DIR"
  fi
  ssh_cmd all "$fetch && $(install_remote_cmd)"
  run "${SSH[@]}"
}

# The command every worker runs (identical on all of them).
train_remote_cmd() {
  local line="cd ~/$REMOTE_DIR && bash launch/tpu_worker.sh start" e a
  # A gs:// workdir also keeps every worker's log (per worker, per start): WORKDIR/logs/worker_N/.
  [[ $WORKDIR == gs://* ]] && line+=" $(q "--log_dir=${WORKDIR%/}/logs") --log_upload_interval=$LOG_UPLOAD_INTERVAL"
  if (( ${#ENVS[@]} > 0 )); then
    line+=" env"
    for e in "${ENVS[@]}"; do line+=" $(q "$e")"; done
  fi
  line+=" ~/$VENV_DIR/bin/python -m bert_jax.main $(q "--config=$CONFIG") $(q "--workdir=$WORKDIR")"
  # Pod slice: bert_jax.main calls jax.distributed.initialize() (TPU auto-detection).
  (( HOSTS > 1 )) && line+=" --multihost"
  for a in ${PASS[@]+"${PASS[@]}"}; do line+=" $(q "$a")"; done
  printf '%s' "$line"
}

check_train_flags() {
  [[ -n $CONFIG ]] || die "train needs --config=configs/....py"
  [[ -n $WORKDIR ]] || die "train needs --workdir (gs://BUCKET/DIR)"
  if [[ $WORKDIR != gs://* ]]; then
    if (( HOSTS > 1 )); then
      die "--workdir=$WORKDIR: a pod slice ($HOSTS hosts) needs a shared gs:// workdir"
    elif (( RESTART )); then
      die "--workdir=$WORKDIR: --restart_on_preemption needs a gs:// workdir (the VM disk is lost)"
    else
      note "warning: --workdir is local to the VM and is lost when the VM is deleted or preempted"
    fi
  fi
  return 0
}

do_train() {
  ssh_cmd all "$(train_remote_cmd)"
  run "${SSH[@]}"
}

# The command worker $1 runs to prepare its share of a corpus.
prepare_remote_cmd() {
  local line="cd ~/$REMOTE_DIR && ~/$VENV_DIR/bin/python -m input_pipeline.prepare_hosts" a
  for a in ${PASS[@]+"${PASS[@]}"}; do line+=" $(q "$a")"; done
  line+=" --num_hosts=$HOSTS --host_index=$1"
  printf '%s' "$line"
}

do_prepare() {
  local a out="" w pids=() failed=0
  for a in ${PASS[@]+"${PASS[@]}"}; do [[ $a == --output_dir=* ]] && out=${a#*=}; done
  [[ -n $out ]] || die "prepare needs prepare's flags after --: -- --input=... --vocab=... --output_dir=gs://..."
  (( HOSTS == 1 )) || [[ $out == gs://* ]] || \
    die "--output_dir=$out: the $HOSTS workers of a pod slice share their output through gs://"
  for (( w = 0; w < HOSTS; w++ )); do  # every worker at once; worker 0 merges at the end
    ssh_cmd "$w" "$(prepare_remote_cmd "$w")"
    if (( DRY_RUN )); then run "${SSH[@]}"; else run "${SSH[@]}" & pids+=($!); fi
  done
  for w in ${pids[@]+"${pids[@]}"}; do wait "$w" || failed=1; done
  (( failed )) && die "prepare failed on a worker (its output is above); run the same command again: finished shares are kept"
  note "prepared into $out on $HOSTS worker(s)"
}

do_logs() {
  local tail_cmd="tail -n $LINES"
  (( FOLLOW )) && tail_cmd+=" -F"
  ssh_cmd "$WORKER" "$tail_cmd ~/$RUN_DIR/train.log"
  run "${SSH[@]}"
}

do_copy() {
  local dest=${TO:-./tpu_results/$NAME} w
  if [[ -z $FROM ]]; then
    run mkdir -p "$dest"
    for ((w = 0; w < HOSTS; w++)); do
      scp_run "$NAME:$RUN_DIR/train.log" "$dest/worker_$w.log" --worker="$w"
    done
  elif [[ $FROM == gs://* ]]; then
    run mkdir -p "$dest"
    run gcloud storage cp --recursive "$FROM" "$dest"
  else
    run mkdir -p "$dest"
    scp_run --recurse "$NAME:$FROM" "$dest" --worker="$WORKER"
  fi
}

do_stop() {
  ssh_cmd all "bash ~/$REMOTE_DIR/launch/tpu_worker.sh stop --wait=$STOP_WAIT"
  run "${SSH[@]}"
}

# ---------------------------------------------------- state queries --------
FAKE_IDX=0 FAKE_TRAIN_IDX=0 FAKE_CREATE_IDX=0

# pop_fake LIST INDEX_VAR -> prints the next item, fails when exhausted
pop_fake() {
  local list=$1 idx=$2 items
  IFS=',' read -r -a items <<<"$list"
  (( idx < ${#items[@]} )) || return 1
  printf '%s' "${items[$idx]}"
}

# describe_state LABEL CMD... -> sets STATE: the API's state (READY, PREEMPTED, ... for a VM;
# WAITING_FOR_RESOURCES, ACTIVE, SUSPENDED, ... for a queued resource), MISSING (no such
# resource) or QUERY_FAILED (gcloud itself failed: not a state of the resource).
describe_state() {
  local label=$1 out
  shift
  log_cmd "$@"
  if (( DRY_RUN )); then
    STATE=$(pop_fake "$FAKE_STATES" "$FAKE_IDX") || return 1
    FAKE_IDX=$((FAKE_IDX + 1))
    note "$label: $STATE (injected)"
    return 0
  fi
  if out=$("$@" 2>&1); then
    STATE=$(printf '%s\n' "$out" | tail -n 1 | tr -d '[:space:]')
    [[ -n $STATE ]] || STATE=QUERY_FAILED
  elif printf '%s' "$out" | grep -qiE 'NOT_FOUND|not found|was not found'; then
    STATE=MISSING
  else
    printf '%s\n' "$out" >&2
    STATE=QUERY_FAILED
  fi
  note "$label: $STATE"
}

query_state() {
  describe_state state gcloud compute tpus tpu-vm describe "$NAME" "${LOC[@]}" "--format=value(state)"
}

query_qr_state() {
  describe_state "queued resource" gcloud compute tpus queued-resources describe "$NAME" "${LOC[@]}" \
    "--format=value(state.state)"
}

# Sets TSTATE from worker 0: RUNNING, DONE, FAILED, STOPPED, LOST, NONE, NOT_SET_UP (the
# project is not installed there: a VM created by hand, or a create whose setup never ran)
# or UNKNOWN.
query_train_state() {
  local out
  ssh_cmd 0 "if [ -f ~/$REMOTE_DIR/launch/tpu_worker.sh ]; then bash ~/$REMOTE_DIR/launch/tpu_worker.sh status; else echo NOT_SET_UP; fi"
  log_cmd "${SSH[@]}"
  if (( DRY_RUN )); then
    TSTATE=$(pop_fake "$FAKE_TRAIN_STATES" "$FAKE_TRAIN_IDX") || return 1
    FAKE_TRAIN_IDX=$((FAKE_TRAIN_IDX + 1))
    note "training on worker 0: $TSTATE (injected)"
    return 0
  fi
  if out=$("${SSH[@]}" 2>/dev/null); then
    TSTATE=$(printf '%s\n' "$out" | tail -n 1)
  else
    TSTATE=UNKNOWN
  fi
  [[ -n $TSTATE ]] || TSTATE=UNKNOWN
  note "training on worker 0: $TSTATE"
}

do_status() {
  note "$NAME: $ACCEL, $HOSTS host(s)"
  if (( QUEUED )); then
    if query_qr_state; then :; else note "dry run: no state injected"; fi
  fi
  if query_state; then :; else note "dry run: no state injected"; fi
  if (( DRY_RUN )) || [[ ${STATE:-} == READY ]]; then
    ssh_cmd all "echo \"\$(hostname): \$(bash ~/$REMOTE_DIR/launch/tpu_worker.sh status)\""
    run "${SSH[@]}"
  fi
}

# ------------------------------------------------- preemption recovery -----
FAILS=0
failed_step() {
  FAILS=$((FAILS + 1))
  note "step failed: $1 ($FAILS/$MAX_FAILURES consecutive failures)"
  (( FAILS < MAX_FAILURES )) || { echo "tpu.sh: giving up after $FAILS consecutive failures" >&2; exit 1; }
}

# Seconds until the next poll: --poll_interval, or a back-off after a failed create.
NEXT_SLEEP=""
pause() {
  local secs=${NEXT_SLEEP:-$POLL}
  NEXT_SLEEP=""
  if (( DRY_RUN )); then
    log_cmd sleep "$secs"
  else
    sleep "$secs"
  fi
}

# A create that found no capacity (or a queued request that FAILED) is retried with
# exponential back-off: --poll_interval, twice that, ... up to --max_backoff seconds. It is
# not a recovery and not a failed step; --max_capacity_wait bounds the total wait.
CAPACITY_TRIES=0 CAPACITY_WAITED=0
back_off() {  # back_off REASON
  local delay=$POLL i
  CAPACITY_TRIES=$((CAPACITY_TRIES + 1))
  for ((i = 1; i < CAPACITY_TRIES && delay < MAX_BACKOFF; i++)); do delay=$((delay * 2)); done
  (( delay <= MAX_BACKOFF )) || delay=$MAX_BACKOFF
  (( delay > 0 )) || delay=1
  if (( MAX_CAPACITY_WAIT > 0 && CAPACITY_WAITED >= MAX_CAPACITY_WAIT )); then
    echo "tpu.sh: giving up: no capacity after waiting ${CAPACITY_WAITED}s (--max_capacity_wait=$MAX_CAPACITY_WAIT)$( (( QUEUED )) || echo '; --queued lets Google'"'"'s queue wait for capacity')" >&2
    exit 1
  fi
  CAPACITY_WAITED=$((CAPACITY_WAITED + delay))
  note "$1: attempt $CAPACITY_TRIES, retrying in ${delay}s (waited ${CAPACITY_WAITED}s in all)"
  NEXT_SLEEP=$delay
}

capacity_found() { CAPACITY_TRIES=0; CAPACITY_WAITED=0; }

end_of_injected() {
  note "dry run: no more injected states (--fake_states/--fake_train_states); stopping"
  exit 0
}

STARTED=0 NEED_SETUP=0 RECOVERIES=0 RECREATING=0

# Count one preemption (once per event, however many creates it then takes).
count_recovery() {  # count_recovery WHAT
  (( RECREATING )) && return 0
  RECREATING=1
  RECOVERIES=$((RECOVERIES + 1))
  (( RECOVERIES <= MAX_RECOVERIES )) || { echo "tpu.sh: giving up after $MAX_RECOVERIES re-creations" >&2; exit 1; }
  note "recovery $RECOVERIES/$MAX_RECOVERIES: $1"
}

# Create the VM (or the queued request) again; false when the create did not succeed.
recreate() {
  STARTED=0
  create_for_recovery
  case $CREATE_RESULT in
    OK) ;;
    NO_CAPACITY) back_off "no capacity for $ACCEL in $ZONE"; return 1 ;;
    *) failed_step create; back_off "create failed"; return 1 ;;
  esac
  RECREATING=0
  NEED_SETUP=1
  (( QUEUED )) && return 1   # the queued request is provisioned later: poll it
  capacity_found
  if ! do_setup; then failed_step setup; return 1; fi
  NEED_SETUP=0
  if do_train; then STARTED=1; FAILS=0; else failed_step train; fi
}

# The VM is READY: set it up if needed, then look at (or start) the training.
on_ready() {
  if (( NEED_SETUP )); then
    if do_setup; then NEED_SETUP=0; else failed_step setup; return 0; fi
  fi
  query_train_state || end_of_injected
  case $TSTATE in
    RUNNING)
      (( STARTED )) || note "training already running: monitoring it"
      STARTED=1
      FAILS=0 ;;
    DONE)
      if (( STARTED )); then
        note "training finished (worker 0 exited 0); the VM is left running: bash launch/tpu.sh delete --name=$NAME --zone=$ZONE$( (( QUEUED )) && echo ' --queued')"
        exit 0
      fi
      note "a previous run finished on this VM; starting this one"
      if do_train; then STARTED=1; else failed_step train; fi ;;
    FAILED*)
      if (( STARTED )); then
        echo "tpu.sh: training failed on worker 0 ($TSTATE); see: bash launch/tpu.sh logs --name=$NAME --zone=$ZONE --worker=0" >&2
        exit 1
      fi
      note "a previous run failed on this VM ($TSTATE); starting this one"
      if do_train; then STARTED=1; else failed_step train; fi ;;
    NOT_SET_UP)
      note "the VM is READY but the project is not set up on it: setting it up"
      if ! do_setup; then failed_step setup; return 0; fi
      if do_train; then STARTED=1; FAILS=0; else failed_step train; fi ;;
    STOPPED* | LOST | NONE)
      # SIGTERM-ed (preemption in progress, or a manual stop), vanished, or never started.
      (( STARTED )) && note "no training process on worker 0 ($TSTATE): starting it again"
      if do_train; then STARTED=1; else failed_step train; fi ;;
    *) failed_step "training state query ($TSTATE)" ;;
  esac
}

# One poll of a VM created with `tpu-vm create`.
poll_vm() {
  query_state || end_of_injected
  case $STATE in
    READY) capacity_found; on_ready ;;
    PREEMPTED | TERMINATED | MISSING)
      if (( RECREATING )); then
        note "VM is $STATE: creating it again"
      elif (( STARTED || RECOVERIES > 0 )) || [[ $STATE != MISSING ]]; then
        count_recovery "VM is $STATE"
      else
        note "VM does not exist yet: creating it"
        RECREATING=1
      fi
      if [[ $STATE != MISSING ]] && ! do_delete; then failed_step delete; return 0; fi
      recreate || true ;;
    STOPPED)
      # Stopped (by hand or by maintenance): its disk is kept, so start it again; the
      # next poll finds no training process and restarts it.
      count_recovery "VM is STOPPED: starting it"
      RECREATING=0
      STARTED=0
      if ! run gcloud compute tpus tpu-vm start "$NAME" "${LOC[@]}"; then failed_step start; fi ;;
    QUERY_FAILED) failed_step "state query" ;;
    *) note "waiting: VM is $STATE" ;;
  esac
}

# One poll of a queued resource (--queued): the request's state first, its VM's once ACTIVE.
poll_queued() {
  query_qr_state || end_of_injected
  case $STATE in
    ACTIVE)
      capacity_found
      query_state || end_of_injected
      case $STATE in
        READY) on_ready ;;
        PREEMPTED | TERMINATED)
          count_recovery "the queued resource's VM is $STATE"
          if ! do_delete; then failed_step delete; return 0; fi
          recreate || true ;;
        QUERY_FAILED) failed_step "state query" ;;
        *) note "waiting: queued resource ACTIVE, VM is $STATE" ;;
      esac ;;
    SUSPENDED)
      # A spot slice was preempted: its VMs are gone and the request is spent.
      count_recovery "queued resource SUSPENDED (preempted)"
      if ! do_delete; then failed_step delete; return 0; fi
      recreate || true ;;
    FAILED)
      # Not provisioned in time (--valid_until_duration) or refused: ask again, after a back-off.
      note "queued resource FAILED (not provisioned, or refused): deleting it and asking again"
      RECREATING=1
      if ! do_delete; then failed_step delete; return 0; fi
      back_off "queued request failed" ;;
    MISSING)
      if (( RECREATING )); then
        note "queued resource is missing: requesting it again"
      elif (( STARTED || RECOVERIES > 0 )); then
        count_recovery "queued resource is gone"
      else
        note "queued resource does not exist yet: requesting it"
        RECREATING=1
      fi
      recreate || true ;;
    QUERY_FAILED) failed_step "state query" ;;
    *) note "waiting: queued resource is $STATE" ;;
  esac
}

# Poll the VM; recreate + setup + train when it was preempted; exit when done.
train_resilient() {
  (( SPOT || PREEMPTIBLE )) || note "note: neither --spot nor --preemptible: re-created VMs will be on-demand"
  while :; do
    if (( QUEUED )); then poll_queued; else poll_vm; fi
    pause
  done
}

# ----------------------------------------------------------------- main ----
main() {
  (( $# > 0 )) || { usage >&2; exit 2; }
  case $1 in
    -h | --help | help) usage; exit 0 ;;
    create | setup | train | prepare | logs | copy | stop | status | delete) ACTION=$1 ;;
    *) die "unknown action '$1' (create|setup|train|prepare|logs|copy|stop|status|delete; see --help)" ;;
  esac
  shift
  parse_flags "$@"
  validate
  loc_flags
  (( DRY_RUN )) && note "dry run: commands are printed, not run"
  if (( HOSTS > 1 )); then
    note "$ACCEL: $HOSTS hosts (workers 0..$((HOSTS - 1))), runtime $RUNTIME"
  else
    note "$ACCEL: 1 host (worker 0), runtime $RUNTIME"
  fi
  case $ACTION in
    create) do_create ;;
    delete) do_delete ;;
    setup) do_setup ;;
    train)
      check_train_flags
      if (( RESTART )); then train_resilient; else do_train; fi ;;
    prepare) do_prepare ;;
    logs) do_logs ;;
    copy) do_copy ;;
    stop) do_stop ;;
    status) do_status ;;
  esac
}

main "$@"
