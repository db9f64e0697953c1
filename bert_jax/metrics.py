"""Training/eval metrics: host-side reduction, console progress, TensorBoard, NaN stop.

The train step returns metric *sums* with their denominators (device scalars).
The loop hands every step's metrics to `TrainMetrics.add` without reading them;
`flush(upto)` reads them only on log steps, after the next step has been
dispatched, so the device never waits for the host.
"""
from __future__ import annotations

import datetime
import time
from typing import Any, Callable, Mapping, Sequence

from absl import logging
import jax
import numpy as np

from bert_jax import flops as flops_lib
from bert_jax import summaries
from common import fileio


class NonFiniteLossError(FloatingPointError):
  """The loss, gradients or parameters became NaN/Inf."""


Writer = summaries.EventWriter | summaries.NullWriter


def make_writer(workdir: str) -> Writer:
  """TensorBoard summaries in `workdir` from process 0 (no TensorFlow); no-op elsewhere."""
  if jax.process_index() == 0:
    return summaries.EventWriter(workdir)
  return summaries.NullWriter()


class _DropLibraryInfo(logging.logging.Filter):
  """Drops INFO chatter of Orbax (dozens of lines per checkpoint) from the console, and
  JAX's report of each accelerator backend it did not find (`Unable to initialize backend
  'tpu': ... libtpu.so` on every CPU or GPU run)."""

  def filter(self, record) -> bool:
    if record.levelno > logging.logging.INFO:
      return True
    if "/orbax/" in record.pathname:
      return False
    return not (record.pathname.endswith("xla_bridge.py")
                and str(record.msg).startswith("Unable to initialize backend"))


