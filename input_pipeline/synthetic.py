"""Synthetic pre-training batches: random ids with the real feature shapes.

For benchmarks and tests: no corpus, no vocabulary, no host work worth measuring. The
iterator has the same interface as the corpus pipeline (host-local numpy dicts,
`get_state()` / `set_state()`).
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

PAD_ID, MASK_ID = 0, 4  # synthetic batches only; real ids come from the vocabulary


class SyntheticIterator:
  """Random pre-training batches with the real feature shapes (benchmarks, tests).

  Batch `k` of the *global* stream is a pure function of (seed, k); each process
  returns its rows of it, so any process count sees the same global batches.
  """

  def __init__(self, *, batch_size: int, seq_len: int, num_predictions: int, vocab_size: int,
               seed: int = 0, process_index: int = 0, process_count: int = 1):
    self.batch_size, self.seq_len, self.num_predictions = batch_size, seq_len, num_predictions
    self.vocab_size, self.seed = vocab_size, seed
    self.process_index, self.process_count = process_index, process_count
    self.index = 0

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def get_state(self) -> dict[str, Any]:
    return {"index": self.index}

  def set_state(self, state: dict[str, Any]) -> None:
    self.index = int(state["index"])

  def __next__(self) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, self.index])
    self.index += 1
    b = self.batch_size * self.process_count
    L, P, V = self.seq_len, self.num_predictions, self.vocab_size
    lengths = rng.integers(max(L // 2, P + 3), L + 1, size=b)
    real = np.arange(L)[None] < lengths[:, None]
    ids = np.where(real, rng.integers(5, V, size=(b, L)), PAD_ID).astype(np.int32)
    segments = (real & (np.arange(L)[None] >= lengths[:, None] // 2)).astype(np.int32)
    # P distinct positions in 1..length-2 ([CLS]/[SEP] never masked), sorted.
    keys = np.where(np.arange(L)[None] < lengths[:, None] - 1, rng.random((b, L)), 2.0)
    keys[:, 0] = 2.0
    positions = np.sort(np.argsort(keys, axis=1)[:, :P], axis=1).astype(np.int32)
    num_masked = np.minimum(np.maximum(1, np.round(0.15 * lengths)).astype(int), P)
    weights = (np.arange(P)[None] < num_masked[:, None]).astype(np.float32)
    positions = np.where(weights > 0, positions, 0).astype(np.int32)
    masked_ids = np.where(weights > 0, np.take_along_axis(ids, positions, 1), 0).astype(np.int32)
    rows = np.arange(b)[:, None]
    ids[rows, positions] = np.where(weights > 0, MASK_ID, ids[rows, positions])
    batch = dict(input_ids=ids, input_mask=real.astype(np.int32), segment_ids=segments,
                 masked_lm_positions=positions, masked_lm_ids=masked_ids,
                 masked_lm_weights=weights,
                 next_sentence_labels=rng.integers(0, 2, size=b).astype(np.int32))
    lo = self.process_index * self.batch_size
    return {k: v[lo:lo + self.batch_size] for k, v in batch.items()}
