"""Fine-tuning batches: shuffled epochs over in-memory features, resumable, one slice per host.

    batches = EpochIterator(features, global_batch_size=32, num_epochs=3, seed=0,
                            process_index=jax.process_index(), process_count=jax.process_count())
    for batch in batches: ...            # this host's rows of each global batch
    batches.get_state()                   # {"epoch", "offset", "packing"}: where the next batch starts

Epoch `e` visits the examples in the order `permutation(seed, e)`, a pure function of
(seed, epoch), so any process count sees the same global batches and a resumed run
continues exactly. With `max_examples_per_row > 0` each epoch's shuffled examples are
packed into rows first (input_pipeline/packing.py): steps and offsets then count rows.
A remainder smaller than the global batch is dropped at the end of each epoch. With
`no_duplicates` (contrastive pairs) each epoch's shuffled pairs are regrouped so that no text
repeats within a batch (`no_duplicates_order`), still a pure function of (seed, epoch).
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from common import errors
from input_pipeline import packing


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(n)


def text_ids(feats: Mapping[str, np.ndarray], chunk: int = 1 << 16) -> np.ndarray:
  """[N, T]: each pair's texts (anchor, positive, hard negatives: TEXT_COLUMNS) numbered by
  their tokens: two texts the tokenizer makes alike are one text to the model. A text's key
  is a 64-bit hash of its tokens, computed `chunk` rows at a time (no copy of the features)."""
  cols = []
  for i, m in TEXT_COLUMNS:
    if i not in feats:
      continue
    ids, mask = feats[i], feats[m]
    weights = np.random.default_rng(0).integers(1, 2**63, ids.shape[-1], np.uint64) | 1
    keys = np.empty(ids.shape[:-1], np.uint64)
    for lo in range(0, len(ids), chunk):
      toks = (ids[lo:lo + chunk] * mask[lo:lo + chunk]).astype(np.uint64)
      keys[lo:lo + chunk] = (toks * weights).sum(-1)  # wraps mod 2**64
    cols.append(keys.reshape(len(ids), -1))
  keys = np.concatenate(cols, 1)
  return np.unique(keys, return_inverse=True)[1].reshape(keys.shape)


def no_duplicates_order(order: np.ndarray, texts: np.ndarray, batch_size: int
                        ) -> tuple[np.ndarray, int, int]:
  """`order`'s rows regrouped into batches of `batch_size` in none of which a text repeats
  (`texts` [N, T]: each row's text numbers), as sentence-transformers'
  NoDuplicatesBatchSampler: each batch takes, in `order`, the rows that share no text with
  those it holds; a row passed over waits, ahead of the later rows, for the next batch.
  Returns (the batches' rows in order, rows moved to a later batch, rows dropped: those
  left at the end, too few or too alike to fill a batch)."""
  rows = texts.tolist()
  out, waiting, moved = [], [], set()
  fresh = iter(order.tolist())
  while True:
    batch, seen, passed, k = [], set(), [], 0
    while len(batch) < batch_size:
      if k < len(waiting):
        r, k = waiting[k], k + 1
      else:
        r = next(fresh, None)
        if r is None:
          break
      if seen.isdisjoint(rows[r]):
        batch.append(r)
        seen.update(rows[r])
      else:
        passed.append(r)
    moved.update(passed)
    waiting = passed + waiting[k:]
    if len(batch) < batch_size:
      left = set(waiting) | set(batch)
      return np.array(out, np.int64), len(moved - left), len(left)
    out.extend(batch)


def pack_epoch(feats: Mapping[str, np.ndarray], order: np.ndarray, max_seq_length: int,
               max_examples_per_row: int) -> dict[str, np.ndarray]:
  """The examples `feats[order]`, in that order, packed into rows (packing.pack_examples):
  token inputs and position_ids / packed_example_ids [R, L], cls_positions, labels and
  example_weights [R, E]."""
  return packing.pack_examples({k: v[order] for k, v in feats.items()}, max_seq_length,
                               max_examples_per_row)


class EpochIterator:
  """This host's rows of each global batch of `num_epochs` shuffled epochs."""

  def __init__(self, feats: Mapping[str, np.ndarray], *, global_batch_size: int, num_epochs: int,
               seed: int, max_seq_length: int | None = None, max_examples_per_row: int = 0,
               process_index: int = 0, process_count: int = 1, no_duplicates: bool = False):
    if global_batch_size % process_count:
      raise ValueError(f"global_batch_size {global_batch_size} does not split over "
                       f"{process_count} processes.")
    self.feats = dict(feats)
    self.batch_size, self.num_epochs, self.seed = global_batch_size, num_epochs, seed
    self.packed = max_examples_per_row > 0
    self.max_seq_length, self.max_examples_per_row = max_seq_length, max_examples_per_row
    self.process_index, self.process_count = process_index, process_count
    self.num_examples = len(self.feats["input_ids"])
    self.no_duplicates = no_duplicates
    # Per epoch: (pairs moved to a later batch, pairs dropped at its end), with no_duplicates.
    self.deduplicated: list[tuple[int, int]] = []
    self._orders: list[np.ndarray] = []
    if no_duplicates:
      if self.packed:
        raise ValueError("no_duplicates batches pairs; packed rows of examples have no pairs.")
      texts = text_ids(self.feats)
      for e in range(num_epochs):
        order, moved, dropped = no_duplicates_order(
            epoch_order(seed, e, self.num_examples), texts, global_batch_size)
        self._orders.append(order)
        self.deduplicated.append((moved, dropped))
      self.rows_per_epoch = [len(o) for o in self._orders]
    elif self.packed:
      # Rows per epoch depend on that epoch's shuffle: counted up front (row assignment only).
      lengths = self.feats["input_mask"].sum(-1)
      self.rows_per_epoch = [
          packing.assign_rows(lengths[self.order(e)], np.zeros_like(lengths),
                              max_seq_length=max_seq_length,
                              max_examples_per_row=max_examples_per_row,
                              max_predictions_per_row=0)[-1]
          for e in range(num_epochs)]
    else:
      self.rows_per_epoch = [self.num_examples] * num_epochs
    self.steps_per_epoch = [r // global_batch_size for r in self.rows_per_epoch]
    self.epoch, self.offset = 0, 0
    self._cached: tuple[int, dict[str, np.ndarray], np.ndarray] | None = None

  def order(self, epoch: int) -> np.ndarray:
    """The examples of `epoch`, in the order its batches take them."""
    if self._orders:
      return self._orders[epoch]
    return epoch_order(self.seed, epoch, self.num_examples)

  def _epoch(self, epoch: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(features, row order) of an epoch: packed rows in order, or the examples shuffled."""
    if self._cached is None or self._cached[0] != epoch:
      if self.packed:
        rows = pack_epoch(self.feats, self.order(epoch), self.max_seq_length,
                          self.max_examples_per_row)
        self._cached = (epoch, rows, np.arange(len(rows["input_ids"])))
      else:
        self._cached = (epoch, self.feats, self.order(epoch))
    return self._cached[1], self._cached[2]

  def _normalize(self) -> None:
    while self.epoch < self.num_epochs and self.offset + self.batch_size > self.rows_per_epoch[self.epoch]:
      self.epoch, self.offset = self.epoch + 1, 0

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    self._normalize()
    if self.epoch >= self.num_epochs:
      raise StopIteration
    feats, order = self._epoch(self.epoch)
    idx = order[self.offset:self.offset + self.batch_size]
    self.offset += self.batch_size
    b = self.batch_size // self.process_count
    idx = idx[self.process_index * b:(self.process_index + 1) * b]
    return {k: v[idx] for k, v in feats.items()}

  def get_state(self) -> dict[str, Any]:
    """Where the next batch starts (an epoch's end is the next epoch's start)."""
    self._normalize()
    state = {"epoch": self.epoch, "offset": self.offset, "packing": self.packed}
    if self.no_duplicates:
      state["no_duplicates"] = True
    return state

  def set_state(self, state: Mapping[str, Any]) -> None:
    epoch, offset = int(state.get("epoch", 0)), int(state.get("offset", 0))
    if offset and bool(state.get("no_duplicates", False)) != self.no_duplicates:
      raise errors.ConfigError(
          f"The checkpoint stopped mid-epoch in batches ordered "
          f"{'without' if self.no_duplicates else 'with'} no_duplicates: resume with "
          f"--config.no_duplicates={not self.no_duplicates} as before, or start afresh in a "
          "new --workdir.")
    if offset and bool(state.get("packing", False)) != self.packed:
      was = ("--config.packing=True --config.packed_batch=rows" if not self.packed else
             "--config.packing=False (or packed_batch=examples, the default)")
      raise ValueError(f"The checkpoint stopped mid-epoch with its offset counting "
                       f"{'rows' if not self.packed else 'examples'}: resume with the same "
                       f"--config.packing and --config.packed_batch as before ({was}).")
    self.epoch, self.offset = epoch, offset


TEXT_COLUMNS = (("input_ids", "input_mask"), ("positive_ids", "positive_mask"),
                ("negative_ids", "negative_mask"))  # a pair's texts, in text_at's order


def pair_texts(batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Ids and masks [B, T, L] of a batch of pairs: each anchor, positive, then hard negatives."""
  cols = [(batch[i], batch[m]) for i, m in TEXT_COLUMNS if i in batch]
  expand = lambda x: x if x.ndim == 3 else x[:, None]
  return (np.concatenate([expand(i) for i, _ in cols], 1),
          np.concatenate([expand(m) for _, m in cols], 1))


class PackedBatches:
  """The global batches of an EpochIterator, each packed whole (`_pack`) into the same number
  of rows every step: the most any batch of the run needs (from `_lengths`), rounded up to
  `row_multiple` x the process count, counted when it starts; each host its slice
  (`_host`). Resumes as its EpochIterator (get_state / set_state)."""

  def __init__(self, feats: Mapping[str, np.ndarray], *, global_batch_size: int, num_epochs: int,
               seed: int, max_per_row: int, row_multiple: int = 1, process_index: int = 0,
               process_count: int = 1, no_duplicates: bool = False):
    self.batches = EpochIterator(feats, global_batch_size=global_batch_size,
                                 num_epochs=num_epochs, seed=seed, no_duplicates=no_duplicates)
    self.steps_per_epoch = self.batches.steps_per_epoch
    self.deduplicated = self.batches.deduplicated
    self.max_per_row = max_per_row
    self.process_index, self.process_count = process_index, process_count
    lengths = self._lengths(feats)  # [N, texts an item]
    self.row_length = feats["input_mask"].shape[-1]
    needed = [packing.rows_needed(lengths[self.batches.order(e)[
                  s * global_batch_size:(s + 1) * global_batch_size]].reshape(-1),
                                  self.row_length, max_per_row)
              for e, steps in enumerate(self.steps_per_epoch) for s in range(steps)]
    multiple = row_multiple * process_count
    self.rows = -(-max(needed, default=1) // multiple) * multiple
    self.tokens_real = float(lengths.sum() / lengths.size)  # a text's mean real tokens
    self.texts_per_batch = global_batch_size * lengths.shape[1]

  def _host_rows(self) -> slice:
    r = self.rows // self.process_count
    return slice(self.process_index * r, (self.process_index + 1) * r)

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return self._host(self._pack(next(self.batches)))

  def get_state(self) -> dict[str, Any]:
    return self.batches.get_state()

  def set_state(self, state: Mapping[str, Any]) -> None:
    self.batches.set_state(state)


class PackedPairBatches(PackedBatches):
  """Batches of (anchor, positive, hard negatives) pairs whose texts are packed several to a
  row (packing.pack_texts), a batch still holding global_batch_size pairs. A batch: the
  rows' input_ids, input_mask, segment_ids, position_ids, packed_example_ids [R, L];
  text_at [B, T, 2], the (global row, slot) of each pair's texts; example_weights [B]."""

  @staticmethod
  def _lengths(feats):
    return pair_texts(feats)[1].sum(-1)

  def _pack(self, batch):
    ids, mask = pair_texts(batch)
    B, T, L = ids.shape
    out = packing.pack_texts(ids.reshape(B * T, L), mask.reshape(B * T, L),
                             max_texts_per_row=self.max_per_row, rows=self.rows)
    out["text_at"] = out["text_at"].reshape(B, T, 2)
    return out

  def _host(self, out):
    b = len(out["text_at"]) // self.process_count
    host = {k: v[self._host_rows()] for k, v in out.items() if k != "text_at"}
    host["text_at"] = out["text_at"][self.process_index * b:(self.process_index + 1) * b]
    host["example_weights"] = np.ones(b, np.float32)
    return host


class PackedExampleBatches(PackedBatches):
  """Batches of global_batch_size examples (classification), each batch's examples packed
  several to a row (packing.pack_examples, longest first): the same examples a step as
  unpacked, on fewer rows. A batch: rows [R, L] with cls_positions, labels and
  example_weights [R, E] (empty slots weigh 0)."""

  @staticmethod
  def _lengths(feats):
    return feats["input_mask"].sum(-1)[:, None]

  def _pack(self, batch):
    order = np.argsort(-batch["input_mask"].sum(-1), kind="stable")
    return packing.pack_examples({k: v[order] for k, v in batch.items()}, self.row_length,
                                 self.max_per_row, open_rows=packing.OPEN_ROWS, rows=self.rows)

  def _host(self, out):
    return {k: v[self._host_rows()] for k, v in out.items()}
