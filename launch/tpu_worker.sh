#!/usr/bin/env bash
# Runs ON each TPU VM worker (launch/tpu.sh calls it over `gcloud ... ssh`).
# Starts one training command in the background, and answers whether it is
# still running, finished, failed or was stopped by SIGTERM (preemption).
#
#   bash launch/tpu_worker.sh start [--log_dir=gs://...] CMD [ARG...]
#                                                  run CMD with nohup in the background
#   bash launch/tpu_worker.sh status               print one word (see below)
#   bash launch/tpu_worker.sh stop [--wait=SECS]   SIGTERM the run (the trainer checkpoints, exits 0)
#
# Files (BERT_JAX_RUN_DIR, default ~/bert_jax_run): train.log (appended), train.pid,
# train.exit (exit status once finished), train.signal (present if it got SIGTERM).
# With --log_dir, the run's part of train.log (one "segment" per start) is also copied to
# LOG_DIR/worker_N/SEGMENT.log every --log_upload_interval seconds and when the run exits,
# so the log of a VM that is preempted and deleted is kept.
set -euo pipefail

RUN_DIR=${BERT_JAX_RUN_DIR:-$HOME/bert_jax_run}
LOG=$RUN_DIR/train.log
PID_FILE=$RUN_DIR/train.pid
EXIT_FILE=$RUN_DIR/train.exit
SIGNAL_FILE=$RUN_DIR/train.signal
SELF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF=$SELF_DIR/$(basename "${BASH_SOURCE[0]}")

usage() {
  cat <<'EOF'
Usage: bash launch/tpu_worker.sh start [--log_dir=DIR] [--log_upload_interval=SECS] CMD [ARG...]
       bash launch/tpu_worker.sh status
       bash launch/tpu_worker.sh stop [--wait=SECS]

Runs on a TPU VM worker; launch/tpu.sh calls it on every worker over ssh.

start   Run CMD in the background (nohup, stdin from /dev/null), appending its
        output to $BERT_JAX_RUN_DIR/train.log (default ~/bert_jax_run/train.log).
        Refuses if a run started here is still alive.
        --log_dir=gs://BUCKET/RUN/logs: also copy this run's part of the log (a
        segment) to DIR/worker_N/YYYYmmddTHHMMSSZ_PID.log (`gcloud storage cp`, else
        `gsutil cp`) every --log_upload_interval seconds (default 300; 0 = only at
        the end) and when the run exits (also after SIGTERM). N is the TPU worker
        number from the VM metadata (BERT_JAX_WORKER_ID overrides it).
status  Prints one of:
          RUNNING        the run is alive
          DONE           it exited 0 without having received SIGTERM (training finished)
          FAILED <rc>    it exited non-zero without SIGTERM
          STOPPED <rc>   it received SIGTERM (preemption or `stop`) and exited with <rc>
          LOST           a run was started but its process vanished (VM restarted)
          NONE           no run was ever started here
stop    Send SIGTERM (bert_jax.main saves a checkpoint and exits 0); wait up to
        --wait=SECS (default 600) for it to exit.
EOF
}

die() { echo "tpu_worker.sh: error: $*" >&2; exit 1; }

recorded_pid() { [[ -s $PID_FILE ]] && cat "$PID_FILE"; }

is_running() {
  local pid
  pid=$(recorded_pid) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  # Guard against the pid having been reused by something else after a restart.
  if [[ -r /proc/$pid/cmdline ]]; then
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'tpu_worker.sh _run'
  elif command -v ps >/dev/null 2>&1; then
    ps -p "$pid" -o args= 2>/dev/null | grep -q 'tpu_worker.sh _run'
  fi
}

# The TPU chips' device files (v2-v4: /dev/accel*; v5e/v5p/v6e: /dev/vfio/N) and libtpu's
# lock file. Overridable for the tests.
TPU_DEVICES=${BERT_JAX_TPU_DEVICES:-/dev/accel* /dev/vfio/[0-9]*}
LIBTPU_LOCKFILE=${BERT_JAX_LIBTPU_LOCKFILE:-/tmp/libtpu_lockfile}

