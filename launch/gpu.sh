#!/usr/bin/env bash
# GPU launcher for bert_jax: one host with several GPUs, or one process per node
# (or per GPU) on several hosts, e.g. under SLURM (`srun bash launch/gpu.sh ...`,
# see launch/slurm.sbatch). `bash launch/gpu.sh --help` for usage.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bash launch/gpu.sh --config=configs/X.py --workdir=DIR [flags] [--config.KEY=VALUE ...] [-- MAIN_ARGS...]

Runs `python -m bert_jax.main` on this host. Run it once per host (or once per GPU
with --process_per_gpu); under SLURM, `srun bash launch/gpu.sh ...` does that.

  --config=configs/X.py[:name]  config file (required)
  --workdir=DIR|gs://...        checkpoints + metrics (required; shared storage on several hosts)
  --config.KEY=VALUE            passed through to bert_jax.main unchanged (repeatable)
  -- ARGS...                    everything after -- is passed through to bert_jax.main
  --python=python3              interpreter (activate your virtualenv first, or give its python)
  --mem_fraction=0.90           XLA_PYTHON_CLIENT_MEM_FRACTION (JAX's default is 0.75)
  --bf16                        adds --config.model.dtype=bfloat16 (bf16 compute, fp32 master weights)
  --cudnn_attention             adds --config.model.attention_impl=cudnn and
                                --config.model.attention_dropout_rate=0.0 (the fused cuDNN kernel
                                runs only without attention-probability dropout; needs bf16/fp16)
  --xla_flags=FLAGS             appended to XLA_FLAGS (after the defaults: a later flag wins)
  --no_default_xla_flags        leave out the default XLA_FLAGS below

XLA_FLAGS defaults (JAX's GPU performance tips; accepted by the pinned jaxlib, tested):
  --xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_highest_priority_async_stream=true
  (overlap collectives with compute); then any XLA_FLAGS of the environment, then --xla_flags.
  --dry_run                     print the command (prefixed "+ ") instead of running it

Several processes (jax.distributed); the explicit flags win over the environment:
  --coordinator=HOST:PORT       process 0's address (default: first host of SLURM_JOB_NODELIST,
                                port 61440 + SLURM_JOB_ID % 4096, the port JAX itself picks under SLURM)
  --num_processes=N             default: SLURM_NTASKS, else 1
  --process_id=I                default: SLURM_PROCID, else 0
  --coordinator_port=PORT       port when the coordinator host comes from SLURM
  --gpus_per_node=N             GPUs this process drives (default: SLURM_GPUS_ON_NODE, else the
                                count in CUDA_VISIBLE_DEVICES, else nvidia-smi -L)
  --process_per_gpu             one process per GPU: this one drives GPU SLURM_LOCALID (or --local_id)
  --local_id=I                  local GPU index for --process_per_gpu outside SLURM

With N > 1 processes, main gets --coordinator_address=HOST:PORT --num_processes=N --process_id=I,
and the environment gets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID and
JAX_LOCAL_DEVICE_IDS (JAX reads JAX_COORDINATOR_ADDRESS and JAX_LOCAL_DEVICE_IDS itself).

Examples
  bash launch/gpu.sh --config=configs/base_pretrain.py --workdir=/data/runs/base --bf16
  srun bash launch/gpu.sh --config=configs/base_pretrain.py --workdir=/shared/runs/base --bf16
  # two hosts without SLURM (run on each, PROCESS_ID 0 and 1):
  bash launch/gpu.sh --config=configs/base_pretrain.py --workdir=gs://b/base \
      --coordinator=host0:12345 --num_processes=2 --process_id="$PROCESS_ID"
EOF
}

