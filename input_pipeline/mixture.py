"""Weighted mixtures of prepared corpora (`data.mixture`), optionally with a sampling
temperature that changes over training (`data.mixture_temperature`).

  data.mixture = "gs://b/prepared/en:0.6,gs://b/prepared/de:0.3,gs://b/prepared/code"
  data.mixture_temperature = "0.7,10000:0.5,20000:0.3"

Each entry is a prepared directory (input_pipeline.prepare), optionally ":WEIGHT"; a corpus
without a weight weighs its token count. All corpora share one vocabulary. The share of
corpus i at batch k is p_i(k) = w_i^t(k) / sum_j w_j^t(k), where t(k) is the temperature in
force at batch k ("T0" alone, or "T0,K1:T1,K2:T2,...": T1 from batch K1 on; 1 = the weights
as given; lower flattens towards uniform, as mmBERT's 0.7 -> 0.5 -> 0.3). A batch is a
training step (this host's rows of the global batch).

Which corpus fills a row: row r of batch k is example t = k * B + r of the host's stream;
it comes from corpus i where x_t = frac(u + t * phi) (phi = (sqrt 5 - 1) / 2, u from the
seed) falls in the i-th interval of the cumulative p(k). The golden-ratio sequence is evenly
spread, so over any n consecutive examples each corpus's count is within O(log n) of its
expected share (over 10,000: well within 1%), and the source of every row is a pure
function of (seed, t): the stream needs no history. Each corpus is its own example stream
(pretrain.BlockStream, its own shuffle, pairs and masks), read in order as rows are taken.

State: {"batches": k, "streams": [{"epoch", "block", "offset"} per corpus], "rows": [rows
taken from each corpus]}: restoring regenerates one block per corpus, O(1) in the step.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from common import errors

_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def parse_mixture(spec: str) -> list[tuple[str, float | None]]:
  """"DIR[:WEIGHT],..." -> [(dir, weight or None)]; a gs:// path keeps its colon."""
  entries = []
  for part in (p.strip() for p in spec.split(",")):
    if not part:
      continue
    path, weight = part, None
    head, sep, tail = part.rpartition(":")
    if sep and head and "/" not in tail:
      try:
        weight = float(tail)
      except ValueError:
        weight = None
      else:
        path = head
    if weight is not None and not (math.isfinite(weight) and weight > 0):
      raise errors.ConfigError(f"--config.data.mixture: {part!r}: a weight must be a positive "
                               "number (e.g. gs://bucket/prepared/en:0.6).")
    entries.append((path, weight))
  if not entries:
    raise errors.ConfigError("--config.data.mixture names no prepared corpus: give "
                             "'DIR[:WEIGHT],DIR[:WEIGHT],...'.")
  if len({p for p, _ in entries}) != len(entries):
    raise errors.ConfigError(f"--config.data.mixture={spec!r} names a corpus twice.")
  return entries


def parse_temperature(spec: str) -> list[tuple[int, float]]:
  """"T0" or "T0,K1:T1,..." -> [(first batch, temperature)], starting at batch 0."""
  schedule = []
  for i, part in enumerate(p.strip() for p in (spec or "1").split(",")):
    try:
      if i == 0:
        start, value = 0, float(part)
      else:
        k, _, t = part.partition(":")
        start, value = int(k), float(t)
    except ValueError as e:
      raise errors.ConfigError(
          f"--config.data.mixture_temperature={spec!r}: write 'T0' or 'T0,K1:T1,K2:T2' "
          "(temperature T1 from batch K1 on), e.g. '0.7,10000:0.5,20000:0.3'.") from e
    if not (math.isfinite(value) and value > 0):
      raise errors.ConfigError(f"--config.data.mixture_temperature={spec!r}: temperatures "
                               "must be positive (1 = the weights as given).")
    if schedule and start <= schedule[-1][0]:
      raise errors.ConfigError(f"--config.data.mixture_temperature={spec!r}: the batches "
                               "where the temperature changes must increase.")
    schedule.append((start, value))
  return schedule


class Mixture:
  """The source of every example: p(k) from weights and the temperature schedule."""

  def __init__(self, weights: Sequence[float], schedule: Sequence[tuple[int, float]],
               seed: int):
    self.weights = np.asarray(weights, np.float64)
    self.schedule = list(schedule)
    self.offset = float(np.random.default_rng([int(seed), 7]).random())

  def temperature(self, batch: int) -> float:
    return next(t for start, t in reversed(self.schedule) if batch >= start)

  def probabilities(self, batch: int) -> np.ndarray:
    logits = self.temperature(batch) * np.log(self.weights / self.weights.max())
    p = np.exp(logits)
    return p / p.sum()

  def sources(self, batch: int, batch_size: int) -> np.ndarray:
    """[batch_size] corpus index of each row of `batch`."""
    t = batch * batch_size + np.arange(batch_size, dtype=np.float64)
    x = np.mod(self.offset + t * _PHI, 1.0)
    edges = np.cumsum(self.probabilities(batch))[:-1]
    return np.searchsorted(edges, x, side="right").astype(np.int64)


class MixtureStream:
  """Batches of rows drawn from several corpus streams (module doc); the interface of
  pretrain.BlockStream's `batches` and a state of its own."""

  def __init__(self, streams: Sequence[Any], names: Sequence[str], mixture: Mixture,
               keys: Sequence[str]):
    self.streams, self.names, self.mixture, self.keys = list(streams), list(names), mixture, keys

  def initial_state(self) -> dict:
    start = {"epoch": 0, "block": 0, "offset": 0}
    return {"batches": 0, "streams": [dict(start) for _ in self.streams],
            "rows": [0] * len(self.streams)}

  def parse_state(self, state: dict) -> dict:
    """A saved state, checked against this mixture's corpora."""
    streams = state.get("streams")
    if not isinstance(streams, list) or len(streams) != len(self.streams):
      raise ValueError(
          f"Data state of another mixture (saved: {streams!r}; this run mixes "
          f"{len(self.streams)} corpora: {self.names}). A changed data.mixture starts its "
          "streams afresh: pass {'batches': 0} to start anew.")
    return {"batches": int(state["batches"]),
            "streams": [{k: int(s[k]) for k in ("epoch", "block", "offset")} for s in streams],
            "rows": [int(r) for r in state.get("rows", [0] * len(self.streams))]}

  def batches(self, state: dict, batch_size: int):
    cursors = [s.cursor(st) for s, st in zip(self.streams, state["streams"])]
    batch, rows = state["batches"], list(state["rows"])
    while True:
      sources = self.mixture.sources(batch, batch_size)
      out = None
      for i, cursor in enumerate(cursors):
        where = np.flatnonzero(sources == i)
        if not len(where):
          continue
        taken = cursor.take(len(where), self.keys)
        if out is None:
          out = {k: np.zeros((batch_size,) + v.shape[1:], v.dtype) for k, v in taken.items()}
        for k, v in taken.items():
          out[k][where] = v
        rows[i] += len(where)
      batch += 1
      yield out, {"batches": batch, "streams": [c.state() for c in cursors], "rows": list(rows)}

  def shares(self, state: dict) -> dict[str, float]:
    """Share of the rows so far taken from each corpus, by name."""
    total = max(sum(state["rows"]), 1)
    return {name: r / total for name, r in zip(self.names, state["rows"])}
