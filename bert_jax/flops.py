"""Analytic FLOPs of a BERT pre-training step and the device peaks behind MFU.

MFU = (model FLOPs per step x steps/s) / (peak FLOP/s of the devices used).
Model FLOPs count the matmuls of forward + backward (3x forward) with the
bidirectional attention in full (all L x L scores and weighted sums), the
masked-LM head only at its P gathered positions, and NSP. Recomputation
(remat) is not counted: MFU measures useful work, not work done.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
import time

from absl import logging
import jax
import jax.numpy as jnp

from bert_jax import families
from bert_jax.models.layers import ModelConfig

# Dense bf16 peak FLOP/s per device (chip; per GPU), from the vendors' data sheets.
PEAK_BF16_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,  # v5e
    "TPU v5e": 197e12,
    "TPU v5": 459e12,  # v5p
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,  # v6e (Trillium)
    "TPU v6e": 918e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H200": 989e12,
}


def forward_flops_per_sequence(cfg: Any, seq_len: int, num_predictions: int,
                               nsp: bool = True, last_rows: int | None = None) -> int:
  """Matmul FLOPs (2 per multiply-add) of one forward pass over one sequence, as the
  model's family counts them (families.Family.forward_flops: each family's formula lives in
  its own module, e.g. models/bert.py's forward_flops)."""
  return families.of(cfg).forward_flops(cfg, seq_len, num_predictions, nsp, last_rows)


def train_flops_per_step(cfg: ModelConfig, batch_size: int, seq_len: int,
                         num_predictions: int, nsp: bool = True,
                         last_rows: int | None = None) -> int:
  """Forward + backward (2x forward: grads w.r.t. activations and weights)."""
  return 3 * batch_size * forward_flops_per_sequence(cfg, seq_len, num_predictions, nsp,
                                                     last_rows)


def _cache_path() -> pathlib.Path:
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(root) / "bert_jax" / "peak_flops.json"


def _cpu_model() -> str:
  """The CPU's model name (the same core count may be another CPU another day)."""
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return "unknown"


def _cache_key(dtype: str) -> str:
  dev = jax.devices()[0]
  model = _cpu_model() if dev.platform == "cpu" else ""
  return f"{dev.platform}:{dev.device_kind}:{model}:{os.cpu_count()}:{dtype}"


def _read_cache() -> dict[str, float]:
  try:
    return json.loads(_cache_path().read_text())
  except (OSError, ValueError):
    return {}


def _write_cache(key: str, peak: float, bound: float = float("inf")) -> None:
  """Records `peak` for `key` unless a higher figure (within `bound`) is already there: a
  measurement on a busy machine never lowers a better one."""
  cached = _read_cache()
  if bound >= cached.get(key, 0.0) >= peak:
    return
  cached[key] = peak
  path = _cache_path()
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(cached, indent=1))
    tmp.replace(path)
  except OSError:
    pass


def _cpu_flags() -> set[str]:
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("flags"):
        return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return set()


def _cpu_clock_hz() -> float:
  """A clock no core of this host exceeds: cpufreq's maximum where the kernel gives one, else
  1.5x the highest MHz /proc/cpuinfo reports (turbo above base), and never under 3.5 GHz."""
  ghz = 3.5
  try:
    ghz = max(ghz, int(pathlib.Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
                       .read_text()) / 1e6)
  except (OSError, ValueError):
    pass
  try:
    mhz = [float(l.split(":", 1)[1]) for l in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
           if l.startswith("cpu MHz")]
    ghz = max([ghz] + [1.5 * m / 1e3 for m in mhz])
  except (OSError, ValueError):
    pass
  return ghz * 1e9


def cpu_flops_bound(dtype: str = "float32") -> float:
  """An upper bound of this host's FLOP/s in `dtype`: cores x FLOPs a core can do per cycle
  (two FMA ports of the widest unit its flags name: AMX tiles for bfloat16, AVX-512, AVX2)
  x a clock it does not exceed. A rate above it is a timing bug, never a peak."""
  flags = _cpu_flags()
  half = str(dtype) in ("bfloat16", "float16")
  if half and "amx_bf16" in flags:
    per_cycle = 2048.0
  elif half and "avx512_bf16" in flags:
    per_cycle = 128.0
  elif "avx512f" in flags:
    per_cycle = 64.0
  elif "avx2" in flags or "fma" in flags:
    per_cycle = 32.0
  else:
    per_cycle = 16.0
  return (os.cpu_count() or 1) * per_cycle * _cpu_clock_hz()


_ignored: set[str] = set()  # cache keys whose figure was beyond the bound (said once)


@functools.lru_cache(maxsize=None)
def measure_matmul_peak(dtype: str = "float32", n: int = 1024, reps: int = 8,
                        budget_s: float = 0.3) -> float:
  """Best observed FLOP/s of a square matmul on the default device (a quick probe, well
  under 1 s): the fastest of at least `reps` timings, more while `budget_s` lasts (on a busy
  machine most timings read low; the fastest is the least disturbed). Never below the best
  figure cached on disk for this device kind, CPU model, core count and dtype:
  `raise_measured_peak` also records faster rates a job achieved."""
  dev = jax.devices()[0]
  key = _cache_key(dtype)
  cached = _read_cache().get(key)
  bound = cpu_flops_bound(dtype) if dev.platform == "cpu" else float("inf")
  if cached and cached <= bound:
    return float(cached)
  if cached and key not in _ignored:
    _ignored.add(key)
    logging.warning("MFU: the cached %s peak of this CPU (%.1f GFLOP/s, in %s) is beyond what "
                    "its cores can do (%.1f GFLOP/s): ignored, measured again.", dtype,
                    cached / 1e9, _cache_path(), bound / 1e9)
  x = jax.device_put(jnp.ones((n, n), dtype), dev)
  mm = jax.jit(lambda a: a @ a)
  mm(x).block_until_ready()
  best, t_end = float("inf"), time.perf_counter() + budget_s
  for i in range(8 * reps):
    t0 = time.perf_counter()
    mm(x).block_until_ready()
    t1 = time.perf_counter()
    best = min(best, t1 - t0)
    if i + 1 >= reps and t1 >= t_end:
      break
  peak = min(2 * n ** 3 / max(best, 1e-9), bound)
  _write_cache(key, peak, bound)
  logging.info("Measured %s matmul peak on %s: %.1f GFLOP/s.", dtype, dev.device_kind, peak / 1e9)
  return peak


