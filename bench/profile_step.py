"""Where the bert_jax train step spends its time, and A/B timings of variants in one process.

    python -m bench.profile_step                          # variants of XLA:CPU options, interleaved
    python -m bench.profile_step --ref_rev=HEAD~1         # this checkout's model vs an earlier one
    python -m bench.profile_step --pieces                 # forward / backward / optimizer split
    python -m bench.profile_step --model_variants="attn:remat=attention"  # config variants
    python -m bench.profile_step --trace=/tmp/step_trace  # trace + top kernels by time, grouped
    python -m bench.profile_step --trace=/tmp/t --dtype=bfloat16 --batch=256  # on a GPU
    python -m bench.profile_step --trace=/tmp/t --dtype=bfloat16 --workload=modern-packed  # ModernBERT

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

from bench import gpu_step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
  from bench.train_step import synthetic_batch, bench_config
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


# ----------------------------------------------------------------------------
# Where a traced step's device time goes: kernels by time, grouped (no TensorBoard needed).

CATEGORIES = ("matmuls", "attention", "elementwise/fusions", "copies/transposes",
              "gather/scatter", "optimizer", "other")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (?:\(.*?\)|\S+) ([\w\-]+)\(")
_MOVES = {"parameter", "transpose", "copy", "bitcast", "reshape", "broadcast", "constant",
          "slice", "concatenate", "pad", "tuple", "get-tuple-element", "copy-start", "copy-done"}


def hlo_categories(hlo_text: str) -> dict[str, str]:
  """{instruction name: category} of an optimized HLO module (`compiled.as_text()`): what
  each kernel a trace names is. A fusion is what it contains (a dot: a matmul, an attention
  matmul when it has batch dimensions, as BERT's scores and context; a gather or scatter;
  data movement alone); cuBLAS / cuDNN custom calls by their target; elementwise work that
  is neither forward (jvp) nor backward (transpose) of the loss is the optimizer's."""
  comps: dict[str, list[tuple[str, str, str]]] = {}
  current = None
  for line in hlo_text.splitlines():
    m = _COMPUTATION.match(line)
    if m:
      current = comps.setdefault(m.group(1), [])
      continue
    m = _INSTRUCTION.match(line)
    if m and current is not None:
      current.append((m.group(1), m.group(2), line))

  def kind(opcode: str, line: str, called: list[tuple[str, str, str]]) -> str:
    target = re.search(r'custom_call_target="([^"]+)"', line)
    target = target.group(1).lower() if target else ""
    if "fmha" in target or "attention" in target or "flash" in target:
      return "attention"
    if "gemm" in target or "cublas" in target or "matmul" in target:
      return "matmuls"
    ops = {op for _, op, _ in called} | {opcode}
    lines = [l for _, op, l in called if op in ("dot", "convolution")]
    if opcode in ("dot", "convolution"):
      lines.append(line)
    if lines:
      return "attention" if any("lhs_batch_dims=" in l for l in lines) else "matmuls"
    if ops & {"gather", "scatter", "dynamic-slice", "dynamic-update-slice", "select-and-scatter"}:
      return "gather/scatter"
    if ops <= _MOVES or opcode in ("copy", "transpose", "copy-start", "copy-done"):
      return "copies/transposes"
    names = re.findall(r'op_name="([^"]*)"', line + "".join(l for _, _, l in called))
    if names and not any("jvp(" in n or "transpose(" in n for n in names):
      return "optimizer"
    return "elementwise/fusions"

  out = {}
  for instructions in comps.values():
    for name, opcode, line in instructions:
      calls = re.search(r"calls=%([\w.\-]+)", line)
      out[name] = kind(opcode, line, comps.get(calls.group(1), []) if calls else [])
  return out


