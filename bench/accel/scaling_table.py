"""The numbers behind docs/scaling.md: mesh, batch, remat, memory and step time per target.

    python -m bench.accel.scaling_table                 # all rows (compiles ~16 steps: minutes)
    python -m bench.accel.scaling_table --smoke         # BERT-tiny, one TPU and one GPU row
    python -m bench.accel.scaling_table --derived_only  # no compiles: analytic columns only

For each (model, L, target) the recommended setting below is compiled and its
per-device memory read from the compiled step's `memory_analysis()`:
  * TPU targets: ahead of time for the real topology with libtpu (bench/accel/aot_tpu.py),
    the TPU compiler's own numbers, for the full slice size;
  * 8xH100: on 8 fake CPU devices (`--xla_force_host_platform_device_count=8`) with
    the same mesh and per-device batch; the CPU compiler's buffer assignment is an
    estimate of the GPU's (different fusion and layouts; bf16 dots may be kept in f32).
When the estimate exceeds --fit (90%) of the device's memory, the row is compiled
again with the next remat policy (none -> dots -> full). Step time is *derived*:
analytic FLOPs of the step (`bert_jax.flops.train_flops_per_step`, remat not
counted) / (devices x vendor bf16 peak from bert_jax/flops.py x --mfu).
"""
from __future__ import annotations

import json
import math
import os

from bench import harness

PREDICTIONS = {128: 20, 512: 76}

# target -> (slice or host, devices, peak key in flops.PEAK_BF16_FLOPS, memory GiB per device,
#            how it is compiled here, mesh)
TARGETS = {
    "TPU v4-128": dict(slice="v4-128", devices=64, peak="TPU v4", hbm_gib=32, how="tpu",
                       mesh=dict(fsdp=-1)),
    "TPU v5e-256": dict(slice="v5e-256", devices=256, peak="TPU v5e", hbm_gib=16, how="tpu",
                        mesh=dict(fsdp=-1)),
    "TPU v5p-128": dict(slice="v5p-128", devices=64, peak="TPU v5p", hbm_gib=95, how="tpu",
                        mesh=dict(fsdp=-1)),
    "8x H100 80GB (1 host)": dict(slice=None, devices=8, peak="NVIDIA H100 80GB HBM3",
                                  hbm_gib=80 * 1e9 / 2**30, how="cpu", mesh=dict(data=-1)),
}
# (preset, L) -> per-device batch (sequences), by the device's memory class.
PER_DEVICE_BATCH = {
    ("base", 128): dict(small=64, large=128),
    ("base", 512): dict(small=16, large=32),
    ("large", 128): dict(small=32, large=64),
    ("large", 512): dict(small=8, large=16),
}
REMAT_ORDER = ("none", "dots", "full")


def _cpu_child(spec: dict) -> None:
  from bench.accel import compile_time
  import jax
  config = compile_time.make_config(spec["preset"], spec["L"],
                                    spec["per_device_batch"] * jax.device_count(), spec["dtype"],
                                    scan=True, remat=spec["remat"], vocab=spec["vocab"],
                                    mesh_shape=spec["mesh"])
  res = compile_time.lower_and_compile(config)
  res.update(devices=jax.device_count(), global_batch=config.global_batch_size)
  harness.emit(res)


