"""Ahead-of-time compile of the pre-training step for a TPU topology, without TPUs.

    bash: pip install --no-deps --target /tmp/libtpu_site "libtpu==0.0.42.*"   # what jax[tpu]==0.10.2 pins
    python -m bench.accel.aot_tpu                    # BERT-large L=128 on v4-32, v5e-16, v5p-32
    python -m bench.accel.aot_tpu --smoke            # BERT-tiny on v5e 2x2 (seconds)
    python -m bench.accel.aot_tpu --preset=modernbert-base --seq_len=8192 --per_device_batch=4 \
        --slices=v5e-16 --meshes=fsdp=-1 --remat=full --set=model.attention=splash

`jax.experimental.topologies.get_topology_desc` asks libtpu's PJRT plugin for
compile-only devices of a described slice; the step (the train step of
`trainer.build` (its shardings), via bench.accel.compile_time.abstract_step) is lowered
from abstract inputs over a mesh of those devices and compiled by the real TPU
compiler. Reports compile seconds and the compiled step's per-device memory
(`memory_analysis()`). Each target runs in a subprocess with libtpu on PYTHONPATH
(kept out of the main environment) and JAX_PLATFORMS=cpu (nothing tries to open a
TPU). If libtpu is missing or the topology cannot be made, the row says why.
Appends to bench/results/accel.md unless --no_record (or --smoke).

A modern preset (modernbert-*, ettin-*, mmbert-*, eurobert-*; or --family=modernbert
with --preset=base) compiles configs/modern_pretrain.py's step: packed rows, masked LM
only, the preset's vocabulary. --set FIELD=VALUE overrides a config field (repeatable).
"""
from __future__ import annotations

import ast
import math
import os
import time

from bench import harness

REPO = harness.REPO
DEFAULT_LIBTPU = "/tmp/libtpu_site"

# Slice name -> (topology_name, chip_config_name). v4 and v5p run in megacore mode
# (one JAX device per chip, both TensorCores), as on real VMs; MaxText's
# train_compile.py describes them the same way.
SLICES = {
    "v4-8": ("v4:2x2x1", "megacore"),
    "v4-32": ("v4:2x2x4", "megacore"),
    "v4-128": ("v4:4x4x4", "megacore"),
    "v5e-4": ("v5e:2x2", "default"),
    "v5e-16": ("v5e:4x4", "default"),
    "v5e-256": ("v5e:16x16", "default"),
    "v5p-8": ("v5p:2x2x1", "megacore"),
    "v5p-32": ("v5p:2x2x4", "megacore"),
    "v5p-128": ("v5p:4x4x4", "megacore"),
}


def num_devices(slice_name: str) -> int:
  """JAX devices of a slice: its topology's chips (v4/v5p in megacore mode)."""
  return math.prod(int(d) for d in SLICES[slice_name][0].split(":")[1].split("x"))


def topology_devices(slice_name: str):
  """Compile-only TPU devices of a slice (needs libtpu importable)."""
  from jax.experimental import topologies
  name, chip_config = SLICES[slice_name]
  return topologies.get_topology_desc(topology_name=name, platform="tpu",
                                      chip_config_name=chip_config).devices


def _child(spec: dict) -> None:
  import jax
  from bench.accel import compile_time
  t = time.perf_counter()
  devices = topology_devices(spec["slice"])
  topo_s = time.perf_counter() - t
  n = len(devices)
  config = compile_time.make_config(spec["preset"], spec["L"], spec["per_device_batch"] * n,
                                    spec["dtype"], scan=spec["scan"], remat=spec["remat"],
                                    vocab=spec.get("vocab", 30522), mesh_shape=spec["mesh"],
                                    family=spec.get("family", "bert"),
                                    overrides=spec.get("overrides"))
  res = compile_time.lower_and_compile(config, devices)
  res.update(devices=n, device_kind=devices[0].device_kind, topology_s=topo_s,
             global_batch=config.global_batch_size, jax=jax.__version__)
  harness.emit(res)


def libtpu_version(libtpu_dir: str) -> str | None:
  import glob
  found = glob.glob(os.path.join(libtpu_dir, "libtpu-*.dist-info"))
  return os.path.basename(found[0])[len("libtpu-"):-len(".dist-info")] if found else None


def run_one(spec: dict, libtpu_dir: str, timeout: float) -> dict:
  """One AOT compile in a subprocess; {'error': ...} with the reason when it fails."""
  if not os.path.exists(os.path.join(libtpu_dir, "libtpu", "libtpu.so")):
    return dict(spec, error=f"libtpu not found in {libtpu_dir} (pip install --no-deps --target "
                            f"{libtpu_dir} 'libtpu==0.0.42.*', what jax[tpu]==0.10.2 pins)")
  env = harness.child_env(libtpu_dir, REPO, keep_pythonpath=True, drop=("XLA_FLAGS",),
                          JAX_PLATFORMS="cpu",
                          # libtpu otherwise probes GCE metadata for the host's accelerator and workers.
                          TPU_ACCELERATOR_TYPE=spec["slice"], TPU_WORKER_HOSTNAMES="localhost",
                          TPU_SKIP_MDS_QUERY="1")
  row = harness.child_row(harness.module_child("bench.accel.aot_tpu", spec), env=env, timeout=timeout,
                          wall=True)
  return dict(spec, **row)