# PIDs (other than ours) with one of the TPU device files open, from /proc/*/fd.
tpu_holders() {
  local dev fd target pid
  local -a devs=()
  for dev in $TPU_DEVICES; do [[ -e $dev ]] && devs+=("$(readlink -f "$dev")"); done
  (( ${#devs[@]} > 0 )) || return 0
  for fd in /proc/[0-9]*/fd/*; do
    target=$(readlink "$fd" 2>/dev/null) || continue
    for dev in "${devs[@]}"; do
      if [[ $target == "$dev" ]]; then
        pid=${fd#/proc/}; pid=${pid%%/*}
        [[ $pid != "$$" && $pid != "$BASHPID" ]] && echo "$pid"
      fi
    done
  done | sort -u
}

# A process left from an earlier run (a killed ssh session, a crashed launcher) still
# holding the TPU makes the new run fail with "TPU in use": stop it, then drop libtpu's
# stale lock file.
free_tpu() {
  local pids pid i
  pids=$(tpu_holders)
  if [[ -n $pids ]]; then
    echo "freeing the TPU: stopping stale process(es) ${pids//$'\n'/ } that hold it"
    for pid in $pids; do kill -TERM "$pid" 2>/dev/null || sudo -n kill -TERM "$pid" 2>/dev/null || true; done
    for ((i = 0; i < 100; i++)); do
      [[ -z $(tpu_holders) ]] && break
      sleep 0.1
    done
    for pid in $(tpu_holders); do kill -KILL "$pid" 2>/dev/null || sudo -n kill -KILL "$pid" 2>/dev/null || true; done
  fi
  if [[ -e $LIBTPU_LOCKFILE ]]; then
    echo "removing the stale libtpu lock file $LIBTPU_LOCKFILE"
    rm -f "$LIBTPU_LOCKFILE" 2>/dev/null || sudo -n rm -f "$LIBTPU_LOCKFILE" 2>/dev/null || true
  fi
}

# This host's TPU worker number (the metadata server's agent-worker-number, which JAX's
# TPU cluster detection uses too), else the host name.
worker_id() {
  local id=${BERT_JAX_WORKER_ID:-}
  if [[ -z $id ]] && command -v curl >/dev/null 2>&1; then
    id=$(curl -s -f -m 3 -H 'Metadata-Flavor: Google' \
      http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number \
      2>/dev/null) || id=""
  fi
  [[ $id =~ ^[0-9]+$ ]] || id=$(hostname)
  printf '%s' "$id"
}

# upload_log OFFSET URL: copy train.log from byte OFFSET (this run's segment) to URL.
upload_log() {
  local offset=$1 url=$2
  if command -v gcloud >/dev/null 2>&1; then
    tail -c "+$((offset + 1))" "$LOG" | gcloud storage cp --quiet - "$url" >/dev/null 2>&1
  elif command -v gsutil >/dev/null 2>&1; then
    tail -c "+$((offset + 1))" "$LOG" | gsutil -q cp - "$url" >/dev/null 2>&1
  else
    return 1
  fi
}

cmd_start() {
  local log_dir="" interval=300
  while (( $# > 0 )); do
    case $1 in
      --log_dir=*) log_dir=${1#*=}; shift ;;
      --log_upload_interval=*) interval=${1#*=}; shift ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  (( $# > 0 )) || die "start needs a command"
  [[ $interval =~ ^[0-9]+$ ]] || die "--log_upload_interval must be a number of seconds"
  mkdir -p "$RUN_DIR"
  if is_running; then
    die "a run is already running here (pid $(recorded_pid)); stop it first: bash $SELF stop"
  fi
  free_tpu
  rm -f "$EXIT_FILE" "$SIGNAL_FILE" "$PID_FILE"
  local offset=0 url=""
  [[ -f $LOG ]] && offset=$(wc -c <"$LOG")
  if [[ -n $log_dir ]]; then
    url="${log_dir%/}/worker_$(worker_id)/$(date -u +%Y%m%dT%H%M%SZ)_$$.log"
    command -v gcloud >/dev/null 2>&1 || command -v gsutil >/dev/null 2>&1 ||
      echo "warning: neither gcloud nor gsutil is installed: the log is not copied to $log_dir"
  fi
  {
    printf '=== %s %s start:' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(hostname)"
    printf ' %q' "$@"
    printf '\n'
  } >>"$LOG"
  PYTHONUNBUFFERED=1 nohup bash "$SELF" _run "$offset" "$url" "$interval" "$@" >>"$LOG" 2>&1 </dev/null &
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s $PID_FILE ]] && break
    sleep 0.05
  done
  echo "started on $(hostname) (pid $(recorded_pid || echo '?')); log: $LOG${url:+ (copied to $url)}"
}

# Internal: the background wrapper. Forwards SIGTERM to the trainer, records that
# it was signalled, waits for the trainer to finish and records its exit status.
cmd_run() {
  echo "$$" >"$PID_FILE"
  local offset=$1 url=$2 interval=$3 rc=0 r have_rc=0 uploader=""
  shift 3
  CHILD=""
  GOT_SIGNAL=0
  trap 'on_signal TERM' TERM
  trap 'on_signal INT' INT
  "$@" &
  CHILD=$!
  if [[ -n $url ]] && (( interval > 0 )); then
    # Periodic copy of the segment; a hard kill of the VM loses at most `interval` seconds.
    (trap - TERM INT; while sleep "$interval"; do upload_log "$offset" "$url" || true; done) &
    uploader=$!
  fi
  # A trapped signal makes `wait` return early (>128) while the trainer may still
  # be writing its checkpoint: then wait again, for its real exit status (bash
  # keeps it even if the child was already reaped; 127 = nothing left to wait for).
  while :; do
    GOT_SIGNAL=0
    if wait "$CHILD"; then r=0; else r=$?; fi
    if (( r == 127 && have_rc )); then break; fi
    rc=$r
    have_rc=1
    (( GOT_SIGNAL )) || break
  done
  [[ -n $uploader ]] && kill "$uploader" 2>/dev/null
  echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname) exit status $rc"
  if [[ -n $url ]]; then
    if upload_log "$offset" "$url"; then
      echo "=== log copied to $url"
    else
      echo "=== warning: could not copy the log to $url"
    fi
  fi
  echo "$rc" >"$EXIT_FILE.tmp"
  mv "$EXIT_FILE.tmp" "$EXIT_FILE"
}

on_signal() {
  GOT_SIGNAL=1
  echo "$1" >"$SIGNAL_FILE"
  # Background jobs of a non-interactive shell ignore SIGINT: always forward SIGTERM.
  if [[ -n $CHILD ]]; then kill -TERM "$CHILD" 2>/dev/null || true; fi
}

cmd_status() {
  if is_running; then
    echo RUNNING
  elif [[ -f $EXIT_FILE ]]; then
    local rc
    rc=$(cat "$EXIT_FILE")
    if [[ -f $SIGNAL_FILE ]]; then
      echo "STOPPED $rc"
    elif [[ $rc == 0 ]]; then
      echo DONE
    else
      echo "FAILED $rc"
    fi
  elif [[ -f $PID_FILE ]]; then
    echo LOST
  else
    echo NONE
  fi
}

cmd_stop() {
  local wait_s=600 arg pid i
  for arg in "$@"; do
    case $arg in
      --wait=*) wait_s=${arg#*=} ;;
      *) die "unknown stop flag: $arg" ;;
    esac
  done
  [[ $wait_s =~ ^[0-9]+$ ]] || die "--wait must be a number of seconds"
  if ! is_running; then
    echo "no run is running on $(hostname)"
    return 0
  fi
  pid=$(recorded_pid)
  kill -TERM "$pid"
  for ((i = 0; i < wait_s * 10; i++)); do
    is_running || { echo "stopped on $(hostname)"; return 0; }
    sleep 0.1
  done
  echo "still running on $(hostname) after ${wait_s}s (pid $pid)" >&2
  return 1
}

main() {
  local action=${1:-}
  (( $# > 0 )) && shift
  case $action in
    start) cmd_start "$@" ;;
    _run) cmd_run "$@" ;;
    status) cmd_status ;;
    stop) cmd_stop "$@" ;;
    -h | --help | help) usage ;;
    "") usage >&2; exit 2 ;;
    *) echo "tpu_worker.sh: unknown action: $action" >&2; usage >&2; exit 2 ;;
  esac
}

main "$@"