def raise_measured_peak(dtype: str, flops_per_s: float) -> None:
  """A host ran `flops_per_s` (model FLOPs) over a window long enough to mean it (Peak.mfu)
  and within what its cores can do: the matmul peak of this host is at least that, from now
  on and in the disk cache. A figure beyond the physical bound is never recorded."""
  if flops_per_s > cpu_flops_bound(dtype):
    return
  measure_matmul_peak.cache_clear()
  _write_cache(_cache_key(dtype), flops_per_s)


def peak_flops(dtype: str = "bfloat16", override: float = 0.0) -> float:
  """Peak FLOP/s of everything this process's job runs on (all devices, all hosts).

  Accelerators: the table above x device count. CPU: a measured matmul peak for
  the whole host (fake multi-device CPUs share the same cores) x hosts.
  """
  dev = jax.devices()[0]
  if override:
    return override * jax.device_count()
  if dev.platform == "cpu":
    return measure_matmul_peak(str(jnp.dtype(dtype))) * jax.process_count()
  per_device = PEAK_BF16_FLOPS.get(dev.device_kind)
  if per_device is None:
    logging.warning("No peak FLOP/s known for %r; MFU will read 0. Set "
                    "config.peak_flops_per_device.", dev.device_kind)
    return 0.0
  return per_device * jax.device_count()


# A rate raises a measured peak only from a window of at least this many steps and seconds.
RAISE_MIN_STEPS = 5
RAISE_MIN_SECONDS = 2.0


class Peak:
  """The peak FLOP/s that MFU counts against, and MFU itself (never above 100%).

  A CPU peak is a measurement, so a lower bound of the true peak: when a job runs faster
  (the probe ran on a busy machine) over a window of at least RAISE_MIN_STEPS steps and
  RAISE_MIN_SECONDS seconds, the peak is raised to the rate achieved, for this run and in
  the disk cache, and the log says so once. A rate beyond what the host's cores can do
  (cpu_flops_bound) is a timing error: said loudly once, never a peak. A peak from the table
  or from config.peak_flops_per_device is kept; a faster rate then shows as 100% with a
  warning that the figure looks too low."""

  def __init__(self, dtype: str = "bfloat16", override: float = 0.0):
    self.dtype = str(jnp.dtype(dtype))
    self.flops = peak_flops(self.dtype, override)
    self.measured = not override and jax.devices()[0].platform == "cpu"
    self.bound = (cpu_flops_bound(self.dtype) * jax.process_count() if self.measured
                  else float("inf"))
    self._warned = self._beyond = False

  def mfu(self, flops_per_s: float, steps: int | None = None,
          seconds: float | None = None) -> float:
    """Model FLOP/s achieved (the whole job) / the peak, at most 1. `steps` and `seconds`:
    the window the rate was measured over (None: the caller vouches for it)."""
    if not self.flops:
      return 0.0
    if flops_per_s > self.bound:
      if not self._beyond:
        self._beyond = True
        logging.error("MFU: a rate of %.1f GFLOP/s (over %s steps, %s s) is beyond what this "
                      "host's cores can do (%.1f GFLOP/s): a timing error, not a peak; the "
                      "peak stays %.1f GFLOP/s.", flops_per_s / 1e9, steps,
                      "?" if seconds is None else f"{seconds:.3f}", self.bound / 1e9,
                      self.flops / 1e9)
      return 1.0
    short = (steps is not None and steps < RAISE_MIN_STEPS) or (
        seconds is not None and seconds < RAISE_MIN_SECONDS)
    if flops_per_s > self.flops and not short:
      if self.measured:
        # Said once: a job speeding up raises it again by small steps, which say nothing new.
        log = logging.debug if self._warned else logging.info
        self._warned = True
        log("MFU: raised the %s matmul peak from %.1f to %.1f GFLOP/s, the rate this job "
            "achieves (the probe ran slower, e.g. on a busy machine); MFU counts against it "
            "from now on.", self.dtype, self.flops / 1e9, flops_per_s / 1e9)
        self.flops = flops_per_s
        raise_measured_peak(self.dtype, flops_per_s / jax.process_count())
      elif not self._warned:
        self._warned = True
        logging.warning("The job runs at %.1f GFLOP/s, above the peak MFU counts against "
                        "(%.1f GFLOP/s): MFU reads 100%%; check config.peak_flops_per_device.",
                        flops_per_s / 1e9, self.flops / 1e9)
    return min(flops_per_s / self.flops, 1.0)


def xla_flops(compiled) -> float:
  """FLOPs of a compiled computation according to XLA's cost analysis."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return float(cost.get("flops", 0.0))
