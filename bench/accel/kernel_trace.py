"""Where a traced step's device time goes: kernels by time, grouped (no TensorBoard needed).

bench/accel/profile_step.py's --trace reads a jax.profiler trace with these: each kernel's HLO
instruction (from the optimized HLO module), its category (matmuls, attention, ...) and the
source line its op_name names, summed per step.
"""
from __future__ import annotations

import collections
import gzip
import os
import re


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
