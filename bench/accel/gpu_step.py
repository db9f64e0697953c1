"""The pre-training step on one GPU: bert_jax vs transformers eager vs transformers + torch.compile.

    python -m bench.accel.gpu_step                        # every workload, every system (one GPU, ~8 min)
    python -m bench.accel.gpu_step --workloads=bert-base-128,modern-packed --systems=bert_jax,compile
    python -m bench.accel.gpu_step --variants='flash:bert.model.attention_impl=pallas,modern.model.attention=flash'
    python -m bench.accel.gpu_step --smoke                # CPU, tiny models, seconds (what the test runs)

Workloads (bfloat16 compute, float32 master weights, random ids, the same batch on each side):
  bert-{base,large}-128   BERT at L=128, batch 256 (P=20 masked positions a row)
  bert-{base,large}-512   BERT at L=512, batch 32 (P=76)
  modern-packed           ModernBERT-base at L=1024, 16 packed rows of documents of log-normal
                          length (bench/peers/modern_step.py's workload: median 256, sigma 0.9);
                          tokens/s counts useful (non-padding) tokens; transformers is fed the
                          same examples bucketed by length into micro-batches of <= 16 x 1024
                          padded tokens (--modern_torch_mode)
  modern-full             ModernBERT-base at L=1024, 16 rows of one 1024-token document each
Systems: bert_jax (the trainer's jitted train_step, as bench.peers.train_step runs it), eager
(transformers BertForPreTraining / ModernBertForMaskedLM, SDPA attention, bf16 autocast, fused
AdamW, global-norm clipping), compile (the same under torch.compile). Each (workload, system)
runs in its own process; the systems of a workload run one after another (rounds alternate
their order). A row: ms/step of --steps steps queued back to back after --warmup (as
training runs; the median of steps each waited for is `synced_s` in the JSON and the column
"ms/step, each waited"), tokens/s, seconds to the first step (compilation included; bert_jax,
as the pre-training job, compiles the step in a thread while the state is initialised: its
JSON rows give imports_s, then from the compilation's start: init_compile_s (the init's
lowering and compilation), init_s (the state made) and compile_s (the step compiled)),
peak device memory, MFU against the chip's dense bf16 peak (bert_jax.flops.PEAK_BF16_FLOPS) and against a bf16 matmul measured in the run.

--variants adds bert_jax rows with config overrides and/or XLA flags, each its own process (the
bert_jax rows run with the job's XLA flags, bert_jax.process.GPU_XLA_FLAGS, unless a variant sets them);
a field prefixed `bert.` or `modern.` applies to that family's workloads only:
  flash:bert.model.attention_impl=pallas,modern.model.attention=flash  (bert_jax.flash kernels)
  cudnn:bert.model.attention_impl=cudnn,bert.model.attention_dropout_rate=0
  threefry:jax.jax_threefry_gpu_kernel_lowering=True   (a jax.config option: `jax.NAME=value`)
  triton:xla=--xla_gpu_enable_triton_gemm=true   (XLA's Triton GEMMs: the job turns them off)
--budget_s skips the rows that would start after it (reported as not run); --deadline_s cuts
each row's time so that all end by then (for a caller's own timeout); --json is rewritten
after each row, --logs keeps each child's whole output. Imports no
TensorFlow. Appends the table to bench/results/accel.md unless --no_record or --smoke; --json
writes the rows too.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import platform
import re
import statistics
import time

import numpy as np

from bench import harness

START = time.perf_counter()  # a child's seconds to its first step count from here (imports too)
REPO = harness.REPO
VOCAB = 30522

BERT = {  # name: (preset, L, batch, P)
    "bert-base-128": ("base", 128, 256, 20), "bert-base-512": ("base", 512, 32, 76),
    "bert-large-128": ("large", 128, 256, 20), "bert-large-512": ("large", 512, 32, 76),
}
MODERN = {  # name: modern_step options (packed rows of documents)
    "modern-packed": dict(median_len=256, sigma=0.9, min_len=16),
    "modern-full": dict(median_len=1024, sigma=0.0, min_len=1024),
}
WORKLOADS = tuple(BERT) + tuple(MODERN)
SYSTEMS = ("bert_jax", "eager", "compile")
# The most informative rows first: what runs before --budget_s runs out.
PRIORITY = ("bert-base-128", "modern-packed", "bert-large-128", "bert-base-512",
            "bert-large-512", "modern-full")


def modern_opts(name: str, smoke: bool) -> dict:
  opts = dict(preset="modernbert-base", seq_len=1024, rows=16, preds=320, examples_per_row=8,
              mask_prob=0.3, batches=1, seed=0, threads=os.cpu_count() or 1, lr=1e-4, peak_n=1024,
              **MODERN[name])
  if smoke:
    opts.update(num_layers=3, hidden_size=64, num_heads=4, intermediate_size=96, local_window=16,
                vocab_size=500, seq_len=128, rows=2, preds=40, max_position_embeddings=128,
                median_len=min(opts["median_len"], 128), min_len=min(opts["min_len"], 128))
  return opts


def _sync(device: str):
  if device == "cuda":
    import torch  # pylint: disable=g-import-not-at-top
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------
# Children: one (workload, system) each; print one RESULT line.

def _bert_batch(spec: dict) -> dict:
  from bench.peers.train_step import synthetic_batch  # pylint: disable=g-import-not-at-top
  preset, L, batch, P = spec["bert"]
  return synthetic_batch(np.random.default_rng(0), batch, L, P, spec["vocab"])


def _time_steps(step, n_warmup: int, n: int, sync) -> dict[str, float]:
  """step_s: the mean of `n` steps queued back to back with one wait at the end, as a
  training loop runs (bert_jax's reads its metrics a step late; transformers' queues CUDA
  work asynchronously), so no step waits for the host to dispatch the next; synced_s: the
  median of `n` steps each waited for (what the rows measured before 2026-11-27)."""
  for _ in range(n_warmup):
    step()
  sync()
  times = []
  for _ in range(n):
    t = time.perf_counter()
    step()
    sync()
    times.append(time.perf_counter() - t)
  t = time.perf_counter()
  for _ in range(n):
    step()
  sync()
  return dict(step_s=(time.perf_counter() - t) / n, synced_s=statistics.median(times))


def bert_jax_workload(spec: dict):
  """The trainer's config (the row's overrides applied), the host batches, their useful
  tokens and, for ModernBERT, modern_step's steps (None for BERT)."""
  if "bert" in spec:
    from bench.peers.train_step import bench_config  # pylint: disable=g-import-not-at-top
    preset, L, batch, P = spec["bert"]
    config = bench_config(preset, L, spec["dtype"], batch, spec["vocab"])
    if spec.get("smoke"):
      config.model.max_position_embeddings = max(L, 32)
    host_batches = [_bert_batch(spec)]
    tokens = [batch * L]
    steps = None
  else:
    from bench.peers import modern_sides  # pylint: disable=g-import-not-at-top
    opts = spec["modern"]
    config = modern_sides.job_config(opts)
    config.model.dtype = spec["dtype"]
    steps, _ = modern_sides.make_steps(opts, config.model.vocab_size)
    host_batches = [s["batch"] for s in steps]
    tokens = [s["tokens"] for s in steps]
  family = "bert" if "bert" in spec else "modern"
  fields = {}  # a field prefixed bert. / modern. is that family's only
  for key, value in spec.get("overrides", {}).items():
    scope, _, rest = key.partition(".")
    if scope == "jax":  # jax_options' (set before anything traces)
      continue
    if scope not in ("bert", "modern"):
      fields[key] = value
    elif scope == family:
      fields[rest] = value
  config.update_from_flattened_dict(fields)
  return config, host_batches, tokens, steps


