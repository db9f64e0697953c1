"""Where the bert_jax train step spends its time, and A/B timings of variants in one process.

    python -m bench.accel.profile_step                          # variants of XLA:CPU options, interleaved
    python -m bench.accel.profile_step --ref_rev=HEAD~1         # this checkout's model vs an earlier one
    python -m bench.accel.profile_step --pieces                 # forward / backward / optimizer split
    python -m bench.accel.profile_step --model_variants="attn:remat=attention"  # config variants
    python -m bench.accel.profile_step --trace=/tmp/step_trace  # trace + top kernels by time, grouped
    python -m bench.accel.profile_step --trace=/tmp/t --dtype=bfloat16 --batch=256  # on a GPU
    python -m bench.accel.profile_step --trace=/tmp/t --dtype=bfloat16 --workload=modern-packed  # ModernBERT

On a shared CPU, step times drift by 2x with the load of other processes, so
every comparison here is made inside one process: all variants are compiled
first, then run round-robin (one step of each per round) next to a 2048^3
float32 matmul, and each variant's median is reported with its median ratio to
this checkout's step in the same round. XLA:CPU options are passed per compilation
(`compile(compiler_options=...)`), so they too compare in one process.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import gzip
import importlib.util
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench import harness
from bench.accel import gpu_step
from bench.accel import kernel_trace

REPO = harness.REPO


def _model_at(rev: str):
  """bert_jax/models/bert.py as of git `rev` (bert_jax/model.py before the models/ folder),
  imported as a separate module."""
  for name in ("bert_jax/models/bert.py", "bert_jax/model.py"):
    out = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=REPO, capture_output=True, text=True)
    if out.returncode == 0:
      src = out.stdout
      break
  else:
    raise SystemExit(f"{rev} holds neither bert_jax/models/bert.py nor bert_jax/model.py.")
  path = os.path.join(tempfile.mkdtemp(), f"model_{re.sub(r'[^0-9A-Za-z]', '_', rev)}.py")
  with open(path, "w") as f:
    f.write(src)
  return _model_file(path)


def _model_file(path: str):
  """A variant of bert_jax/models/bert.py at `path`, imported as a separate module."""
  name = "variant_" + re.sub(r"[^0-9A-Za-z]", "_", path)
  spec = importlib.util.spec_from_file_location(name, path)
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod  # dataclasses look their module up
  spec.loader.exec_module(mod)
  return mod


def _setup(preset: str, seq_len: int, batch: int, dtype: str):
  import jax.numpy as jnp
  from bench.peers.train_step import synthetic_batch, bench_config
  from bert_jax import registry, trainer as trainer_lib
  config = bench_config(preset, seq_len, dtype, batch, vocab=30522)
  preds = config.data.max_predictions_per_seq
  model, objective, sample = registry.pretraining(config)
  cfg = model.config
  trainer = trainer_lib.build(config, model, objective, sample, workdir=None)
  tx = trainer.tx
  with trainer.activate():
    state = trainer.init()
  data = {k: jnp.asarray(v) for k, v in synthetic_batch(np.random.default_rng(0), batch, seq_len,
                                                          preds, 30522).items()}
  return config, cfg, tx, state, data, preds


def _dots_only(cfg, batch: int, seq_len: int, preds: int):
  """(fn, args, flops): the matmuls of one train step alone, at the step's shapes (forward
  x @ W, backward dX = dY @ W^T and dW = X^T @ dY), with no elementwise work between them:
  the floor the step would reach if everything but the dots were free. Every dot gets
  its own operands (XLA would merge identical ones)."""
  import jax
  import jax.numpy as jnp
  N, D, F, V, H, K = (batch * seq_len, cfg.hidden_size, cfg.intermediate_size,
                      cfg.vocab_size, cfg.num_heads, cfg.head_dim)
  n = cfg.num_layers
  keys = iter(jax.random.split(jax.random.key(0), 16))
  arr = lambda *s: jax.random.normal(next(keys), s, jnp.float32)
  args = dict(x_ND=arr(n, 4, N, D), dy_ND=arr(n, 4, N, D), w_DD=arr(n, 4, D, D),
              x_NF=arr(n, N, F), w_DF=arr(n, 2, D, F), q_BHLK=arr(n, 3, batch, H, seq_len, K),
              p_BHLM=arr(n, 2, batch, H, seq_len, seq_len), h_PD=arr(batch * preds, D),
              e_VD=arr(V, D))

  def step(a):
    outs = []
    for i in range(n):
      x, dy, w = a["x_ND"][i], a["dy_ND"][i], a["w_DD"][i]
      for j in range(4):  # q, k, v, output projections: forward, dX, dW
        outs += [x[j] @ w[j], dy[j] @ w[j].T, x[j].T @ dy[j]]
      x_NF, w_DF = a["x_NF"][i], a["w_DF"][i]
      outs += [x[0] @ w_DF[0], x_NF @ w_DF[0].T, x[1].T @ x_NF,  # FFN in
               x_NF @ w_DF[1].T, x[2] @ w_DF[1], x_NF.T @ x[3]]  # FFN out
      q, p = a["q_BHLK"][i], a["p_BHLM"][i]
      outs += [jnp.einsum("bhlk,bhmk->bhlm", q[0], q[1]),  # scores
               jnp.einsum("bhlm,bhmk->bhlk", p[0], q[2]),  # context
               jnp.einsum("bhlm,bhmk->bhlk", p[1], q[0]),  # d scores -> dq
               jnp.einsum("bhlm,bhlk->bhmk", p[1], q[1]),  # d scores -> dk
               jnp.einsum("bhlm,bhlk->bhmk", p[0], q[2]),  # d context -> dv
               jnp.einsum("bhlk,bhmk->bhlm", q[2], q[0])]  # d context -> dprobs
    logits = a["h_PD"] @ a["e_VD"].T  # tied vocabulary projection at the masked positions
    outs += [logits, logits @ a["e_VD"], logits.T @ a["h_PD"]]
    return outs

  from bert_jax import flops as flops_lib
  flops = flops_lib.train_flops_per_step(cfg, batch, seq_len, preds) - 3 * batch * (
      2 * preds * D * D + 2 * D * D + 4 * D)  # less the small MLM transform, pooler, NSP
  return jax.jit(step), (args,), flops


def _time_round_robin(fns: dict, rounds: int) -> dict:
  """{name: (callable, args)} -> {name: [seconds per round]}; one call of each per round."""
  import jax
  times = collections.defaultdict(list)
  for name, (f, args) in fns.items():  # warm-up
    jax.block_until_ready(f(*args))
  for _ in range(rounds):
    for name, (f, args) in fns.items():
      t = time.perf_counter()
      jax.block_until_ready(f(*args))
      times[name].append(time.perf_counter() - t)
  return times


def _report(times: dict, flops: float | None = None) -> None:
  names = list(times)
  ref = next((n for n in names if n.startswith("step")), names[0])
  mm = times.get("matmul 2048^3")
  steps = [n for n in names if n.startswith("step")]
  # The fastest matmul of all rounds, raised to the fastest step of any variant (a 2048^3
  # matmul can read below what the step's own shapes reach): MFU never above 100%.
  peak = max([2 * 2048 ** 3 / min(mm)] + [flops / min(times[n]) for n in steps]) if mm else 0
  print(f"{'variant':58s} {'median ms':>10s} {'min ms':>9s} {'vs ' + ref[:12]:>16s}"
        + ("   MFU (median; best matmul or step = 100%)" if flops and peak else ""))
  for n in names:
    ts = times[n]
    ratio = statistics.median(t / r for t, r in zip(ts, times[ref]))
    line = f"{n[:58]:58s} {1e3 * statistics.median(ts):10.1f} {1e3 * min(ts):9.1f} {ratio:16.3f}"
    if flops and peak and n in steps:
      line += f"   {100 * flops / statistics.median(ts) / peak:5.1f}%"
    print(line, flush=True)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="base")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--ref_rev", default="", help="also time the model of this git revision")
  parser.add_argument("--model_files", default="",
                      help="comma list of variant model.py files to time as well")
  parser.add_argument("--options", default="",
                      help="';'-separated variants of XLA:CPU compiler options, each "
                           "'name=value&name=value' (e.g. 'xla_cpu_experimental_ynn_fusion_type=')")
  parser.add_argument("--model_variants", default="",
                      help="';'-separated variants of the model's config, each "
                           "'NAME:field=value,field=value' (e.g. 'attn:remat=attention')")
  parser.add_argument("--no_mesh", action="store_true",
                      help="plain jax.jit of train_step (no mesh, rules or shardings)")
  parser.add_argument("--compare_no_mesh", action="store_true",
                      help="also time a plain jax.jit of train_step")
  parser.add_argument("--pieces", action="store_true", help="forward / backward / optimizer split")
  parser.add_argument("--trace", default="",
                      help="write a trace of --trace_steps steps here and print the top kernels "
                           "by time, grouped (matmuls, attention, elementwise, copies, "
                           "gather/scatter, optimizer)")
  parser.add_argument("--trace_steps", type=int, default=3)
  parser.add_argument("--workload", default="", choices=("",) + gpu_step.WORKLOADS,
                      help="with --trace: the step of this bench/accel/gpu_step.py row instead "
                           "(e.g. modern-packed: ModernBERT-base on packed rows), at --dtype")
  parser.add_argument("--overrides", default="",
                      help="with --workload: config fields, as a gpu_step variant's "
                           "'field=value,...' (e.g. 'modern.model.attention=flash')")
  parser.add_argument("--smoke", action="store_true",
                      help="with --workload: its tiny CPU version (what the test runs)")
  return parser


def _step_compiler(args, config, tx, objective, state, data, rng):
  """compiled_step(model, options=None, use_mesh=True): the train step as the trainer runs it
  (state donated), compiled with XLA `options`, run on its own copy of the state."""
  import jax
  import jax.numpy as jnp
  from bert_jax import registry, trainer as trainer_lib

  def compiled_step(model, options=None, use_mesh=True):
    """The train step as the trainer runs it (state donated), on its own copy of the state."""
    t = time.perf_counter()
    if args.no_mesh or not use_mesh:
      step = jax.jit(functools.partial(trainer_lib.train_step, model=model, tx=tx,
                                       objective=objective), donate_argnums=(0,))
      c = step.lower(state, data, rng).compile(compiler_options=options or None)
    else:  # the trainer's own jitted step: a mesh, logical axis rules, shardings
      _, _, sample = registry.pretraining(config)
      trainer = trainer_lib.build(config, model, objective, sample, workdir=None)
      with trainer.activate():
        c = trainer.train_step.lower(state, data, rng).compile(compiler_options=options or None)
    print(f"compiled in {time.perf_counter() - t:.1f} s: options={options}", flush=True)
    own = [jax.tree.map(jnp.copy, state)]

    def run():
      own[0], metrics = c(own[0], data, rng)
      return metrics
    run.hlo = c.as_text()
    return run
  return compiled_step


def _workload_step(args, rng):
  """--workload: bench/accel/gpu_step.py's bert_jax row (its config with --overrides, its batches)
  compiled as the trainer compiles it; run() steps through the batches in turn. Returns
  (run, a label, useful tokens a step, FLOPs a step)."""
  _, overrides, flags = gpu_step.parse_variants("overrides:" + args.overrides)[0]
  if flags:
    raise SystemExit("--overrides: XLA flags apply to the whole process; set XLA_FLAGS instead.")
  spec = gpu_step.workload_spec(args.workload, args.dtype, args.smoke, overrides)
  model, trainer, host_batches, tokens, steps = gpu_step.bert_jax_trainer(spec)
  t = time.perf_counter()  # as the job: the step compiles in a thread beside initialisation
  trainer.compile_ahead({k: (v.shape, v.dtype) for k, v in host_batches[0].items()})
  with trainer.activate():
    state = trainer.init()
    batches = [trainer.to_global(b) for b in host_batches]
    c = trainer.compiled_ahead(fallback=False)
  print(f"compiled in {time.perf_counter() - t:.1f} s, beside the initialisation: "
        f"{args.workload} {args.overrides}".rstrip(), flush=True)
  box, cycle = [state], itertools.cycle(batches)

  def run():
    box[0], metrics = c(box[0], next(cycle), rng)
    return metrics
  run.hlo = c.as_text()
  label = f"{args.workload}{' (smoke)' if args.smoke else ''}, {args.dtype}"
  return run, label, statistics.mean(tokens), gpu_step.step_flops(spec, model.config, steps)


def _trace(args, run, label: str, tokens: float, flops: float) -> None:
  """--trace: the untraced step time (its tokens/s and MFU against the chip's dense peak),
  then --trace_steps steps traced and their kernels."""
  import jax
  from bert_jax import flops as flops_lib
  # The optimized HLO beside the trace (what each kernel's fusion holds), first: a run cut
  # short still leaves it.
  os.makedirs(args.trace, exist_ok=True)
  with gzip.open(os.path.join(args.trace, "step.hlo.txt.gz"), "wt") as f:
    f.write(run.hlo)
  for _ in range(3):  # warm-up; then the untraced step time, then the traced steps
    jax.block_until_ready(run())
  t = time.perf_counter()  # steps queued back to back, as training runs them
  jax.block_until_ready([run() for _ in range(args.trace_steps)])
  step_s = (time.perf_counter() - t) / args.trace_steps
  jax.profiler.start_trace(args.trace)
  jax.block_until_ready([run() for _ in range(args.trace_steps)])
  jax.profiler.stop_trace()
  kind = jax.devices()[0].device_kind
  peak = flops_lib.PEAK_BF16_FLOPS.get(kind)
  mfu = f", {100 * flops / step_s / peak:.1f}% of the dense bf16 peak" if peak else ""
  print(f"{label} on {kind}: {tokens / step_s / 1e3:.1f}k tokens/s{mfu}; {args.trace_steps} "
        f"steps traced into {args.trace} (xprof / TensorBoard read it too)")
  try:
    events = kernel_trace.trace_events(args.trace)
  except FileNotFoundError as e:
    print(f"no kernel summary: {e}")
    return
  if not events:
    print("the trace holds no per-op events (on CPU set "
          "XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true)")
    return
  print(kernel_trace.kernel_summary(events, kernel_trace.hlo_categories(run.hlo), args.trace_steps, step_s,
                       sources=kernel_trace.hlo_sources(run.hlo)))


def _variant_steps(args, cfg, model, compiled_step, fns: dict) -> None:
  """Into `fns`: this checkout's step, --ref_rev's and --model_files' models, the
  --model_variants of its config, the plain jit
  (--compare_no_mesh) and each --options variant of XLA:CPU options."""
  fns["step (this checkout)"] = (compiled_step(model), ())
  variants = [(f"model.py @ {args.ref_rev}", _model_at(args.ref_rev))] if args.ref_rev else []
  variants += [(path, _model_file(path)) for path in filter(None, args.model_files.split(","))]
  for name, mod in variants:
    known = {f.name for f in dataclasses.fields(mod.BertConfig)}
    other = mod.BertForPreTraining(mod.BertConfig(
        **{k: v for k, v in cfg.to_dict().items() if k in known}))
    fns[f"step ({name})"] = (compiled_step(other), ())
  for name, overrides, flags in gpu_step.parse_variants(args.model_variants):
    if flags:
      raise SystemExit(f"--model_variants {name!r}: XLA flags apply to a whole process; pass "
                       "compiler options with --options instead.")
    fns[f"step ({name})"] = (compiled_step(type(model)(cfg.replace(**overrides))), ())
  if args.compare_no_mesh:
    fns["step (no mesh)"] = (compiled_step(model, use_mesh=False), ())
  for variant in filter(None, args.options.split(";")):
    opts = dict(kv.split("=", 1) for kv in variant.split("&"))
    opts = {k: {"true": True, "false": False}.get(v.lower(), v) for k, v in opts.items()}
    fns[f"step {variant}"] = (compiled_step(model, opts), ())


def _piece_fns(args, cfg, model, objective, tx, state, data, rng, preds: int, fns: dict) -> None:
  """--pieces, into `fns`: forward, forward+backward, the optimizer update, the step's
  matmuls alone and the norms the step logs."""
  import jax
  import optax

  def loss(params, deterministic):
    out = objective.apply(model, params, data, deterministic=deterministic,
                          rngs={"dropout": rng})
    return objective.batch_loss(out, data)
  p = state.params
  fns["forward (dropout)"] = (jax.jit(lambda p: loss(p, False)), (p,))
  fns["forward (deterministic)"] = (jax.jit(lambda p: loss(p, True)), (p,))
  fns["forward+backward (dropout)"] = (jax.jit(jax.grad(lambda p: loss(p, False))), (p,))
  fns["forward+backward (deterministic)"] = (jax.jit(jax.grad(lambda p: loss(p, True))), (p,))
  fns["optimizer update"] = (jax.jit(lambda s, g: optax.apply_updates(
      s.params, tx.update(g, s.opt_state, s.params)[0])), (state, p))
  dots, dots_args, dots_flops = _dots_only(cfg, args.batch, args.seq_len, preds)
  print(f"dots only: {dots_flops / 1e9:.1f} GFLOP")
  fns["the step's matmuls alone"] = (dots, dots_args)
  fns["grad_norm + param_norm"] = (jax.jit(lambda s, g: (optax.global_norm(g), optax.global_norm(
      s.params))), (state, p))


def main(argv=None) -> None:
  args = _parser().parse_args(argv)
  from bert_jax import process
  process.job_xla_flags()  # the XLA flags the pre-training job runs with (before any device)
  import jax
  if args.workload:
    if not args.trace:
      raise SystemExit("--workload profiles a traced step: give --trace=DIR too.")
    _trace(args, *_workload_step(args, jax.random.key(1)))
    return
  import jax.numpy as jnp
  from bert_jax import flops as flops_lib
  from bert_jax.models import bert as model_lib
  from bert_jax import objectives
  objective = objectives.pretraining()
  config, cfg, tx, state, data, preds = _setup(args.preset, args.seq_len, args.batch, args.dtype)
  flops = flops_lib.train_flops_per_step(cfg, args.batch, args.seq_len, preds)
  rng = jax.random.key(1)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2048, 2048)), jnp.float32)
  fns = {"matmul 2048^3": (jax.jit(lambda a: a @ a), (x,))}
  compiled_step = _step_compiler(args, config, tx, objective, state, data, rng)
  model = model_lib.BertForPreTraining(cfg)
  if args.trace:
    label = f"{args.preset}, batch {args.batch} x {args.seq_len}, {args.dtype}"
    _trace(args, compiled_step(model), label, args.batch * args.seq_len, flops)
    return
  _variant_steps(args, cfg, model, compiled_step, fns)
  if args.pieces:
    _piece_fns(args, cfg, model, objective, tx, state, data, rng, preds, fns)
  times = _time_round_robin(fns, args.rounds)
  print(f"{args.preset}, batch {args.batch} x {args.seq_len}, {args.dtype}; median of {args.rounds} "
        f"round-robin rounds; analytic {flops / 1e9:.1f} GFLOP/step")
  _report(times, flops)


if __name__ == "__main__":
  main()
