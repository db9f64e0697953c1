#!/usr/bin/env bash
# The GPU session's one prepared run: bench/gpu_step.py (bert_jax vs transformers eager /
# torch.compile), then the kernel profile of BERT-base's step, results under $OUT.
#
#   here, once:   echo /.whl/ >> .git/info/exclude && bash bench/gpu_check.sh --wheels
#   device run:   bash bench/gpu_check.sh          (carry [".whl"], timeout_s 600)
#   then, on the still-warm machine (within 30 s), with the device time left (status's
#   budget_left_s, B): bash bench/gpu_check.sh --modern $((B - 45)) (carry [".whl"], timeout_s B)
#   (the seconds are the two profiles'; the wheels' install and the version line come first)
# Each call leaves at most 6 files in $OUT: the device returns 8 at most.
#   here, a CPU rehearsal of the same script in a minute or two:  bash bench/gpu_check.sh --smoke
#
# The device image has jax, flax, optax, orbax, torch and transformers but not ml_collections
# or zstandard: --wheels downloads them (pure Python / manylinux, Python 3.12) into .whl/.
# Extra arguments go to gpu_step (e.g. --variants=...). Ends inside ~9 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if [ "${1:-}" = --wheels ]; then
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl ml-collections==1.1.0 zstandard==0.25.0
  exit
fi
SMOKE=0 MODERN=0
if [ "${1:-}" = --smoke ]; then SMOKE=1; shift; fi
MODERN_S=240
if [ "${1:-}" = --modern ]; then
  MODERN=1; shift
  if [[ "${1:-}" =~ ^[0-9]+$ ]]; then MODERN_S=$1; shift; fi