def jax_options(spec: dict) -> None:
  """The row's `jax.NAME=value` overrides as jax.config options (e.g.
  jax.jax_threefry_gpu_kernel_lowering=True), set before anything traces."""
  import jax  # pylint: disable=g-import-not-at-top
  for key, value in spec.get("overrides", {}).items():
    if key.startswith("jax."):
      jax.config.update(key[4:], value)


def bert_jax_trainer(spec: dict):
  """(model, trainer on one device, host batches, useful tokens, modern_step's steps) of the
  row: its jax options set, its config built (bert_jax_workload)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import registry, trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  jax_options(spec)
  config, host_batches, tokens, steps = bert_jax_workload(spec)
  model, objective, sample = registry.pretraining(config)
  trainer = trainer_lib.build(config, model, objective, sample, workdir=None,
                              devices=jax.devices()[:1])
  return model, trainer, host_batches, tokens, steps


def step_flops(spec: dict, cfg, steps) -> float:
  """The row's training FLOPs a step (ModernBERT's: of its examples' useful tokens, the
  mean over bert_jax_workload's `steps`)."""
  from bert_jax import flops as flops_lib  # pylint: disable=g-import-not-at-top
  if "bert" in spec:
    preset, L, batch, P = spec["bert"]
    return flops_lib.train_flops_per_step(cfg, batch, L, P)
  from bench.peers import modern_step  # pylint: disable=g-import-not-at-top
  return statistics.mean(modern_step.useful_flops(cfg, s) for s in steps)


