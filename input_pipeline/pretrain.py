"""The BERT pre-training input pipeline: prepared documents -> masked, paired batches.

  it = PretrainIterator(data_cfg, batch_size=256, seed=0, process_index=jax.process_index(),
                        process_count=jax.process_count())
  batch = next(it)             # dict of numpy arrays, leading dim batch_size (host-local)
  state = it.get_state()       # small dict, save it with the checkpoint
  it.set_state(state)          # resume exactly there, in time independent of the step

Features (fixed shapes; L = max_seq_length, P = max_predictions_per_seq):
  input_ids, input_mask, segment_ids  [L] int32
  masked_lm_positions, masked_lm_ids  [P] int32  (padding: position 0, id 0)
  masked_lm_weights                   [P] float32 (1.0 real, 0.0 padding)
  next_sentence_labels                []  int32  (0 IsNext, 1 NotNext; 0 without NSP)

Order and reproducibility: each host holds its documents in memory (documents.py), cut
into pieces. Epoch e visits the pieces in a permutation keyed by (seed, e, host, split),
in blocks of `shuffle_block_docs` pieces. Block b's pairs come from RNGs keyed by
(seed, e, b, host, split) (instances.py) and are shuffled within the block; the block is
then masked in one vectorized numpy call keyed the same way (masking.py).
So the example stream, and the batch at step s, depend only on (seed, s, corpus, host
count, config); the state {epoch, block, offset} restores it by regenerating one block and
skipping `offset` examples. Pairs and masks are fresh every epoch. The iterator builds
batches in a background thread, a few batches ahead of the training loop.

Original create_pretraining_data.py TFRecords (`tfrecord_pattern` instead of
`prepared_dir`) are read as they are (static masks), shuffled per epoch with a seeded
buffer; their state is {epoch, offset}, and restoring re-reads (without parsing) the
records of the current epoch before the offset.
"""
from __future__ import annotations

import atexit
import json
import queue
import random
import threading
import weakref
from typing import Any, Sequence

from absl import logging
import ml_collections
import numpy as np

from common import errors
from input_pipeline import data_config
from input_pipeline import documents
from input_pipeline import features as features_lib
from input_pipeline import instances as inst_lib
from input_pipeline import masking
from input_pipeline import mixture as mixture_lib
from input_pipeline import packing as packing_lib
from input_pipeline import prepare
from input_pipeline import records
from input_pipeline import synthetic
from input_pipeline import text
from input_pipeline import tokenizer as tokenizer_lib

FEATURES = features_lib.PRETRAINING_BATCH
# data.packing: rows [R, L] of several examples; per-example NSP labels/weights [R, E].
PACKED_FEATURES = FEATURES + features_lib.PACKED + ("example_weights",)


def predictions_per_row(cfg) -> int:
  """Masked-LM slots per model row: P unpacked; P + E (or as set) packed, since an
  example of n tokens gets up to 0.15 n + 1 predictions."""
  if not cfg.get("packing", False):
    return cfg.max_predictions_per_seq
  return cfg.max_predictions_per_row or cfg.max_predictions_per_seq + cfg.max_examples_per_row


def features(cfg) -> tuple[str, ...]:
  return PACKED_FEATURES if cfg.get("packing", False) else FEATURES


def batch_shapes(cfg, batch_size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """{feature: (shape, dtype)} of the batches of `batch_size` rows the iterators of `cfg`
  yield (what a train step can be compiled for before the first batch exists)."""
  L, P = (cfg.max_seq_length,), (predictions_per_row(cfg),)
  E = (cfg.max_examples_per_row,) if cfg.get("packing", False) else ()  # per-example: [B, E]
  shapes = dict(input_ids=L, input_mask=L, segment_ids=L, masked_lm_positions=P,
                masked_lm_ids=P, masked_lm_weights=P, next_sentence_labels=E, position_ids=L,
                packed_example_ids=L, cls_positions=E, example_weights=E)
  floats = ("masked_lm_weights", "example_weights")
  return {k: ((batch_size,) + shapes[k], np.dtype(np.float32 if k in floats else np.int32))
          for k in features(cfg)}


def _key(*parts: int) -> int:
  """A 63-bit RNG key mixing non-negative ints (SeedSequence: well spread, portable)."""
  words = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint32)
  return (int(words[0]) << 31) ^ int(words[1])


