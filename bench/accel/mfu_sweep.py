"""Issue 40's check: the CoLA suite sweep run twice in a row logs a plausible MFU on every
progress line, and the disk cache of measured peaks holds nothing beyond the CPU's bound.

    python -m bench.accel.mfu_sweep --workdir=/tmp/bench_mfu_sweep [--no_record]

The sweep is bench.quality.suite_cola's (its checkpoint: tiny BERT pre-trained on the built-in corpus,
exported for HuggingFace; CoLA 1.1 in ../shared/data/cola/raw): learning rates 1e-4, 5e-5 x
seeds 0, 1, 3 epochs of 267 steps (801 steps a run, a log line every 50: the last window one
step long, where the spike was), batch 32, L=64. Both sweeps share a fresh peak cache
(XDG_CACHE_HOME in the workdir), so the second starts from whatever the first left there.
Prints each sweep's MFU range over its progress lines and the cache; appends to
bench/results/accel.md unless --no_record. Skips when the CoLA data is absent.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess

import jax

from bench import harness
from bench.quality import suite_cola
from bert_jax import flops as flops_lib

_MFU = re.compile(r"\| MFU ([0-9.]+)%")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="/tmp/bench_mfu_sweep")
  parser.add_argument("--cola_dir", default=str(suite_cola.DEFAULT_COLA))
  parser.add_argument("--no_record", action="store_true")
  args = parser.parse_args(argv)
  if not pathlib.Path(args.cola_dir).exists():
    print(f"skipped: {args.cola_dir} is absent (CoLA 1.1's raw files)")
    return
  root = pathlib.Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)
  cache_home = root / "xdg_cache"
  shutil.rmtree(cache_home, ignore_errors=True)
  os.environ["XDG_CACHE_HOME"] = str(cache_home)
  hf = suite_cola.prepare_checkpoint(root)
  sweep = argparse.Namespace(learning_rates=[1e-4, 5e-5], batch=32, epochs=3, seeds=2,
                             max_seq_length=64)
  rows = []
  for i in (1, 2):
    work = root / f"sweep{i}"
    shutil.rmtree(work, ignore_errors=True)
    cmd = suite_cola.suite_command(hf, args.cola_dir, work, sweep)
    proc = subprocess.run(cmd, cwd=suite_cola.REPO, env=dict(suite_cola.job_env(),
                                                            XDG_CACHE_HOME=str(cache_home)),
                          capture_output=True, text=True, check=False)
    if proc.returncode:
      raise SystemExit(f"sweep {i} failed:\n{proc.stderr[-3000:]}")
    mfus = [float(m) for m in _MFU.findall(proc.stderr)]
    raised = [l.split("] ", 1)[-1] for l in proc.stderr.splitlines() if "raised the" in l]
    errors = [l.split("] ", 1)[-1] for l in proc.stderr.splitlines() if "timing error" in l]
    rows.append((i, len(mfus), min(mfus), max(mfus), raised, errors))
    print(f"sweep {i}: {len(mfus)} progress lines, MFU {min(mfus):.2f}% .. {max(mfus):.2f}%; "
          f"peak raised {len(raised)}x; timing errors {len(errors)}", flush=True)
  cache = json.loads((cache_home / "bert_jax" / "peak_flops.json").read_text())
  bound = flops_lib.cpu_flops_bound("float32")
  print(f"cache {cache}; float32 bound of this CPU {bound / 1e9:.1f} GFLOP/s")
  if args.no_record:
    return
  lines = [f"## MFU over two CoLA sweeps in a row (issue 40; {datetime.date.today()})", "",
           f"Command: `python -m bench.accel.mfu_sweep --workdir={args.workdir}`; machine: "
           f"{harness.machine()}; jax {jax.__version__}. bench.quality.suite_cola's sweep (tiny "
           "BERT, lr 1e-4 / 5e-5 x 2 seeds, 3 epochs of 267 steps, a log every 50, batch 32, "
           "L=64) twice, sharing a fresh peak cache.", "",
           "| sweep | progress lines | MFU min | MFU max | peak raised | timing errors |",
           "|---|---|---|---|---|---|"]
  for i, n, lo, hi, raised, errors in rows:
    lines.append(f"| {i} | {n} | {lo:.2f}% | {hi:.2f}% | {len(raised)} | {len(errors)} |")
  lines += ["", "Cache afterwards: " + ", ".join(f"`{k}`: {v / 1e9:.1f} GFLOP/s"
                                               for k, v in cache.items())
            + f"; the float32 bound of this CPU (flops.cpu_flops_bound): {bound / 1e9:.1f} GFLOP/s."]
  text = "\n".join(lines) + "\n"
  print(text)
  harness.append(__name__, "\n" + text)


if __name__ == "__main__":
  main()