def child_bert_jax(spec: dict) -> dict:
  from bert_jax import process  # pylint: disable=g-import-not-at-top
  process.job_xla_flags()  # as the job (bert_jax.main) runs: its XLA flags, before any device
  import jax  # pylint: disable=g-import-not-at-top
  model, trainer, host_batches, tokens, steps = bert_jax_trainer(spec)
  # As the pre-training job does: the step compiles in a thread beside initialisation.
  imports_s = time.perf_counter() - START  # imports, the config, the trainer's build
  t = time.perf_counter()
  trainer.compile_ahead({k: (v.shape, v.dtype) for k, v in host_batches[0].items()})
  with trainer.activate():
    # trainer.init() as two timed halves (the same work), both beside the step's compile:
    # does a slow first step wait on the init's compilation or on its run?
    init = trainer.init
    assert isinstance(init, functools.partial), init  # (the jitted init, its rng)
    init_compiled = init.func.lower(*init.args).compile()
    init_compile_s = time.perf_counter() - t
    state = init_compiled(*init.args)
    jax.block_until_ready(state)
    init_s = time.perf_counter() - t
    batches = [trainer.to_global(b) for b in host_batches]
    rng = jax.random.key(0)
    jax.block_until_ready((state, batches))
    setup_s = time.perf_counter() - START  # ... and the model's and optimizer's initialisation
    compiled = trainer.compiled_ahead(fallback=False)  # a failure: its error (not a 2nd try)
    compile_s = time.perf_counter() - t  # compile_ahead's start to its step (init beside it)
    box, cycle = [state, None], itertools.cycle(batches)

    def step():
      box[0], box[1] = compiled(box[0], next(cycle), rng)

    step()
    jax.block_until_ready(box)
    first_s = time.perf_counter() - START
    timed = _time_steps(step, spec["warmup"], spec["steps"], lambda: jax.block_until_ready(box))
    stats = jax.devices()[0].memory_stats() or {}
    mem = stats.get("peak_bytes_in_use")
    if mem is None:
      ma = compiled.memory_analysis()
      mem = getattr(ma, "temp_size_in_bytes", 0) + getattr(ma, "argument_size_in_bytes", 0)
  # FP8 GEMMs XLA made of the step (model.matmul_dtype=fp8: whether the GPU compiler turned
  # its quantise-dequantise matmuls into cuBLASLt FP8 calls; 0 elsewhere)
  fp8_matmuls = compiled.as_text().count("__cublas$lt$matmul$f8")
  return dict(**timed, first_s=first_s, compile_s=compile_s,
              setup_s=setup_s, imports_s=imports_s, init_s=init_s,
              init_compile_s=init_compile_s, mem_gib=mem / 2**30, fp8_matmuls=fp8_matmuls,
              flops=step_flops(spec, model.config, steps), tokens=statistics.mean(tokens),
              loss=float(box[1]["loss"]), versions=f"jax {jax.__version__}",
              device=jax.devices()[0].device_kind)