def format_table(rows: list[dict]) -> str:
  lines = ["| slice | devices | preset | L | dtype | mesh (data,fsdp,tensor) | per-device batch | "
           "global batch | remat | compile s | args GiB/dev | temp GiB/dev | peak GiB/dev | "
           "compiler peak GiB/dev |", "|" + "---|" * 14]
  for r in rows:
    n = r.get("devices") or (num_devices(r["slice"]) if r["slice"] in SLICES else None)
    sizes = [int(r["mesh"].get(a, 1)) for a in ("data", "fsdp", "tensor")]
    if -1 in sizes and n:  # resolve "the rest"
      sizes[sizes.index(-1)] = n // -math.prod(sizes)
    mesh = ",".join(map(str, sizes))
    batch = r.get("global_batch") or (r["per_device_batch"] * n if n else "?")
    preset = " ".join([r["preset"]] + [f"{k}={v}" for k, v in r.get("overrides", {}).items()])
    head = (f"| {r['slice']} | {n or '?'} | {preset} | {r['L']} | {r['dtype']} "
            f"| {mesh} | {r['per_device_batch']} | {batch} | {r['remat']} |")
    if "error" in r:
      lines.append(f"{head} failed: {r['error']} | | | | |")
    else:
      lines.append(f"{head} {r['lower_s'] + r['compile_s']:.1f} | {r['args_gib']:.2f} | "
                   f"{r['temp_gib']:.2f} | {r['peak_gib']:.2f} | "
                   f"{r.get('compiler_peak_gib', float('nan')):.2f} |")
  return "\n".join(lines)


def _value(text: str):
  """A --set value: a Python literal (0.5, True, 'x') or else the string itself."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _parser():
  parser = harness.parser(__doc__, child=True)
  parser.add_argument("--slices", default="v4-32,v5e-16,v5p-32")
  parser.add_argument("--family", default="bert",
                      help="bert | modernbert | eurobert: --family=modernbert --preset=base "
                           "is modernbert-base; a preset with a dash names its family")
  parser.add_argument("--preset", default="large")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="a config override, e.g. model.attention=splash (repeatable)")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--per_device_batch", type=int, default=32)
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--meshes", default="fsdp=-1;data=-1",
                      help="semicolon list of meshes, each a comma list axis=size")
  parser.add_argument("--remat", default="none")
  parser.add_argument("--libtpu_dir", default=os.environ.get("LIBTPU_DIR", DEFAULT_LIBTPU))
  parser.add_argument("--timeout", type=float, default=600)
  return parser


def _family_and_preset(args) -> tuple[str, str]:
  family, preset = args.family, args.preset
  if "-" in preset:  # modernbert-base, ettin-150m, eurobert-210m, ...
    from bert_jax.configs import modern_pretrain
    family = modern_pretrain.model_config(preset).family
  elif family != "bert":
    preset = f"{family}-{preset}"
  return family, preset


def _record(args, argv, family: str, preset: str, table: str, version: str | None) -> None:
  data = ""
  if family != "bert":
    from bench.accel import compile_time
    from input_pipeline import pretrain as pretrain_data
    cfg = compile_time.make_config(preset, args.seq_len, 1, args.dtype, vocab=None,
                                   family=family, overrides=_overrides(args)).data
    data = (f" The {family} step is configs/modern_pretrain.py's: packed rows of up to "
            f"{cfg.max_examples_per_row} examples, {pretrain_data.predictions_per_row(cfg)} "
            f"masked-LM predictions a row, no NSP.")
  harness.record(
      __name__, "TPU ahead-of-time compile, no TPU attached",
      f"{table}\n", command=harness.command("bench.accel.aot_tpu", argv),
      machine=f"2-core CPU host (shared), jax 0.10.2, libtpu "
              f"{version} in a --target dir on PYTHONPATH of the subprocess. Devices from "
              f"`jax.experimental.topologies.get_topology_desc` (v4/v5p in megacore mode: one "
              f"device per chip); scan_layers=True. Memory is the TPU compiler's "
              f"`memory_analysis()` per device; peak = arguments + temporaries + non-aliased "
              f"outputs (the state is donated); compiler peak = its `peak_memory_in_bytes`, "
              f"the live maximum it checks against HBM.{data}")


def _overrides(args) -> dict:
  return {k: _value(v) for k, v in (kv.split("=", 1) for kv in args.set)}


def main(argv=None) -> list[dict]:
  args = _parser().parse_args(argv)
  if (spec := harness.child_spec(args)) is not None:
    _child(spec)
    return []
  if args.smoke:
    args.slices, args.preset, args.seq_len, args.per_device_batch = "v5e-4", "tiny", 32, 2
    args.meshes = "fsdp=-1"
  family, preset = _family_and_preset(args)
  overrides = _overrides(args)
  meshes = [dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in m.split(","))
            for m in args.meshes.split(";")]
  rows = []
  for slice_name in args.slices.split(","):
    for mesh in meshes:
      spec = dict(slice=slice_name, preset=preset, L=args.seq_len, dtype=args.dtype,
                  mesh=mesh, per_device_batch=args.per_device_batch, remat=args.remat, scan=True,
                  vocab=512 if args.smoke else 30522)
      if family != "bert":  # the preset's (padded) vocabulary
        spec.update(family=family, vocab=None)
      if overrides:
        spec["overrides"] = overrides
      rows.append(run_one(spec, args.libtpu_dir, args.timeout))
      print(format_table(rows[-1:]).splitlines()[-1], flush=True)
  table = format_table(rows)
  version = libtpu_version(args.libtpu_dir)
  print(f"libtpu {version}; scan_layers=True")
  print(table)
  if harness.recording(args):
    _record(args, argv, family, preset, table, version)
  return rows


if __name__ == "__main__":
  main()