def quiet_library_logs() -> None:
  """Keeps the console to progress lines: Orbax INFO messages and missing-backend notes
  are dropped."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _DropLibraryInfo) for f in handler.filters):
    handler.addFilter(_DropLibraryInfo())


def _fmt_eta(seconds: float) -> str:
  if not np.isfinite(seconds):
    return "?"
  return str(datetime.timedelta(seconds=int(seconds)))


class TrainMetrics:
  """Collects per-step device metrics; reads, reports and checks them on demand."""

  def __init__(self, writer: Writer, *, total_steps: int,
               tokens_per_step: int, flops_per_step: float, peak: flops_lib.Peak,
               learning_rate: Callable[[int], float],
               summarize: Callable[[Mapping[str, float]], dict[str, float]],
               console: Sequence[tuple[str, str]] = (),
               prefix: Callable[[int], str] | None = None):
    """`summarize` turns metric sums into scalars (the objective's); `console` names the
    scalars printed after the loss; `prefix(step)` may start the line (e.g. the epoch)."""
    self.writer = writer
    self.summarize, self.console, self.prefix = summarize, tuple(console), prefix
    self.total_steps = total_steps
    self.tokens_per_step, self.flops_per_step = tokens_per_step, flops_per_step
    self.peak = peak
    self.learning_rate = learning_rate
    self.pending: list[tuple[int, Any]] = []  # (step, device metrics), not read yet
    self.values: list[dict[str, Any]] = []  # read and checked, not yet reported
    self.last: dict[str, float] = {}
    self.timer_step: int | None = None
    self.timer_time = 0.0
    self._started: dict[int, float] = {}  # step -> when the host began it (its batch)
    self.last_good_step: int | None = None
    # Host-side scalars reported with each log line (e.g. a data mixture's shares, as
    # {"data_share/NAME": share}); written under train/, shown as "shares NAME 0.60 ...".
    self.host_scalars: Callable[[], dict[str, float]] | None = None

  def start_timer(self, step: int) -> None:
    """Throughput counts steps after `step` (excluding compilation)."""
    self.timer_step, self.timer_time = step, time.perf_counter()

  def add(self, step: int, metrics: Any, started: float | None = None) -> None:
    """`step`: the step count after this update (1-based); `started`: when the host began
    it (before reading its batch; default now). Nothing is read yet: a throughput window
    runs from the start of its first step to the reading of its last one's results."""
    self.pending.append((step, metrics))
    self._started[step] = time.perf_counter() if started is None else started

  def check(self, upto: int) -> None:
    """Reads the metrics of steps <= `upto` (blocking on them); raises on NaN/Inf."""
    take = [(s, m) for s, m in self.pending if s <= upto]
    if not take:
      return
    self.pending = self.pending[len(take):]
    for (step, _), v in zip(take, jax.device_get([m for _, m in take])):
      bad = {k: float(v[k]) for k in ("loss", "grad_norm", "param_norm") if not np.isfinite(v[k])}
      if bad:
        raise NonFiniteLossError(
            f"Non-finite values {bad} at training step {step} (last finite step: "
            f"{self.last_good_step}). Stopping without saving this state. Try a lower "
            "learning rate (--config.opt.learning_rate), a longer warmup or gradient "
            "clipping, and check the input data.")
      self.last_good_step = step
      self.values.append(v)

  def report(self, upto: int) -> dict[str, float]:
    """Reads, checks and reports (console + TensorBoard) everything up to step `upto`."""
    self.check(upto)
    now = time.perf_counter()
    values, self.values = self.values, []
    if not values:
      return {}
    step = upto
    sums = {k: float(sum(v[k] for v in values)) for k in values[0]}
    scalars = self.summarize(sums)
    scalars["loss"] = sums["loss"] / len(values)  # the optimised objective, mean over steps
    scalars["grad_norm"] = float(values[-1]["grad_norm"])
    scalars["param_norm"] = float(values[-1]["param_norm"])
    scalars["learning_rate"] = self.learning_rate(step - 1)
    eta = float("nan")
    if self.timer_step is not None and step > self.timer_step:
      # The window: from the start of its first step to now, when its last step's results
      # are read. Not from the previous report: a deferred one reads the clock after the
      # host ran the next step (XLA:CPU runs a step on the calling thread), so a run's last
      # window of one step measured ~0 s (issue 40); and an evaluation or a checkpoint
      # between the two would count as training time.
      start = self._started.get(self.timer_step + 1, self.timer_time)
      window_s, window_steps = max(now - start, 1e-9), step - self.timer_step
      steps_per_s = window_steps / window_s
      self.timer_step, self.timer_time = step, now
      self._started = {k: t for k, t in self._started.items() if k > step}
      scalars["steps_per_sec"] = steps_per_s
      scalars["tokens_per_sec"] = steps_per_s * self.tokens_per_step
      if "num_tokens" in sums:  # real (non-padding) tokens; packing raises this
        scalars["real_tokens_per_sec"] = steps_per_s * sums["num_tokens"] / len(values)
        scalars["padding_fraction"] = 1.0 - sums["num_tokens"] / len(values) / self.tokens_per_step
      scalars["mfu"] = self.peak.mfu(steps_per_s * self.flops_per_step, steps=window_steps,
                                     seconds=window_s)
      eta = (self.total_steps - step) / steps_per_s
    host = self.host_scalars() if self.host_scalars else {}
    scalars.update(host)
    self.writer.write_scalars(step, {f"train/{k}": v for k, v in scalars.items()})
    shares = " ".join(f"{k.split('/', 1)[-1]} {v:.3f}" for k, v in host.items()
                      if k.startswith("data_share/"))
    speed = f" | shares {shares}" if shares else ""
    if "tokens_per_sec" in scalars:
      speed += f" | {scalars['tokens_per_sec']:,.0f} tok/s"
      if "real_tokens_per_sec" in scalars:
        speed += f" ({scalars['real_tokens_per_sec']:,.0f} non-padding)"
      speed += f" | MFU {100 * scalars['mfu']:.2f}%"
    shown = _shown(scalars, self.console)
    logging.info(
        "%sstep %d/%d | loss %.4f%s | lr %.3g | grad_norm %.3f%s | ETA %s",
        self.prefix(step) if self.prefix else "", step, self.total_steps, scalars["loss"], shown,
        scalars["learning_rate"], scalars["grad_norm"], speed, _fmt_eta(eta))
    self.last = scalars
    return scalars


def _shown(scalars: Mapping[str, float], pairs: Sequence[tuple[str, str]]) -> str:
  return "".join(f" | {label} {scalars[key]:.4f}" for key, label in pairs if key in scalars)


EVAL_FILE = "metrics.json"  # in a pre-training workdir: {"eval": {step: scalars}}


def record_eval(workdir: str, step: int, scalars: Mapping[str, float]) -> None:
  """Adds a held-out evaluation to WORKDIR/metrics.json (the history kept across reruns;
  written atomically, so a kill leaves the old file or the new)."""
  path = fileio.path(workdir) / EVAL_FILE
  history = fileio.read_json(path, {}) or {}
  history.setdefault("eval", {})[str(int(step))] = {k: float(v) for k, v in scalars.items()}
  history["eval"] = dict(sorted(history["eval"].items(), key=lambda kv: int(kv[0])))
  fileio.write_json(path, history)


def held_out_perplexity(workdir: str) -> tuple[int, float] | None:
  """(step, masked-LM perplexity) of a pre-training workdir's last held-out evaluation;
  None where it has none (a HuggingFace checkpoint, a run without evaluation)."""
  try:
    evals = (fileio.read_json(fileio.path(workdir) / EVAL_FILE, {}) or {}).get("eval") or {}
  except (OSError, ValueError):
    return None
  steps = [int(k) for k, v in evals.items() if "mlm_perplexity" in v]
  return (max(steps), evals[str(max(steps))]["mlm_perplexity"]) if steps else None


def report_eval(writer: Writer, step: int, sums: Mapping[str, float],
                objective) -> dict[str, float]:
  """Held-out sums -> the objective's scalars, on the console and under eval/ in TensorBoard."""
  scalars = objective.summarize(sums)
  writer.write_scalars(step, {f"eval/{k}": v for k, v in scalars.items()})
  count = f" | {int(sums[objective.count])} examples" if objective.count in sums else ""
  logging.info("eval at step %d | loss %.4f%s%s", step, scalars["loss"],
               _shown(scalars, objective.eval_console), count)
  return scalars