def _torch_setup(spec: dict):
  import torch  # pylint: disable=g-import-not-at-top
  device = "cuda" if torch.cuda.is_available() else "cpu"
  if device == "cpu":
    torch.set_num_threads(os.cpu_count() or 1)
  else:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
  return torch, device


def _adamw(torch, params, device):
  try:
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, eps=1e-6, fused=device == "cuda")
  except (RuntimeError, TypeError, ValueError):
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, eps=1e-6)


def _torch_workload(spec: dict, torch, device: str):
  """transformers' model on `device` and the step's inputs: (model, [(model kwargs, weight
  of its loss)], FLOPs a step, useful tokens a step)."""
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax import flops as flops_lib  # pylint: disable=g-import-not-at-top
  if "bert" in spec:
    from bert_jax.models import bert as model_lib  # pylint: disable=g-import-not-at-top
    preset, L, batch, P = spec["bert"]
    p = model_lib.PRESETS[preset]
    hf = transformers.BertConfig(vocab_size=spec["vocab"], hidden_size=p["hidden_size"],
                                 num_hidden_layers=p["num_layers"], num_attention_heads=p["num_heads"],
                                 intermediate_size=4 * p["hidden_size"], hidden_act="gelu_new",
                                 max_position_embeddings=max(L, 32 if spec.get("smoke") else 512),
                                 attn_implementation="sdpa")
    model = transformers.BertForPreTraining(hf).to(device).train()
    b = _bert_batch(spec)
    labels = np.full(b["input_ids"].shape, -100, np.int64)
    np.put_along_axis(labels, b["masked_lm_positions"], b["masked_lm_ids"], 1)
    tt = lambda x: torch.tensor(x, dtype=torch.long, device=device)
    parts = [(dict(input_ids=tt(b["input_ids"]), token_type_ids=tt(b["segment_ids"]),
                   attention_mask=tt(b["input_mask"]), labels=tt(labels),
                   next_sentence_label=tt(b["next_sentence_labels"])), 1.0)]
    cfg = model_lib.BertConfig.from_preset(preset, vocab_size=spec["vocab"])
    flops, tokens = flops_lib.train_flops_per_step(cfg, batch, L, P), batch * L
    return model, parts, flops, tokens
  from bench.peers import modern_sides, modern_step  # pylint: disable=g-import-not-at-top
  opts = spec["modern"]
  steps, _ = modern_sides.make_steps(opts, modern_sides.model_config(opts).vocab_size)
  theirs = modern_sides.Theirs(opts, steps)
  model = theirs.model.to(device)
  to_dev = lambda v: ({k: to_dev(x) for k, x in v.items()} if isinstance(v, dict)
                      else v.to(device) if hasattr(v, "to") else v)
  parts = [({k: to_dev(v) for k, v in kw.items()}, w)
           for kw, w in theirs._inputs(spec["torch_mode"], 0)]  # pylint: disable=protected-access
  cfg = modern_sides.model_config(opts)
  flops, tokens = modern_step.useful_flops(cfg, steps[0]), steps[0]["tokens"]
  return model, parts, flops, tokens


def child_torch(spec: dict) -> dict:
  torch, device = _torch_setup(spec)
  import transformers  # pylint: disable=g-import-not-at-top
  autocast = lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=spec["dtype"] == "bfloat16")
  model, parts, flops, tokens = _torch_workload(spec, torch, device)
  opt = _adamw(torch, model.parameters(), device)
  forward = torch.compile(model) if spec["system"] == "compile" else model

  def step():
    total = 0.0
    for kwargs, w in parts:
      with autocast():
        loss = forward(**kwargs).loss * w
      loss.backward()
      total = total + loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    step.loss = total

  if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
  step()
  _sync(device)
  first_s = time.perf_counter() - START
  timed = _time_steps(step, spec["warmup"], spec["steps"], lambda: _sync(device))
  mem = torch.cuda.max_memory_allocated() if device == "cuda" else float("nan")
  return dict(**timed, first_s=first_s, compile_s=float("nan"),
              mem_gib=mem / 2**30, flops=flops, tokens=tokens, loss=float(step.loss),
              calls=len(parts), versions=f"torch {torch.__version__}, transformers {transformers.__version__}",
              device=torch.cuda.get_device_name() if device == "cuda" else platform.machine())


