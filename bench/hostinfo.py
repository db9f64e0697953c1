"""The host's CPU as every bench table records it (stdlib only: importable in every venv).

The one `machine()` of bench/: bench/finetune_step.py re-exports it (bench/ablations.py,
paper.py, suite_cola.py, mfu_sweep.py and embed_step.py read it there); keras_peer,
modern_step, prepare_speed, input_pipeline (with the load average) and suite_conll read it
here, so that finetune_step (which runs KerasHub through keras_peer) and keras_peer import
no circle.
"""
from __future__ import annotations

import os
import subprocess


def machine() -> str:
  """lscpu's model name and the SIMD/matrix flags that matter for XLA:CPU and oneDNN."""
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return "lscpu unavailable"
  info = dict(l.split(":", 1) for l in out.splitlines() if ":" in l)
  flags = info.get("Flags", "").split()
  shown = [f for f in flags if f.startswith(("avx512f", "avx512bw", "avx512_bf16", "avx512_fp16",
                                             "avx512_vnni", "amx", "avx2", "fma"))]
  return f"{info.get('Model name', '?').strip()}, {os.cpu_count()} cores; flags: {' '.join(shown)}"