def vocabulary_for(cfg, summary: dict) -> tokenizer_lib.Tokenizer:
  """The vocabulary of cfg (default: the prepared one), refusing a mismatch."""
  path = cfg.vocab_path or summary["vocab"]["path"]
  tok = tokenizer_lib.Tokenizer.from_path(path, cfg.lowercase)
  if tok.sha256 != summary["vocab"]["sha256"]:
    raise errors.ConfigError(
        f"Vocabulary mismatch: {cfg.prepared_dir} was prepared with "
        f"{summary['vocab']['path']} (sha256 {summary['vocab']['sha256'][:12]}...) but "
        f"vocab_path={path} has sha256 {tok.sha256[:12]}.... Re-run prepare with this "
        "vocabulary or point vocab_path at the original one.")
  return tok


# ------------------------------------------------------------------------- blocks


class BlockStream:
  """The deterministic example stream of one host and split of a prepared corpus."""

  def __init__(self, cfg, corpus: dict, tok: tokenizer_lib.Tokenizer, *, seed: int,
               process_index: int, split: str):
    self.cfg, self.corpus, self.tok = cfg, corpus, tok
    self.seed, self.process_index, self.split_id = seed, process_index, documents.SPLITS.index(split)
    self.num_pieces = len(corpus["piece_doc"])
    self.block_size = max(1, int(cfg.shuffle_block_docs))
    self.blocks_per_epoch = -(-self.num_pieces // self.block_size)
    self._mask_block = masking.make_mask_fn(
        is_special=tok.is_special, is_continuation=tok.is_continuation, mask_id=tok.mask_id,
        max_predictions_per_seq=cfg.max_predictions_per_seq,
        masked_lm_prob=cfg.masked_lm_prob, whole_word_masking=cfg.whole_word_masking,
        mask_ratios=tuple(cfg.get("mask_ratios", masking.MASK_RATIOS)))
    self._perm = (None, None)

  def _permutation(self, epoch: int) -> np.ndarray:
    if self._perm[0] != epoch:
      rng = np.random.default_rng(_key(self.seed, epoch, self.process_index, self.split_id))
      self._perm = (epoch, rng.permutation(self.num_pieces))
    return self._perm[1]

  def block(self, epoch: int, block: int) -> dict:
    """Unmasked features of a block, shuffled, plus its mask_seed [2]."""
    cfg = self.cfg
    pieces = self._permutation(epoch)[block * self.block_size:(block + 1) * self.block_size]
    key = _key(self.seed, epoch, block, self.process_index, self.split_id)
    inst = inst_lib.make_instances(
        self.corpus, pieces, random.Random(key), max_seq_length=cfg.max_seq_length,
        short_seq_prob=cfg.short_seq_prob, nsp=cfg.nsp)
    np_rng = np.random.default_rng(key)
    inst = inst_lib.truncate(inst, np_rng, cfg.max_seq_length - (3 if cfg.nsp else 2))
    feats = inst_lib.assemble(self.corpus["tokens"], inst, max_seq_length=cfg.max_seq_length,
                              cls_id=self.tok.cls_id, sep_id=self.tok.sep_id,
                              pad_id=self.tok.pad_id)
    order = np_rng.permutation(len(inst["label"]))
    feats = {k: v[order] for k, v in feats.items()}
    mask_key = _key(self.seed, epoch, block, self.process_index, self.split_id, 1)
    feats["mask_seed"] = np.array([mask_key >> 32, mask_key & 0xFFFFFFFF], np.int64)
    return feats

  def masking_rate(self, epoch: int, block: int) -> float:
    """The share of tokens masked in a block: data.masked_lm_prob, or on the held-out split
    data.eval_masked_lm_prob when set (ModernBERT trains at 30%, evaluates at 15%); with
    data.masked_lm_prob_final, it moves linearly from the one to the other over this host's
    first data.masked_lm_prob_blocks blocks (a pure function of the block: resumable)."""
    cfg = self.cfg
    if self.split_id != 0 and cfg.get("eval_masked_lm_prob") is not None:
      return float(cfg.eval_masked_lm_prob)
    final, blocks = cfg.get("masked_lm_prob_final"), cfg.get("masked_lm_prob_blocks") or 0
    if final is None or blocks <= 0:
      return float(cfg.masked_lm_prob)
    done = min((epoch * self.blocks_per_epoch + block) / blocks, 1.0)
    return float(cfg.masked_lm_prob + (final - cfg.masked_lm_prob) * done)

  def masked_block(self, epoch: int, block: int) -> dict:
    feats = self.block(epoch, block)
    masked = self._mask_block({"input_ids": feats["input_ids"],
                               "mask_seed": feats.pop("mask_seed"),
                               "masked_lm_prob": np.float64(self.masking_rate(epoch, block))})
    feats.update(masked)
    return feats

  def rows(self, epoch: int, block: int) -> dict:
    """The block's model rows: its examples, or with data.packing the packed rows
    (a pure function of the block, so a resumed state counts rows)."""
    feats = self.masked_block(epoch, block)
    if not self.cfg.get("packing", False):
      return feats
    return packing_lib.pack_examples(
        feats, self.cfg.max_seq_length, self.cfg.max_examples_per_row,
        predictions_per_row(self.cfg))

  def cursor(self, state: dict) -> RowCursor:
    """The stream's rows from `state` on, taken n at a time (batches; a mixture's rows)."""
    return RowCursor(self, state)

  def batches(self, state: dict, batch_size: int):
    """(batch, state after it) pairs from `state` on; batches may span blocks."""
    cursor, keys = self.cursor(state), features(self.cfg)
    while True:
      batch = cursor.take(batch_size, keys)
      yield batch, cursor.state()


class RowCursor:
  """The rows of a stream of blocks (`rows(epoch, block)`, `blocks_per_epoch`: a
  BlockStream) taken in order, n at a time, from a state {"epoch", "block", "offset"}; the
  block last read is kept, so taking rows reads each block once."""

  def __init__(self, stream: Any, state: dict):
    self.stream = stream
    self.epoch, self.block, self.offset = state["epoch"], state["block"], state["offset"]
    self._rows, self._at = None, None

  def state(self) -> dict:
    return {"epoch": self.epoch, "block": self.block, "offset": self.offset}

  def take(self, n: int, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """The next `n` rows' `keys` (a batch may span blocks and epochs)."""
    parts = []
    while n > 0:
      if self._at != (self.epoch, self.block):
        self._rows, self._at = self.stream.rows(self.epoch, self.block), (self.epoch, self.block)
      size = len(self._rows["input_ids"])
      take = min(n, size - self.offset)
      if take > 0:
        parts.append({k: self._rows[k][self.offset:self.offset + take] for k in keys})
        self.offset, n = self.offset + take, n - take
      if self.offset >= size:  # the block is used up (a state saved at its end included)
        self.offset, self.block = 0, self.block + 1
        if self.block == self.stream.blocks_per_epoch:
          self.epoch, self.block = self.epoch + 1, 0
    return {k: np.concatenate([p[k] for p in parts]) for k in keys}


# ------------------------------------------------------------------ original records


class RecordStream:
  """Original create_pretraining_data.py TFRecords as an endless, seeded stream."""

  def __init__(self, cfg, *, seed: int, process_index: int, process_count: int,
               split: str):
    if split != "train":
      raise ValueError("tfrecord_pattern input has no held-out split; give the eval "
                       "records their own data config (tfrecord_pattern) instead.")
    self.cfg, self.seed, self.process_index = cfg, seed, process_index
    self.process_count = process_count
    files = text.expand_patterns(cfg.tfrecord_pattern)
    self.shard_records = len(files) < process_count
    self.files = files if self.shard_records else files[process_index::process_count]

  def _with_positions(self, state: dict):
    tf = records.tensorflow("original BERT TFRecords (data.tfrecord_pattern)")
    cfg = self.cfg

    def one_epoch(epoch):
      ds = tf.data.TFRecordDataset(self.files)
      if self.shard_records:
        ds = ds.shard(self.process_count, self.process_index)
      seed = epoch * 1_000_003 + self.seed * 7919 + self.process_index
      ds = ds.shuffle(cfg.shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
      return ds.enumerate().map(lambda i, r: (epoch, i, r))

    ds = tf.data.Dataset.range(state["epoch"], 1 << 62).flat_map(one_epoch)
    ds = ds.skip(state["offset"])  # Before parsing: cheap.

    def parse(epoch, index, record):
      out = records.parse_bert_record(record, max_seq_length=cfg.max_seq_length,
                                      max_predictions_per_seq=cfg.max_predictions_per_seq)
      return dict(out, epoch=epoch, index=index)

    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

  def batches(self, state: dict, batch_size: int):
    ds = self._with_positions(state).batch(batch_size, drop_remainder=True)
    for batch in ds.prefetch(2).as_numpy_iterator():
      next_state = {"epoch": int(batch["epoch"][-1]), "block": 0,
                    "offset": int(batch["index"][-1]) + 1}
      yield {k: batch[k] for k in FEATURES}, next_state


# ------------------------------------------------------------------------- public API


def make_stream(data_cfg, *, seed: int, process_index: int = 0, process_count: int = 1,
                split: str = "train"):
  """The BlockStream (prepared corpus) or RecordStream (tfrecord_pattern) of data_cfg."""
  data_config.check(data_cfg)
  if data_cfg.tfrecord_pattern:
    if data_cfg.get("packing", False):
      raise ValueError("data.packing works on prepared corpora (input_pipeline.prepare), not "
                       "on original BERT TFRecords (tfrecord_pattern): their masks are fixed "
                       "per example at a padded length. Set data.packing=False or prepare the "
                       "raw text.")
    return RecordStream(data_cfg, seed=seed, process_index=process_index,
                        process_count=process_count, split=split)
  if data_cfg.get("mixture"):
    return _mixture_stream(data_cfg, seed=seed, process_index=process_index,
                           process_count=process_count, split=split)
  if not data_cfg.prepared_dir:
    raise ValueError("Set data_cfg.prepared_dir (from input_pipeline.prepare), "
                     "data_cfg.mixture (several prepared corpora) or "
                     "data_cfg.tfrecord_pattern (original BERT TFRecords).")
  summary = prepare.load_summary(data_cfg.prepared_dir)
  tok = vocabulary_for(data_cfg, summary)
  corpus = documents.load_documents(
      data_cfg.prepared_dir, split=split, eval_fraction=data_cfg.eval_fraction,
      nsp=data_cfg.nsp, process_index=process_index, process_count=process_count,
      doc_piece_tokens=data_cfg.doc_piece_tokens)
  return BlockStream(data_cfg, corpus, tok, seed=seed, process_index=process_index,
                     split=split)


def _mixture_stream(data_cfg, *, seed: int, process_index: int, process_count: int,
                    split: str) -> mixture_lib.MixtureStream:
  """data.mixture: one BlockStream per prepared corpus (each with its own seed), mixed."""
  entries = mixture_lib.parse_mixture(data_cfg.mixture)
  streams, weights, tok = [], [], None
  for i, (path, weight) in enumerate(entries):
    summary = prepare.load_summary(path)
    cfg = ml_collections.ConfigDict(dict(data_cfg.to_dict(), prepared_dir=path))
    this = vocabulary_for(cfg, summary)
    if tok is not None and this.sha256 != tok.sha256:
      raise errors.ConfigError(f"data.mixture: {path} was prepared with the vocabulary "
                       f"{summary['vocab']['path']}, {entries[0][0]} with another: the corpora "
                       "of a mixture must share one vocabulary (prepare them with the same one).")
    tok = this
    corpus = documents.load_documents(
        path, split=split, eval_fraction=data_cfg.eval_fraction, nsp=data_cfg.nsp,
        process_index=process_index, process_count=process_count,
        doc_piece_tokens=data_cfg.doc_piece_tokens)
    streams.append(BlockStream(data_cfg, corpus, tok, seed=_key(seed, 7919, i),
                               process_index=process_index, split=split))
    weights.append(weight if weight is not None else float(summary["tokens"]))
  names = [path.rstrip("/").rsplit("/", 1)[-1] or path for path, _ in entries]
  if len(set(names)) != len(names):
    names = [path for path, _ in entries]
  schedule = mixture_lib.parse_temperature(data_cfg.get("mixture_temperature") or "")
  mix = mixture_lib.Mixture(weights, schedule, _key(seed, 7919, process_index))
  return mixture_lib.MixtureStream(streams, names, mix, features(data_cfg))


def _initial_state() -> dict:
  return {"epoch": 0, "block": 0, "offset": 0}


class _Failure:
  def __init__(self, error: BaseException):
    self.error = error


_LIVE_THREADS = weakref.WeakSet()


class _Prefetcher:
  """Runs a generator in a daemon thread, at most `depth` items ahead of get()."""

  def __init__(self, generator, depth: int):
    self._queue = queue.Queue(max(1, depth))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(generator,), daemon=True)
    self._thread.start()
    _LIVE_THREADS.add(self)

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        pass
    return False

  def _run(self, generator):
    try:
      for item in generator:
        if not self._put(item):
          return
      self._put(_Failure(StopIteration()))
    except BaseException as e:  # pylint: disable=broad-except
      self._put(_Failure(e))  # Raised by get() in the consumer's thread.

  def get(self):
    item = self._queue.get()
    if isinstance(item, _Failure):
      raise item.error
    return item

  def close(self) -> None:
    self._stop.set()
    self._thread.join(timeout=60)


@atexit.register
def _stop_prefetchers():
  # Stop producers while the interpreter is still whole (TF ops in a thread at shutdown).
  for prefetcher in list(_LIVE_THREADS):
    prefetcher.close()


class PretrainIterator:
  """Host-local numpy batches with a small, JSON-serialisable, restorable state."""

  def __init__(self, data_cfg, *, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, split: str = "train"):
    self._prefetcher = None
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    self.batch_size, self.prefetch = batch_size, data_cfg.get("prefetch_batches", 8)
    self._identity = {"seed": seed, "process_index": process_index,
                      "process_count": process_count, "split": split}
    self._stream = make_stream(data_cfg, seed=seed, process_index=process_index,
                               process_count=process_count, split=split)
    self._mixture = isinstance(self._stream, mixture_lib.MixtureStream)
    self._records = isinstance(self._stream, RecordStream)  # static masks, none drawn here
    self._state = self._stream.initial_state() if self._mixture else _initial_state()

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._prefetcher is None:
      self._prefetcher = _Prefetcher(
          self._stream.batches(dict(self._state), self.batch_size), self.prefetch)
    batch, self._state = self._prefetcher.get()
    return batch

  def get_state(self) -> dict:
    masks = {} if self._records else {"masking": masking.VERSION}
    return dict(self._state, **self._identity, **masks)

  def set_state(self, state: dict) -> None:
    """Resumes right after the batch at which `state` was taken (same config)."""
    state = json.loads(json.dumps(state))  # Accept what a checkpoint round trip returns.
    mismatch = {k: (state[k], v) for k, v in self._identity.items()
                if k in state and state[k] != v}
    if mismatch:
      raise ValueError(
          f"Data state from another setup (saved, this iterator): {mismatch}. The stream "
          "depends on them; to start this setup at an epoch's beginning anyway, pass "
          "{'epoch': e, 'block': 0, 'offset': 0} without the other keys.")
    saved = state.get("masking", 1)
    if not self._records and "seed" in state and saved != masking.VERSION:  # a saved state
      logging.warning(
          "This run's data state was saved by masking version %s (%s); this version draws "
          "its masks with masking version %d (numpy: the same statistics, other draws). "
          "The run resumes at the same examples, masked afresh from here on.", saved,
          "TensorFlow stateless ops" if saved == 1 else "unknown", masking.VERSION)
    self.close()
    if self._mixture:
      if "streams" not in state:  # a step to start a fresh mixture at: {"batches": k}
        state = dict(self._stream.initial_state(), batches=int(state.get("batches", 0)))
      self._state = self._stream.parse_state(state)
    else:
      self._state = {k: int(state[k]) for k in _initial_state()}

  def shares(self) -> dict[str, float]:
    """With data.mixture: the share of the rows so far taken from each corpus; else {}."""
    return self._stream.shares(self._state) if self._mixture else {}

  def close(self) -> None:
    """Stops the background thread (a later next() restarts it where it stopped)."""
    if self._prefetcher is not None:
      self._prefetcher.close()
      self._prefetcher = None

  def __del__(self):
    self.close()


def make_iterator(config: ml_collections.ConfigDict, data_cfg: ml_collections.ConfigDict,
                  *, split: str, batch_size: int, vocab_size: int, seed: int,
                  process_index: int = 0, process_count: int = 1):
  """This host's iterator over `split` ("train" | "eval"), `batch_size` rows per host: the
  prepared corpus, or synthetic batches of the same shapes with `config.synthetic_data`."""
  if config.synthetic_data:
    if data_cfg.get("packing", False):
      raise ValueError("data.packing needs real examples to pack; it does not apply to "
                       "synthetic_data (which has no padding to remove).")
    return synthetic.SyntheticIterator(
        batch_size=batch_size, seq_len=data_cfg.max_seq_length,
        num_predictions=data_cfg.max_predictions_per_seq, vocab_size=vocab_size,
        seed=seed + (0 if split == "train" else 1_000_003),
        process_index=process_index, process_count=process_count)
  return PretrainIterator(data_cfg, batch_size=batch_size, seed=seed,
                          process_index=process_index, process_count=process_count, split=split)