fi
if ls .whl/*.whl >/dev/null 2>&1 && [ "$SMOKE" = 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
fi
# (a later call on the warm machine finds the first call's install even without .whl)
if [ -d /tmp/site ] && [ "$SMOKE" = 0 ]; then export PYTHONPATH=/tmp/site:${PYTHONPATH:-}; fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
start=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
  python3 -c "import jax, jaxlib, flax, torch, transformers; print('jax', jax.__version__, jaxlib.__version__, 'flax', flax.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, jax.devices())"
} 2>&1 | tee "$OUT/device.txt"
# ModernBERT-base on packed rows is the furthest from the issue's figure (161k useful tokens/s
# on the third loan, 300k asked) and has never been profiled: where its step goes, first with
# the Pallas kernels (modern.model.attention=flash: the faster on that loan, 161k against 157k,
# and this code's block skipping), then with the job's defaults if time is left. Each step's
# optimized HLO is written before its trace, so a profile cut short still returns it.
modern_profiles() {  # $1: seconds for both; the rest: profile_step arguments
  local budget=$1 t0=$(date +%s); shift
  timeout $(( budget * 3 / 5 )) python3 -m bench.profile_step --workload=modern-packed \
    --overrides=modern.model.attention=flash --trace=/tmp/gpu_check_flash --trace_steps=2 "$@" \
    2>&1 | tee "$OUT/profile_modern_flash.log"
  cp /tmp/gpu_check_flash/step.hlo.txt.gz "$OUT/step_modern_flash.hlo.txt.gz" 2>/dev/null
  local left=$(( budget - ($(date +%s) - t0) ))
  if [ $left -gt 60 ]; then
    timeout $left python3 -m bench.profile_step --workload=modern-packed \
      --trace=/tmp/gpu_check_modern --trace_steps=2 "$@" 2>&1 | tee "$OUT/profile_modern.log"
    cp /tmp/gpu_check_modern/step.hlo.txt.gz "$OUT/step_modern.hlo.txt.gz" 2>/dev/null
  fi
}
if [ "$MODERN" = 1 ]; then
  modern_profiles "$MODERN_S" --dtype=bfloat16
  echo "gpu_check --modern: $(( $(date +%s) - start )) s; outputs in $OUT"
  exit
fi
if [ "$SMOKE" = 1 ]; then
  rm -rf /tmp/gpu_check_rows
  export XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true
  timeout 300 python3 -m bench.profile_step \
    --preset=tiny --batch=2 --seq_len=32 --trace=/tmp/gpu_check_trace --trace_steps=2 2>&1 | tee "$OUT/profile.log"
  modern_profiles 300 --smoke
  unset XLA_FLAGS
  timeout 600 python3 -m bench.gpu_step --smoke --workloads=bert-base-128 --systems=bert_jax,eager \
    --variants="flash:bert.model.attention_impl=pallas;attn:model.remat=attention;threefry:jax.jax_threefry_gpu_kernel_lowering=True" \
    --json="$OUT/gpu_step.json" --deadline_s=580 --logs=/tmp/gpu_check_rows "$@" 2>&1 \
    | tee "$OUT/gpu_step.log"
  tar czf "$OUT/rows.tar.gz" -C /tmp gpu_check_rows
  exit
fi
# 1. The benchmark, within ~7 minutes (rows past the budget are reported as not run).
# Measured on an H200 on 2026-11-27, third loan (bench/RESULTS.md): BERT-base L=128 1.18x
# torch.compile in the same call, 1.21x with Triton GEMMs off (now the job's GPU default,
# bert_jax.process.GPU_XLA_FLAGS); BERT-large L=512 0.83x with 1.56x its memory; BERT-base
# L=512 0.93x (second loan). The third loan's optimized HLO (BERT-base, L=128) shows what the
# explicit attention keeps for the backward pass: each layer's bf16 scores, dropout masks and
# dropped probabilities, 5 bytes a score; 15.0 GiB at BERT-large L=512 batch 32, more than the
# step's excess memory (34.0 GiB, torch.compile 21.7).
# So this call puts the two ways of not keeping them against torch.compile at BERT-large
# L=512 first: `flash` (the fused Pallas kernel, dropout fused, no L x L tensor in memory at
# all; never reached at L=512 before) and `attn` (model.remat=attention: XLA's attention, its
# scores, softmax and masks recomputed in the backward pass: the memory back, for a second
# QK^T; expected to cost time at the same batch, measured to know how much); then the
# BERT-base L=128 pair, bert_jax's row with threefry lowered to its CUDA kernel (`threefry`:
# jax_threefry_gpu_kernel_lowering, the same bits): a first step no slower than torch.compile's
# is one of the issue's figures (59-64 s vs 54 s for BERT-base in the third loan), and there
# the state's initialisation (99 threefry draws, unrolled into a 38.7k-line program: 7.8 s to
# compile on this CPU against 17.6 s for the step) ended with the step's compile, 59 s, while
# the step alone compiled in 40.8 s in the profile; this row's step time is also the first
# since the GELUs keep only their input. Then two more ways to an earlier first step: the layers
# under nn.scan (`scan`; on CPU scan compiles 4x faster) and no autotuning of the GEMMs'
# algorithms (`noautotune`, XLA's --xla_gpu_autotune_level=0: what it costs the step); then the
# same three at BERT-base L=512, and last `attn` at L=128.
# Each row costs ~60-150 s (process start, initialisation beside the compile). ONLY
# overrides the rows (WORKLOAD:SYSTEM,...), VARIANTS the extra bert_jax systems.
V="attn:model.remat=attention"
V="$V;flash:bert.model.attention_impl=pallas,modern.model.attention=flash"
V="$V;scan:bert.model.scan_layers=True;noautotune:xla=--xla_gpu_autotune_level=0"
V="$V;threefry:jax.jax_threefry_gpu_kernel_lowering=True"
O="bert-large-512:bert_jax[flash],bert-large-512:bert_jax[attn],bert-large-512:compile"
O="$O,bert-base-128:bert_jax[threefry],bert-base-128:compile,bert-base-128:bert_jax"
O="$O,bert-base-128:bert_jax[scan],bert-base-128:bert_jax[noautotune]"
O="$O,bert-base-512:bert_jax[flash],bert-base-512:bert_jax[attn],bert-base-512:compile"
O="$O,bert-base-128:bert_jax[attn]"
# Every row ends by --deadline_s (its child's timeout cut to it); each row is in gpu_step.json
# as it ends, each child's whole output in rows.tar.gz (the device returns 8 files at most).
rm -rf /tmp/gpu_check_rows
left=$(( 430 - ($(date +%s) - start) ))
timeout $left python3 -m bench.gpu_step --budget_s=$(( left - 100 )) --child_timeout_s=200 \
  --deadline_s=$(( left - 10 )) --logs=/tmp/gpu_check_rows \
  --systems=bert_jax,compile,eager --variants="${VARIANTS:-$V}" --only="${ONLY:-$O}" \
  --matmul_sizes=8192 --json="$OUT/gpu_step.json" --no_record "$@" 2>&1 | tee "$OUT/gpu_step.log"
tar czf "$OUT/rows.tar.gz" -C /tmp gpu_check_rows
# 2. With what is left of ~9.5 minutes: where BERT-base's step spends its time at L=512
# (batch 32, bf16; L=128's profile is in bench/RESULTS.md, third loan): kernels by category,
# by kernel and by the model code they run (op_name, file:line); the optimized HLO comes back.
left=$(( 560 - ($(date +%s) - start) ))
if [ $left -gt 90 ]; then
  timeout $left python3 -m bench.profile_step --preset=base --batch=32 --seq_len=512 \
    --dtype=bfloat16 --trace=/tmp/gpu_check_trace --trace_steps=2 2>&1 | tee "$OUT/profile.log"
  cp /tmp/gpu_check_trace/step.hlo.txt.gz "$OUT/" 2>/dev/null
fi
echo "gpu_check: $(( $(date +%s) - start )) s; outputs in $OUT"