def compile_cpu(spec: dict, devices: int, timeout: float) -> dict:
  env = harness.child_env(JAX_PLATFORMS="cpu",
                          XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  return dict(spec, **harness.child_row(harness.module_child("bench.accel.scaling_table", spec),
                                        env=env, timeout=timeout))


def measure(target: dict, preset: str, L: int, per_device: int, args) -> dict:
  """Compiles with remat none, then dots, then full until the estimate fits."""
  from bench.accel import aot_tpu
  res = {}
  for remat in REMAT_ORDER:
    spec = dict(preset=preset, L=L, dtype="bfloat16", mesh=target["mesh"],
                per_device_batch=per_device, remat=remat, scan=True, vocab=args.vocab)
    if target["how"] == "tpu":
      res = aot_tpu.run_one(dict(spec, slice=target["slice"]), args.libtpu_dir, args.timeout)
    else:
      res = compile_cpu(spec, target["devices"], args.timeout)
    print(f"  {preset} L={L} {target.get('slice') or 'cpu'} remat={remat}: "
          + (res["error"] if "error" in res else f"peak {res['peak_gib']:.2f} GiB/device, "
             f"compile {res['lower_s'] + res['compile_s']:.0f} s"), flush=True)
    if "error" in res or res["peak_gib"] <= args.fit * target["hbm_gib"]:
      return res
  return res


# The paper's schedule as a sequence budget: 900k steps x 256 at L=128, 100k x 256 at L=512.
PAPER_SEQUENCES = {128: 900_000 * 256, 512: 100_000 * 256}


def budget_table(rows: list[dict]) -> str:
  """Hours to stream the paper's sequence budget at each row's derived throughput."""
  by = {(r["model"], r["target"], r["L"]): r for r in rows}
  lines = ["| model | target | L=128 phase (230M seq) h | L=512 phase (25.6M seq) h | total h |",
           "|---|---|---|---|---|"]
  for (model, target) in dict.fromkeys((r["model"], r["target"]) for r in rows):
    hours = {L: PAPER_SEQUENCES[L] / by[(model, target, L)]["seq_per_s"] / 3600
             for L in PAPER_SEQUENCES if (model, target, L) in by}
    if len(hours) == 2:
      lines.append(f"| {model} | {target} | {hours[128]:.1f} | {hours[512]:.1f} | "
                   f"{hours[128] + hours[512]:.1f} |")
  return "\n".join(lines)


def _parser():
  parser = harness.parser(__doc__, record=False, child=True)
  parser.add_argument("--presets", default="base,large")
  parser.add_argument("--seq_lens", default="128,512")
  parser.add_argument("--targets", default=",".join(TARGETS))
  parser.add_argument("--mfu", type=float, default=0.45, help="assumed model FLOPs utilisation")
  parser.add_argument("--fit", type=float, default=0.9, help="share of device memory to fill")
  parser.add_argument("--vocab", type=int, default=30522)
  parser.add_argument("--libtpu_dir", default=os.environ.get("LIBTPU_DIR", "/tmp/libtpu_site"))
  parser.add_argument("--timeout", type=float, default=900)
  parser.add_argument("--derived_only", action="store_true", help="skip compiles")
  parser.add_argument("--json", default="", help="also write the rows here")
  parser.add_argument("--from_json", default="", help="re-print rows written by --json")
  return parser


def _row(preset: str, L: int, name: str, target: dict, args) -> dict:
  """One target's row: the derived columns, and the compiled memory unless --derived_only."""
  from bert_jax import flops as flops_lib
  from bert_jax.models.bert import BertConfig
  klass = "small" if target["hbm_gib"] <= 32 else "large"
  per_device = PER_DEVICE_BATCH.get((preset, L), dict(small=8, large=8))[klass]
  n = target["devices"]
  P = PREDICTIONS.get(L, L * 15 // 100)
  cfg = BertConfig.from_preset(preset, vocab_size=args.vocab)
  flop = flops_lib.train_flops_per_step(cfg, per_device * n, L, P)
  peak = flops_lib.PEAK_BF16_FLOPS[target["peak"]]
  step_s = flop / (n * peak * args.mfu)
  row = dict(model=preset, L=L, target=name, devices=n, mesh=target["mesh"],
             per_device_batch=per_device, global_batch=per_device * n,
             tflop_per_step=flop / 1e12, step_ms=1e3 * step_s,
             seq_per_s=per_device * n / step_s, hbm_gib=target["hbm_gib"], how=target["how"])
  if not args.derived_only:
    res = measure(target, preset, L, per_device, args)
    row.update(remat=res.get("remat"), error=res.get("error"),
               args_gib=res.get("args_gib"), temp_gib=res.get("temp_gib"),
               peak_gib=res.get("peak_gib"), compile_s=(res["lower_s"] + res["compile_s"]
                                                        if "lower_s" in res else None))
  return row


def format_table(rows: list[dict], mfu: float) -> str:
  lines = ["| model | L | target | mesh (data,fsdp,tensor) | per-device batch | global batch | "
           "remat | memory/device GiB (args + temp = peak; of HBM) | memory source | TFLOP/step | "
           f"step ms @ {100 * mfu:.0f}% MFU | seq/s |", "|" + "---|" * 12]
  for r in rows:
    sizes = [int(r["mesh"].get(a, 1)) for a in ("data", "fsdp", "tensor")]
    if -1 in sizes:
      sizes[sizes.index(-1)] = r["devices"] // -math.prod(sizes)
    if r.get("peak_gib") is not None:
      mem = (f"{r['args_gib']:.2f} + {r['temp_gib']:.2f} = {r['peak_gib']:.2f} "
             f"({100 * r['peak_gib'] / r['hbm_gib']:.0f}% of {r['hbm_gib']:.0f})")
      source = "TPU compiler (AOT)" if r["how"] == "tpu" else "CPU compiler, estimate"
    else:
      mem, source = (f"not compiled: {r['error']}" if r.get("error") else "not compiled"), "-"
    lines.append(f"| {r['model']} | {r['L']} | {r['target']} | {','.join(map(str, sizes))} | "
                 f"{r['per_device_batch']} | {r['global_batch']} | {r.get('remat') or '-'} | {mem} | "
                 f"{source} | {r['tflop_per_step']:.1f} | {r['step_ms']:.0f} | {r['seq_per_s']:,.0f} |")
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  args = _parser().parse_args(argv)
  if (spec := harness.child_spec(args)) is not None:
    _cpu_child(spec)
    return []
  targets = {k: dict(TARGETS[k]) for k in args.targets.split(",")}
  if args.smoke:
    args.presets, args.seq_lens, args.vocab = "tiny", "128", 512
    targets = {"TPU v5e-4 (smoke)": dict(TARGETS["TPU v5e-256"], slice="v5e-4", devices=4),
               "2x CPU (smoke)": dict(TARGETS["8x H100 80GB (1 host)"], devices=2)}
  rows = []
  if args.from_json:
    with open(args.from_json) as f:
      rows = json.load(f)
    args.presets = ""
  for preset in filter(None, args.presets.split(",")):
    for L in map(int, args.seq_lens.split(",")):
      for name, target in targets.items():
        rows.append(_row(preset, L, name, target, args))
  print(format_table(rows, args.mfu))
  print()
  print(budget_table(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
  return rows


if __name__ == "__main__":
  main()