def hlo_sources(hlo_text: str) -> dict[str, str]:
  """{instruction name: where in the model it comes from}: the commonest op_name (those
  inside a module first) of the instruction and what it calls, as "fwd|bwd|update path
  (file:line)" with layer numbers folded (`layer_*`): the kernels of a profile name the
  model code they run."""
  comps: dict[str, list[str]] = {}
  current = None
  for line in hlo_text.splitlines():
    m = _COMPUTATION.match(line)
    if m:
      current = comps.setdefault(m.group(1), [])
    elif current is not None and _INSTRUCTION.match(line):
      current.append(line)
  frames = _stack_frames(hlo_text)
  out = {}
  for lines in comps.values():
    for line in lines:
      calls = re.search(r"calls=%([\w.\-]+)", line)
      body = [line] + (comps.get(calls.group(1), []) if calls else [])
      found = collections.Counter((source_of(m.group(1)), frames.get(m.group(2), ""))
                                  for l in body for m in _METADATA.finditer(l))
      if found:
        (where, at), _ = max(found.items(), key=lambda kv: ("/" in kv[0][0], kv[1]))
        out[_INSTRUCTION.match(line).group(1)] = f"{where} ({at})" if at else where
  return out


_METADATA = re.compile(r'op_name="([^"]*)"(?: stack_frame_id=(\d+))?')


def _stack_frames(hlo_text: str) -> dict[str, str]:
  """{stack_frame_id: 'file.py:line'} from the module's FileNames / FileLocations /
  StackFrames tables: the innermost frame outside site-packages (the project's code)."""
  tables = collections.defaultdict(dict)
  section = None
  for line in hlo_text.splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = line
    elif not line.strip() or line.startswith(("%", "ENTRY", "HloModule")):
      section = None
    elif section:
      key, _, value = line.partition(" ")
      tables[section][key] = value
  files = {k: v.strip('"') for k, v in tables["FileNames"].items()}
  field = lambda text, name: (re.search(rf"\b{name}=(\d+)", text) or [None, None])[1]
  out = {}
  for frame_id in tables["StackFrames"]:
    at, seen = frame_id, set()
    while at and at not in seen:
      seen.add(at)
      frame = tables["StackFrames"].get(at, "")
      loc = tables["FileLocations"].get(field(frame, "file_location_id") or "", "")
      name = files.get(field(loc, "file_name_id") or "", "")
      if name and "site-packages" not in name:
        out[frame_id] = f"{os.path.basename(name)}:{field(loc, 'line')}"
        break
      parent = field(frame, "parent_frame_id")
      at = parent if parent != at else None
  return out


def source_of(op_name: str) -> str:
  """'jit(step)/transpose(jvp(BertForPreTraining))/bert/encoder/layer_3/attention/dot_general'
  -> 'bwd bert/encoder/layer_*/attention/dot_general'."""
  phase = "bwd" if "transpose(" in op_name else "fwd" if "jvp(" in op_name else "update"
  parts = []
  for part in op_name.split("/"):
    while (m := re.match(r"^(?:transpose|jvp|vmap|checkpoint|remat|rematted_computation)\((.*)\)$", part)):
      part = m.group(1)  # the transformation's scope: jvp(BertForPreTraining) -> BertForPreTraining
    if not re.match(r"^p?jit\(", part):
      parts.append(part)
  return f"{phase} " + re.sub(r"layer_\d+", "layer_*", "/".join(parts[-5:]))


def kernel_key(event: dict, table: dict[str, str], aliases: dict[str, str] | None = None
               ) -> str | None:
  """The HLO instruction a kernel event runs: its hlo_op, else its name (GPU kernels are
  named after their fusion with '.' and '-' as '_'; `aliases`: that map, made once)."""
  if event["hlo_op"] in table:
    return event["hlo_op"]
  if aliases is None:
    aliases = _aliases(table)
  return aliases.get(event["name"])


def _aliases(table: dict[str, str]) -> dict[str, str]:
  return {k.replace(".", "_").replace("-", "_"): k for k in table}


def trace_events(trace_dir: str) -> list[dict]:
  """The device op events of the newest trace under `trace_dir` (its .trace.json.gz): GPU
  kernels where the trace has a device, else XLA:CPU's per-op events (they need
  XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true). Each: name, hlo_op, dur (us)."""
  import glob
  import json
  paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True),
                 key=os.path.getmtime)
  if not paths:
    raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}")
  with gzip.open(paths[-1], "rt") as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
             and "/device:" in str(e.get("args", {}).get("name", ""))}
  timed = [e for e in events if e.get("ph") == "X"]
  # Every kernel on a device (its hlo_op when the trace names it); on CPU, XLA's op events.
  on_device = [e for e in timed if e["pid"] in devices and not e["name"].startswith("end: ")]
  ops = on_device or [e for e in timed if "hlo_op" in e.get("args", {})]
  return [dict(name=e["name"], hlo_op=e.get("args", {}).get("hlo_op", ""),
               dur=float(e.get("dur", 0.0))) for e in ops]