def child_matmul(spec: dict) -> dict:
  """The best bf16 matmul rate JAX reaches on this device (square shapes)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  best = 0.0
  for n in spec["sizes"]:
    a = jnp.ones((n, n), jnp.bfloat16)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, a).block_until_ready()
    for _ in range(5):
      t = time.perf_counter()
      mm(a, a).block_until_ready()
      best = max(best, 2 * n ** 3 / (time.perf_counter() - t))
  return dict(flops_per_s=best, device=jax.devices()[0].device_kind, versions=f"jax {jax.__version__}")


def child(spec: dict) -> None:
  fn = {"bert_jax": child_bert_jax, "eager": child_torch, "compile": child_torch,
        "matmul": child_matmul}[spec["system"]]
  harness.emit(fn(spec))


# ----------------------------------------------------------------------------
# The driver.

def run_child(spec: dict, timeout: float, xla_flags: str = "", log: str = "") -> dict:
  """The child's RESULT row, or its error; `log`: a file for its whole stdout and stderr
  (a timed-out child's too)."""
  env = harness.child_env(REPO, keep_pythonpath=True,
                          PYTHONUNBUFFERED="1")  # a timed-out child's output up to its end
  if xla_flags:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla_flags).strip()
  header = f"{json.dumps(spec)}\nXLA_FLAGS={env.get('XLA_FLAGS', '')}\n"
  return harness.child_row(harness.module_child("bench.accel.gpu_step", spec), env=env, timeout=timeout, log=log, log_header=header, wall=True)


def parse_variants(text: str) -> list[tuple[str, dict, str]]:
  """'NAME:key=value,key=value;...' -> [(name, config overrides, XLA flags)]; the key `xla`
  takes flags (space-separated), other keys are config fields (values as Python literals
  where they parse, else strings)."""
  import ast  # pylint: disable=g-import-not-at-top
  out = []
  for item in filter(None, (v.strip() for v in text.split(";"))):
    name, _, body = item.partition(":")
    overrides, flags = {}, ""
    for kv in filter(None, body.split(",")):
      key, _, value = kv.partition("=")
      if key.strip() == "xla":
        flags += " " + value.strip()
        continue
      try:
        overrides[key.strip()] = ast.literal_eval(value.strip())
      except (ValueError, SyntaxError):
        overrides[key.strip()] = value.strip()
    out.append((name.strip(), overrides, flags.strip()))
  return out


def _fmt(row: dict, dense_peak: float, measured_peak: float) -> str:
  if "error" in row:
    return (f"| {row['workload']} | {row['system']} | not run: {row['error']} |"
            + " |" * 8)
  s = row["step_s"]
  mfu = lambda peak: f"{100 * row['flops'] / s / peak:.1f}%" if peak else "n/a"
  return (f"| {row['workload']} | {row['system']} | {row['tokens'] / s / 1e3:.1f}k | {1e3 * s:.1f} | "
          f"{1e3 * row.get('synced_s', float('nan')):.1f} | {row['first_s']:.1f} | "
          f"{row['mem_gib']:.2f} | {mfu(dense_peak)} | {mfu(measured_peak)} | "
          f"{row.get('vs_best', float('nan')):.2f} | {row['loss']:.3f} |")


