"""Compile time of the pre-training step: scan_layers vs unrolled, with and without remat.

    python -m bench.accel.compile_time                      # BERT-large, L=128, batch 8, fp32+bf16
    python -m bench.accel.compile_time --smoke              # seconds; what the test runs

Nothing is allocated: the step is lowered from `jax.ShapeDtypeStruct`s that carry
their shardings (the same `trainer.build` init and train step the
trainer jits), then compiled. Each configuration runs in a fresh subprocess so
no trace or compilation cache carries over. Reports lower (trace + StableHLO)
and compile (XLA) seconds and XLA's memory analysis. Appends the table to
bench/results/accel.md unless --no_record (or --smoke).

`abstract_step()` is the shared helper: bench/accel/aot_tpu.py and
bench/accel/scaling_table.py compile the same step for other devices with it.
"""
from __future__ import annotations

import os
import time
from typing import Any, Sequence

from bench import harness

PREDICTIONS = {128: 20, 512: 76}


def make_config(preset: str, seq_len: int, batch: int, dtype: str, *, scan: bool = True,
                remat: str = "none", vocab: int | None = 30522, mesh_shape: dict | None = None,
                family: str = "bert", overrides: dict | None = None):
  """configs/default.py with the benchmark's sizes; for the modern families (modernbert,
  eurobert) configs/modern_pretrain.py (packed rows, masked LM only, its share of masked
  tokens). vocab None: the preset's. overrides: {"model.attention": "splash", ...}, last."""
  if family == "bert":
    from bert_jax.configs import default
    config = default.get_config()
    config.model.preset = preset
  else:
    from bert_jax.configs import modern_pretrain
    config = modern_pretrain.get_config(preset)
  if vocab is not None:
    config.model.vocab_size = vocab
  config.model.dtype = dtype
  config.model.scan_layers = scan
  config.model.remat = remat
  if family == "bert":
    predictions = PREDICTIONS.get(seq_len, max(1, seq_len * 15 // 100))
  else:  # the config's share of a row (ModernBERT masks 30%)
    predictions = -(-config.data.max_predictions_per_seq * seq_len // config.data.max_seq_length)
  config.data.max_seq_length = seq_len
  config.data.max_predictions_per_seq = predictions
  config.global_batch_size = batch
  if mesh_shape:  # axes left out are 1
    for axis in ("data", "fsdp", "tensor"):
      config.mesh_shape[axis] = int(mesh_shape.get(axis, 1))
  if overrides:
    config.update_from_flattened_dict(overrides)
  return config


def abstract_step(config, devices: Sequence[Any] | None = None):
  """(jitted train step, abstract (state, batch, rng), mesh, rules, model cfg).

  Call `.lower(*args)` under `with jax.set_mesh(mesh), nn.logical_axis_rules(rules)`.
  `devices` may be real, fake-CPU or topology (AOT) devices.
  """
  from bert_jax import registry, trainer as trainer_lib
  from input_pipeline import pretrain as pretrain_data
  model, objective, sample = registry.pretraining(config)
  cfg = model.config
  trainer = trainer_lib.build(config, model, objective, sample, workdir=None, devices=devices)
  mesh, rules = trainer.mesh, trainer.rules
  args = trainer.abstract_args(pretrain_data.batch_shapes(config.data, config.global_batch_size))
  return trainer.train_step, args, mesh, rules, cfg


def memory_stats(compiled) -> dict[str, float]:
  """XLA's per-device memory analysis in GiB (arguments, outputs, temporaries, aliased)."""
  mem = compiled.memory_analysis()
  get = lambda name: float(getattr(mem, name, 0) or 0) / 2**30
  out = dict(args_gib=get("argument_size_in_bytes"), out_gib=get("output_size_in_bytes"),
             temp_gib=get("temp_size_in_bytes"), alias_gib=get("alias_size_in_bytes"),
             code_gib=get("generated_code_size_in_bytes"))
  # Donated state aliases its output buffers: peak ~ args + temps + outputs not aliased.
  out["peak_gib"] = out["args_gib"] + out["temp_gib"] + max(out["out_gib"] - out["alias_gib"], 0.0)
  # The compiler's own peak of live buffers, where it reports one (the TPU compiler's is
  # what it checks against HBM; its temp size may be larger).
  out["compiler_peak_gib"] = get("peak_memory_in_bytes")
  return out


def lower_and_compile(config, devices=None) -> dict[str, Any]:
  """Times lowering and compilation of the train step for `config`."""
  import flax.linen as nn
  import jax
  t0 = time.perf_counter()
  step, args, mesh, rules, _ = abstract_step(config, devices)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    t1 = time.perf_counter()
    lowered = step.lower(*args)
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
  res = dict(setup_s=t1 - t0, lower_s=t2 - t1, compile_s=t3 - t2, **memory_stats(compiled))
  from bert_jax import flops as flops_lib
  try:
    res["xla_gflop"] = flops_lib.xla_flops(compiled) / 1e9
  except Exception:  # pylint: disable=broad-except  # some backends have no cost analysis
    res["xla_gflop"] = float("nan")
  return res


def _child(spec: dict) -> None:
  """Subprocess body: one warm-up compile of a tiny step (jit/XLA start-up costs),
  then the measured configuration."""
  lower_and_compile(make_config("tiny", 32, 2, "float32", vocab=512))
  config = make_config(spec["preset"], spec["L"], spec["batch"], spec["dtype"],
                       scan=spec["scan"], remat=spec["remat"], vocab=spec["vocab"])
  harness.emit(lower_and_compile(config))


def run_one(spec: dict, timeout: float) -> dict:
  env = harness.child_env(drop=("XLA_FLAGS",))  # one CPU device, as the brief's measurement
  return dict(spec, **harness.child_row(harness.module_child("bench.accel.compile_time", spec),
                                        env=env, timeout=timeout, wall=True))


def format_table(rows: list[dict]) -> str:
  lines = ["| preset | L | batch | dtype | scan_layers | remat | lower s | compile s | "
           "lower+compile s | XLA args GiB | XLA temp GiB |", "|" + "---|" * 11]
  for r in rows:
    head = (f"| {r['preset']} | {r['L']} | {r['batch']} | {r['dtype']} | {r['scan']} | "
            f"{r['remat']} |")
    if "error" in r:
      lines.append(f"{head} failed: {r['error']} | | | | |")
    else:
      lines.append(f"{head} {r['lower_s']:.1f} | {r['compile_s']:.1f} | "
                   f"{r['lower_s'] + r['compile_s']:.1f} | {r['args_gib']:.2f} | "
                   f"{r['temp_gib']:.2f} |")
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  parser = harness.parser(__doc__, child=True)
  parser.add_argument("--preset", default="large")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--variants", default="scan:none,scan:full,unrolled:none,unrolled:full",
                      help="comma list of {scan|unrolled}:{none|attention|dots|full}")
  parser.add_argument("--vocab", type=int, default=30522)
  parser.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
  parser.add_argument("--inprocess", action="store_true",
                      help="compile in this process (no fresh process, no warm-up)")
  args = parser.parse_args(argv)
  if (spec := harness.child_spec(args)) is not None:
    _child(spec)
    return []
  if args.smoke:
    args.preset, args.seq_len, args.batch, args.vocab = "tiny", 32, 2, 512
    args.dtypes, args.variants, args.inprocess = "float32", "scan:none,unrolled:none", True
  load0 = os.getloadavg()[0]
  rows = []
  for dtype in args.dtypes.split(","):
    for variant in args.variants.split(","):
      layout, remat = variant.split(":")
      spec = dict(preset=args.preset, L=args.seq_len, batch=args.batch, dtype=dtype,
                  scan=layout == "scan", remat=remat, vocab=args.vocab)
      if args.inprocess:
        config = make_config(args.preset, args.seq_len, args.batch, dtype, scan=spec["scan"],
                             remat=remat, vocab=args.vocab)
        rows.append(dict(spec, **lower_and_compile(config)))
      else:
        rows.append(run_one(spec, args.timeout))
      print(format_table(rows[-1:]).splitlines()[-1], flush=True)
  table = format_table(rows)
  print(table)
  if harness.recording(args):
    import jax
    harness.record(
        __name__, "Compile time", table, command=harness.command("bench.accel.compile_time", argv),
        machine=f"{harness.machine()} (shared; {harness.load_span(load0)}), jax "
                f"{jax.__version__}, CPU backend, 1 device. Lower = trace + StableHLO; compile = "
                f"XLA. Abstract inputs (nothing allocated); each row in a fresh process after a "
                f"warm-up compile of a tiny step.")
  return rows


if __name__ == "__main__":
  main()