LAUNCHER=gpu.sh
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# First host of a SLURM node list: "gpu01", "gpu01,gpu02", "gpu[01-02]",
# "gpu[01,07-09],cpu1" -> gpu01 (the same rule as JAX's SLURM cluster detection).
first_host() {
  local list=$1 prefix rest
  prefix=${list%%[,[]*}
  if [[ $prefix == "$list" ]] || [[ ${list:${#prefix}:1} == "," ]]; then
    printf '%s' "$prefix"
  else
    rest=${list:$((${#prefix} + 1))}
    printf '%s%s' "$prefix" "${rest%%[,-]*}"
  fi
}

CONFIG="" WORKDIR="" PY="python3" MEM_FRACTION="" BF16=0 CUDNN=0 XLA_EXTRA="" DRY_RUN=0
DEFAULT_XLA=1
# Kept in one line: tests/test_launch_gpu.py starts the pinned jaxlib with exactly these.
DEFAULT_XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_highest_priority_async_stream=true"
COORD="" NPROC="" PROC_ID="" COORD_PORT="" GPUS="" PER_GPU=0 LOCAL_ID=""
PASS=()

while (( $# > 0 )); do
  arg=$1
  shift
  case $arg in
    -h | --help) usage; exit 0 ;;
    --config=*) CONFIG=${arg#*=} ;;
    --workdir=*) WORKDIR=${arg#*=} ;;
    --config.*=*) PASS+=("$arg") ;;
    --python=*) PY=${arg#*=} ;;
    --mem_fraction=*) MEM_FRACTION=${arg#*=} ;;
    --bf16) BF16=1 ;;
    --cudnn_attention) CUDNN=1 ;;
    --xla_flags=*) XLA_EXTRA=${arg#*=} ;;
    --no_default_xla_flags) DEFAULT_XLA=0 ;;
    --dry_run) DRY_RUN=1 ;;
    --coordinator=*) COORD=${arg#*=} ;;
    --num_processes=*) NPROC=${arg#*=} ;;
    --process_id=*) PROC_ID=${arg#*=} ;;
    --coordinator_port=*) COORD_PORT=${arg#*=} ;;
    --gpus_per_node=*) GPUS=${arg#*=} ;;
    --process_per_gpu) PER_GPU=1 ;;
    --local_id=*) LOCAL_ID=${arg#*=} ;;
    --) pass_through "$@"; break ;;
    *) die "unknown flag: $arg (see --help)" ;;
  esac
done

[[ -n $CONFIG ]] || die "--config is required"
[[ -n $WORKDIR ]] || die "--workdir is required"
num='^[0-9]+$'

# Tasks on this host, and this one's local rank: Open MPI (mpirun) or SLURM (srun).
LOCAL_SIZE=""
if [[ -n ${OMPI_COMM_WORLD_SIZE:-} ]]; then
  NPROC=${NPROC:-$OMPI_COMM_WORLD_SIZE}
  PROC_ID=${PROC_ID:-${OMPI_COMM_WORLD_RANK:-}}
  LOCAL_ID=${LOCAL_ID:-${OMPI_COMM_WORLD_LOCAL_RANK:-}}
  LOCAL_SIZE=${OMPI_COMM_WORLD_LOCAL_SIZE:-}
elif [[ -n ${SLURM_NTASKS_PER_NODE:-} ]]; then
  LOCAL_SIZE=$SLURM_NTASKS_PER_NODE
elif [[ -n ${SLURM_TASKS_PER_NODE:-} ]]; then
  LOCAL_SIZE=${SLURM_TASKS_PER_NODE%%[(,]*}  # "8(x2)" or "8,4" -> this job's first node count
fi
NPROC=${NPROC:-${SLURM_NTASKS:-${SLURM_NPROCS:-1}}}
PROC_ID=${PROC_ID:-${SLURM_PROCID:-0}}
if [[ $LOCAL_SIZE =~ ^[0-9]+$ ]] && (( LOCAL_SIZE > 1 )) && (( ! PER_GPU )); then
  # Several processes on one host must not all claim every GPU: one GPU each, by local
  # rank, as JAX's own cluster detection does.
  note "$LOCAL_SIZE processes on this host: one GPU per process (its local rank), as --process_per_gpu"
  PER_GPU=1
fi
if ! [[ $NPROC =~ $num ]] || (( NPROC < 1 )); then
  die "--num_processes must be a positive number, got '$NPROC'"
fi
if ! [[ $PROC_ID =~ $num ]] || (( PROC_ID >= NPROC )); then
  die "--process_id=$PROC_ID must be in 0..$((NPROC - 1))"
fi

ENVS=()
MAIN_ARGS=("--config=$CONFIG" "--workdir=$WORKDIR")
(( BF16 )) && MAIN_ARGS+=(--config.model.dtype=bfloat16)
(( CUDNN )) && MAIN_ARGS+=(--config.model.attention_impl=cudnn --config.model.attention_dropout_rate=0.0)
MAIN_ARGS+=(${PASS[@]+"${PASS[@]}"})

if [[ -n $MEM_FRACTION ]]; then
  ENVS+=("XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_FRACTION")
elif [[ -z ${XLA_PYTHON_CLIENT_MEM_FRACTION:-} ]]; then
  ENVS+=("XLA_PYTHON_CLIENT_MEM_FRACTION=0.90")
fi
xla=""
(( DEFAULT_XLA )) && xla=$DEFAULT_XLA_FLAGS
xla+="${xla:+${XLA_FLAGS:+ }}${XLA_FLAGS:-}"
xla+="${xla:+${XLA_EXTRA:+ }}$XLA_EXTRA"
[[ -n $xla ]] && ENVS+=("XLA_FLAGS=$xla")

if (( NPROC > 1 )); then
  if [[ -z $COORD ]]; then
    nodelist=${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}
    if [[ -z $nodelist ]]; then
      [[ -n ${OMPI_COMM_WORLD_SIZE:-} ]] && die "under mpirun, pass --coordinator=HOST:PORT (a port on the host of rank 0)"
      die "$NPROC processes but no --coordinator=HOST:PORT and no SLURM_JOB_NODELIST"
    fi
    if [[ -z $COORD_PORT ]]; then
      if [[ ${SLURM_JOB_ID:-} =~ $num ]]; then
        COORD_PORT=$((61440 + 10#$SLURM_JOB_ID % 4096))
      else
        COORD_PORT=12345
      fi
    fi
    COORD="$(first_host "$nodelist"):$COORD_PORT"
  fi
  [[ $COORD == *:* ]] || die "--coordinator must be HOST:PORT, got '$COORD'"
  ENVS+=("JAX_COORDINATOR_ADDRESS=$COORD" "JAX_NUM_PROCESSES=$NPROC" "JAX_PROCESS_ID=$PROC_ID")
  if (( PER_GPU )); then
    LOCAL_ID=${LOCAL_ID:-${SLURM_LOCALID:-}}
    [[ $LOCAL_ID =~ $num ]] || die "--process_per_gpu needs SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK or --local_id"
    ENVS+=("JAX_LOCAL_DEVICE_IDS=$LOCAL_ID")
    note "process $PROC_ID of $NPROC (GPU $LOCAL_ID of this host), coordinator $COORD"
  else
    # One process drives all GPUs of its host. Say so explicitly: given a SLURM
    # environment, JAX's auto-detection would otherwise pick GPU SLURM_LOCALID only.
    if [[ -z $GPUS ]]; then
      if [[ ${SLURM_GPUS_ON_NODE:-} =~ $num ]]; then
        GPUS=$SLURM_GPUS_ON_NODE
      elif [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
        IFS=',' read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
        GPUS=${#visible[@]}
      elif command -v nvidia-smi >/dev/null 2>&1; then
        GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
      fi
    fi
    if [[ $GPUS =~ $num ]] && (( GPUS > 0 )); then
      ids=0
      for ((i = 1; i < GPUS; i++)); do ids+=",$i"; done
      ENVS+=("JAX_LOCAL_DEVICE_IDS=$ids")
      note "process $PROC_ID of $NPROC ($GPUS GPUs on this host), coordinator $COORD"
    else
      note "warning: could not count this host's GPUs; pass --gpus_per_node=N (else JAX may use one GPU per process under SLURM)"
      note "process $PROC_ID of $NPROC, coordinator $COORD"
    fi
  fi
  MAIN_ARGS+=("--coordinator_address=$COORD" "--num_processes=$NPROC" "--process_id=$PROC_ID")
else
  note "single process: all GPUs of this host"
fi

CMD=(env ${ENVS[@]+"${ENVS[@]}"} "$PY" -m bert_jax.main "${MAIN_ARGS[@]}")
log_cmd "${CMD[@]}"
(( DRY_RUN )) && exit 0
exec "${CMD[@]}"