def _parser() -> argparse.ArgumentParser:
  parser = harness.parser(__doc__, child=True)
  parser.add_argument("--workloads", default=",".join(PRIORITY))
  parser.add_argument("--systems", default=",".join(SYSTEMS))
  parser.add_argument("--variants", default="", help="extra bert_jax rows (see above)")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=1, help="passes over the rows (alternating)")
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--modern_torch_mode", default="bucketed_step",
                      help="how transformers is fed modern-packed (bench/peers/modern_step.py modes; "
                           "bucketed, L tokens a micro-batch, ran 1424 ms a step on an H200)")
  parser.add_argument("--only", default="",
                      help="run just these rows: WORKLOAD:SYSTEM,... (e.g. bert-large-128:bert_jax,"
                           "bert-base-128:bert_jax[flash]), in this order")
  parser.add_argument("--budget_s", type=float, default=450.0)
  parser.add_argument("--child_timeout_s", type=float, default=240.0)
  parser.add_argument("--deadline_s", type=float, default=float("inf"),
                      help="every row ends by then (a child's timeout is cut to it)")
  parser.add_argument("--logs", default="", help="a folder for each child's whole output")
  parser.add_argument("--matmul_sizes", default="4096,8192")
  parser.add_argument("--json", default="", help="also write the rows here")
  return parser


def workload_spec(workload: str, dtype: str, smoke: bool, overrides: dict) -> dict:
  """A workload's model and data (its tiny CPU version with `smoke`), config `overrides`
  applied by bert_jax_workload."""
  spec = dict(dtype=dtype, vocab=500 if smoke else VOCAB, smoke=smoke, overrides=overrides)
  if workload in BERT:
    preset, L, batch, P = BERT[workload]
    spec["bert"] = ("tiny", 32, 2, 5) if smoke else (preset, L, batch, P)
  else:
    spec["modern"] = modern_opts(workload, smoke)
  return spec


def _spec(args, workload: str, system: str, overrides: dict) -> dict:
  """What a child runs: one (workload, system) at the run's settings."""
  return dict(workload_spec(workload, args.dtype, args.smoke, overrides),
              system=system.split("[")[0], steps=args.steps, warmup=args.warmup,
              torch_mode=args.modern_torch_mode)


def _run_rows(args, workloads: list[str], systems: list[tuple], start: float) -> list[dict]:
  """Every (workload, system) once a round, each in its own process, the systems' order
  alternating; the rows that would start after --budget_s are not run, and none runs past
  --deadline_s. --json holds the rows so far after each one (--logs: each child's output)."""
  rows = []
  for r in range(args.rounds):
    for workload, system, overrides, flags in _plan(args, workloads, systems, r):
      spec = _spec(args, workload, system, overrides)
      row = dict(workload=workload, system=system, round=r, xla_flags=flags)
      elapsed = time.perf_counter() - start
      timeout = min(args.child_timeout_s, args.deadline_s - elapsed)
      if elapsed > args.budget_s:
        row["error"] = f"budget of {args.budget_s:.0f} s spent"
      elif timeout < min(30, args.child_timeout_s):
        row["error"] = f"deadline: {max(timeout, 0):.0f} s left of {args.deadline_s:.0f}"
      else:
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{len(rows):02d}_{workload}_{system}").strip("-")
        row.update(run_child(spec, timeout, flags,
                             os.path.join(args.logs, name + ".log") if args.logs else ""))
      rows.append(row)
      print(json.dumps(row), flush=True)
      if args.json:
        _write_json(args.json, "(partial: the rows so far)", rows)
  return rows


def _only_rows(text: str) -> list[list[str]]:
  """--only's WORKLOAD:SYSTEM items as [workload, system] (one item if no ':')."""
  return [item.strip().split(":", 1) for item in text.split(",") if item.strip()]


def _plan(args, workloads: list[str], systems: list[tuple], r: int) -> list[tuple]:
  """Round r's (workload, system, overrides, flags): --only's rows in its order, else every
  workload's systems, their order alternating."""
  if args.only:
    by_name = {s[0]: s for s in systems}
    return [(w, *by_name[s]) for w, s in _only_rows(args.only)]
  return [(w, *s) for i, w in enumerate(workloads)
          for s in (systems if (r + i) % 2 == 0 else systems[::-1])]


