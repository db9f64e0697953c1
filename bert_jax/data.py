"""Input iterators for training: the pre-training corpus pipeline or synthetic batches.

Every iterator yields this host's slice of the global batch (host-local numpy
dicts, `global_batch // process_count` rows) and has `get_state()` /
`set_state()` so that a checkpoint records the exact input position.
"""
from __future__ import annotations

from typing import Any, Iterator

from absl import logging
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
import tensorflow as tf

from bert_jax import fileio

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


def _in_workdir(path: str, workdir: str) -> str:
  if not path or path.startswith("/") or fileio.is_remote(path):
    return path
  return fileio.join(workdir, path)


def _vocab_complete(vocab_path: str) -> bool:
  """A vocabulary built here is complete once its marker is written. Without the marker:
  a user's file or directory, or one built before markers existed (by a rename that
  finished: its `.tmp` source is gone)."""
  p = fileio.path(vocab_path)
  if not p.exists():
    return False
  return fileio.is_complete(p) or not fileio.path(vocab_path.rstrip("/") + ".tmp").exists()


def _build(config: ml_collections.ConfigDict, data_cfg: ml_collections.ConfigDict) -> None:
  """Trains the vocabulary and tokenizes the corpus where they are missing (process 0)."""
  from input_pipeline import prepare as prepare_lib  # pylint: disable=g-import-not-at-top
  from input_pipeline import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  build = config.build
  lowercase = True if data_cfg.lowercase is None else data_cfg.lowercase
  if data_cfg.vocab_path and not _vocab_complete(data_cfg.vocab_path):
    logging.info("Training a %d-entry %s vocabulary on %r into %s.", build.vocab_size,
                 build.vocab_kind, build.corpus, data_cfg.vocab_path)
    tmp = data_cfg.vocab_path.rstrip("/") + ".tmp"
    for leftover in (tmp, data_cfg.vocab_path):  # of a build that was killed
      if fileio.path(leftover).exists():
        fileio.path(leftover).rmtree()
    vocab_lib.train_vocab(build.corpus, tmp, vocab_size=build.vocab_size,
                          kind=build.vocab_kind, lowercase=lowercase,
                          max_chars=build.max_chars)
    # Atomic on local disks; on GCS a copy then a delete, hence the marker written last.
    fileio.path(tmp).rename(fileio.path(data_cfg.vocab_path))
    fileio.mark_complete(data_cfg.vocab_path)
  summary = fileio.join(data_cfg.prepared_dir, prepare_lib.SUMMARY_NAME)
  if data_cfg.prepared_dir and not tf.io.gfile.exists(summary):
    logging.info("Preparing corpus %r into %s.", build.corpus, data_cfg.prepared_dir)
    prepare_lib.prepare_corpus(build.corpus, data_cfg.vocab_path, data_cfg.prepared_dir,
                               lowercase=data_cfg.lowercase, num_shards=build.num_shards,
                               progress=False)


def prepare(config: ml_collections.ConfigDict, workdir: str
            ) -> tuple[ml_collections.ConfigDict, int | None]:
  """Resolves the data config's paths (relative ones live in the workdir), builds the
  vocabulary and prepared corpus when `config.build.corpus` says so and they are
  missing (process 0 builds, the others wait), and returns (data config, vocab size)."""
  data_cfg = ml_collections.ConfigDict(config.data.to_dict())
  if config.synthetic_data:
    return data_cfg, None
  data_cfg.prepared_dir = _in_workdir(data_cfg.prepared_dir, workdir)
  data_cfg.vocab_path = _in_workdir(data_cfg.vocab_path, workdir)
  if config.build.corpus:
    if jax.process_index() == 0:
      _build(config, data_cfg)
    multihost_utils.sync_global_devices("bert_jax_data_built")
  if data_cfg.prepared_dir:
    from input_pipeline import prepare as prepare_lib  # pylint: disable=g-import-not-at-top
    summary = prepare_lib.load_summary(data_cfg.prepared_dir)
    logging.info("Prepared corpus %s: %d documents, %d tokens, vocabulary %s (%d entries).",
                 data_cfg.prepared_dir, summary["documents"], summary["tokens"],
                 summary["vocab"]["path"], summary["vocab"]["vocab_size"])
    return data_cfg, int(summary["vocab"]["vocab_size"])
  if data_cfg.vocab_path:
    from input_pipeline import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    return data_cfg, tokenizer_lib.Tokenizer.from_path(data_cfg.vocab_path).vocab_size
  return data_cfg, None


def make_iterator(config: ml_collections.ConfigDict, data_cfg: ml_collections.ConfigDict,
                  *, split: str, batch_size: int, vocab_size: int, seed: int):
  """This host's iterator over `split` ("train" | "eval"), `batch_size` rows per host."""
  if config.synthetic_data:
    if data_cfg.get("packing", False):
      raise ValueError("data.packing needs real examples to pack; it does not apply to "
                       "synthetic_data (which has no padding to remove).")
    return SyntheticIterator(
        batch_size=batch_size, seq_len=data_cfg.max_seq_length,
        num_predictions=data_cfg.max_predictions_per_seq, vocab_size=vocab_size,
        seed=seed + (0 if split == "train" else 1_000_003),
        process_index=jax.process_index(), process_count=jax.process_count())
  from input_pipeline import pretrain  # pylint: disable=g-import-not-at-top
  return pretrain.PretrainIterator(data_cfg, batch_size=batch_size, seed=seed,
                                   process_index=jax.process_index(),
                                   process_count=jax.process_count(), split=split)