_BY_NAME = (  # a kernel's category from its name, where the trace names no HLO op
    ("attention", re.compile(r"fmha|flash|attention|sdpa", re.I)),
    ("matmuls", re.compile(r"gemm|cublas|cutlass|xmma|nvjet|wgmma|matmul|\bdot", re.I)),
    ("gather/scatter", re.compile(r"gather|scatter|dynamic.update.slice|dynamic.slice", re.I)),
    ("copies/transposes", re.compile(r"memcpy|memset|copy|transpose", re.I)),
)


def _category(event: dict, categories: dict[str, str], aliases: dict[str, str] | None = None
              ) -> str:
  key = kernel_key(event, categories, aliases)
  if key is not None:
    return categories[key]
  return next((c for c, pattern in _BY_NAME if pattern.search(event["name"])),
              "elementwise/fusions" if "fusion" in event["name"] else "other")


def kernel_summary(events: list[dict], categories: dict[str, str], steps: int,
                   step_s: float, top: int = 25, sources: dict[str, str] | None = None) -> str:
  """The top kernels by device time per step and the category totals, with their share of
  the step's wall time (what the kernels leave is idle device time: launch gaps, host);
  with `sources` (hlo_sources), each kernel's place in the model and the time by place."""
  sources, aliases = sources or {}, _aliases(categories)
  source_aliases = _aliases(sources)
  by_kernel = collections.defaultdict(lambda: [0.0, 0, "", collections.Counter()])
  for e in events:
    k = by_kernel[e["name"]]
    k[0] += e["dur"] / 1e6 / steps
    k[1] += 1
    k[2] = _category(e, categories, aliases)
    where = kernel_key(e, sources, source_aliases)
    k[3][sources.get(where, "?")] += e["dur"] / 1e6 / steps
  busy = sum(v[0] for v in by_kernel.values())
  lines = [f"step {1e3 * step_s:.2f} ms (untraced); kernels {1e3 * busy:.2f} ms a step "
           f"({100 * busy / step_s:.1f}%: below 100 the device idles, above it ops overlap)", "",
           f"{'category':22s} {'ms/step':>9s} {'share of step':>14s}"]
  totals, places = collections.Counter(), collections.Counter()
  for t, _, c, where in by_kernel.values():
    totals[c] += t
    places.update(where)
  for c in CATEGORIES:
    if totals[c]:
      lines.append(f"{c:22s} {1e3 * totals[c]:9.2f} {100 * totals[c] / step_s:13.1f}%")
  lines += ["", f"{'kernel':60s} {'category':20s} {'calls':>6s} {'ms/step':>9s} {'share':>7s}"
            + ("  where" if sources else "")]
  for name, (t, n, c, where) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
    lines.append(f"{name[:60]:60s} {c:20s} {n // steps:6d} {1e3 * t:9.3f} {100 * t / step_s:6.1f}%"
                 + (f"  {where.most_common(1)[0][0]}" if sources else ""))
  if sources:
    lines += ["", f"{'where (op_name, layers folded; file:line)':100s} {'ms/step':>9s} {'share':>7s}"]
    for where, t in places.most_common(top):
      lines.append(f"{where[-100:]:100s} {1e3 * t:9.3f} {100 * t / step_s:6.1f}%")
  return "\n".join(lines)


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
                      help="with --trace: the step of this bench/gpu_step.py row instead "
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
  """--workload: bench/gpu_step.py's bert_jax row (its config with --overrides, its batches)
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
    events = trace_events(args.trace)
  except FileNotFoundError as e:
    print(f"no kernel summary: {e}")
    return
  if not events:
    print("the trace holds no per-op events (on CPU set "
          "XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true)")
    return
  print(kernel_summary(events, hlo_categories(run.hlo), args.trace_steps, step_s,
                       sources=hlo_sources(run.hlo)))


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