def _vs_best_peer(rows: list[dict], workloads: list[str]) -> None:
  """Each bert_jax row's vs_best: the fastest peer's step time over its own."""
  ok = [r for r in rows if "error" not in r]
  for w in workloads:
    best_peer = min((r["step_s"] for r in ok if r["workload"] == w and not r["system"].startswith("bert_jax")),
                    default=None)
    for r in ok:
      if r["workload"] == w and r["system"].startswith("bert_jax") and best_peer:
        r["vs_best"] = best_peer / r["step_s"]


def _write_json(path: str, summary: str, rows: list[dict]) -> None:
  with open(path + ".tmp", "w") as f:  # then renamed: a run killed meanwhile leaves the last
    json.dump(dict(summary=summary, rows=rows), f, indent=1)
  os.replace(path + ".tmp", path)


def _write(args, argv, summary: str, table: str, rows: list[dict]) -> None:
  """--json's rows; the RESULTS.md section unless --no_record or --smoke."""
  if args.json:
    _write_json(args.json, summary, rows)
  if harness.recording(args):
    harness.record(__name__, "GPU step", f"{summary}\n\n{table}",
                   command=harness.command("bench.accel.gpu_step", argv))


def main(argv=None) -> list[dict]:
  parser = _parser()
  args = parser.parse_args(argv)
  if (spec := harness.child_spec(args)) is not None:
    child(spec)
    return []
  if args.smoke:
    args.steps, args.warmup, args.matmul_sizes = 2, 1, "256"
  start = time.perf_counter()
  workloads = [w for w in args.workloads.split(",") if w]
  systems = [(s, {}, "") for s in args.systems.split(",") if s]
  systems += [(f"bert_jax[{n}]", o, f) for n, o, f in parse_variants(args.variants)]
  if args.only:
    pairs = _only_rows(args.only)
    bad = [":".join(p) for p in pairs if len(p) != 2 or p[1] not in {s[0] for s in systems}]
    if bad:
      parser.error(f"--only rows {bad} name no system of --systems/--variants "
                   f"({[s[0] for s in systems]}); write WORKLOAD:SYSTEM")
    workloads = list(dict.fromkeys(p[0] for p in pairs))
  unknown = set(workloads) - set(WORKLOADS)
  if unknown:
    parser.error(f"unknown workloads {sorted(unknown)}; choose from {list(WORKLOADS)}")
  mm = run_child(dict(system="matmul", sizes=[int(n) for n in args.matmul_sizes.split(",")]),
                 min(args.child_timeout_s, args.deadline_s),
                 log=os.path.join(args.logs, "matmul.log") if args.logs else "")
  measured = mm.get("flops_per_s", 0.0)
  device = mm.get("device", "?")
  from bert_jax import flops as flops_lib  # pylint: disable=g-import-not-at-top
  dense = flops_lib.PEAK_BF16_FLOPS.get(device, 0.0)
  rows = _run_rows(args, workloads, systems, start)
  _vs_best_peer(rows, workloads)
  ok = [r for r in rows if "error" not in r]
  versions = sorted({r["versions"] for r in ok} | ({mm["versions"]} if "versions" in mm else set()))
  header = ("| workload | system | tokens/s | ms/step | ms/step, each waited | first step s "
            "| peak mem GiB | MFU (dense peak) | MFU (measured matmul) | bert_jax vs best peer "
            "| loss |")
  table = "\n".join([header, "|" + "---|" * 11] + [_fmt(r, dense, measured) for r in rows])
  summary = (f"Device: {device}; dense bf16 peak {dense / 1e12:.0f} TFLOP/s (data sheet), measured "
             f"bf16 matmul {measured / 1e12:.1f} TFLOP/s; {'; '.join(versions)}; {args.dtype}; "
             f"{args.steps} steps queued after {args.warmup}; {time.perf_counter() - start:.0f} s "
             "in all.")
  print(summary)
  print(table)
  _write(args, argv, summary, table, rows)
  return rows


if __name__ == "__main__":
  main()
