"""TFRecord formats: the first prepared format (read by `prepare --convert`) and Google's
original pre-training examples. The prepared corpus itself is memory-mapped arrays
(input_pipeline/store.py).

The first prepared format (before the arrays): DIR/docs-SSSSS-of-NNNNN.tfrecord files of
tf.train.Example, one per document, with two int64 list features
  token_ids         the document's token ids, all sentences concatenated;
  sentence_lengths  tokens per sentence (sum == len(token_ids), every entry >= 1);
plus DIR/summary.json (counts, options, vocabulary hash). Documents are dealt round-robin
to the shards in corpus order, so the output does not depend on the number of workers.

`encode_document` writes the Example wire format with numpy alone (no TensorFlow in the
prepare workers); the tests check it against tf.train.Example parsing.
"""
import functools

import numpy as np

from common import errors
from input_pipeline import features
from input_pipeline import text

DOC_FEATURES = ("token_ids", "sentence_lengths")
# Original BERT's TFRecords store these as int64 (masked_lm_weights as float).
BERT_INT_FEATURES = tuple(k for k in features.PRETRAINING_BATCH if k != "masked_lm_weights")


# TensorFlow and TFDS are in the base install (setup.py); an image may lack them.
TENSORFLOW_INSTALL = ("install it with `pip install -c constraints.txt tensorflow-cpu "
                      "tensorflow-datasets` in the bert_jax repository (both are in its base "
                      "install: pip install -c constraints.txt -e .)")


def tensorflow(needed_for: str = "this input (TFRecords, a TFDS dataset or a Google TF "
               "checkpoint)"):
  """TensorFlow, imported only where it is used (TFRecords, TFDS, Google TF checkpoints; 3-4 s
  and ~800 MB that no other job path pays) and kept off the GPUs, which JAX drives (once).
  Where it does not import: errors.MissingDependencyError saying what needs it
  (`needed_for`) and how to install it."""
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (heavy and optional)
  except ImportError as e:
    raise errors.MissingDependencyError(
        f"TensorFlow is needed for {needed_for} and does not import here ({e}): "
        f"{TENSORFLOW_INSTALL}.") from e
  _keep_off_gpus(tf)
  return tf


@functools.cache
def _keep_off_gpus(tf) -> None:
  try:
    tf.config.set_visible_devices([], "GPU")
  except (RuntimeError, ValueError):  # TF's devices are already initialised: leave them
    pass


def tensorflow_datasets(needed_for: str):
  """tensorflow_datasets (TensorFlow first, kept off the GPUs), or
  errors.MissingDependencyError as `tensorflow` says."""
  tensorflow(needed_for)
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (optional)
  except ImportError as e:
    raise errors.MissingDependencyError(
        f"tensorflow-datasets is needed for {needed_for} and does not import here ({e}): "
        f"{TENSORFLOW_INSTALL}.") from e
  return tfds


# ------------------------------------------------------------------- Example encoding


def _varint_scalar(value: int) -> bytes:
  out = bytearray()
  while True:
    byte = value & 0x7F
    value >>= 7
    if value:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _varints(values: np.ndarray) -> bytes:
  """Protobuf varint encoding of non-negative ints, vectorized (no per-value Python)."""
  v = np.asarray(values, dtype=np.uint64)
  if v.size == 0:
    return b""
  nbytes = np.ones(v.shape, np.int64)
  for k in range(1, 10):
    nbytes += v >= np.uint64(1 << (7 * k))
  ends = np.cumsum(nbytes)
  out = np.empty(int(ends[-1]), np.uint8)
  starts = ends - nbytes
  for k in range(int(nbytes.max())):
    has = nbytes > k
    byte = (v[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
    more = (nbytes[has] > k + 1).astype(np.uint64) << np.uint64(7)
    out[starts[has] + k] = (byte | more).astype(np.uint8)
  return out.tobytes()


def _length_delimited(field: int, payload: bytes) -> bytes:
  return _varint_scalar(field << 3 | 2) + _varint_scalar(len(payload)) + payload


def _int64_feature_entry(name: str, values: np.ndarray) -> bytes:
  # Features.feature map entry {key: name, value: Feature{int64_list: {value: packed}}}.
  int64_list = _length_delimited(1, _varints(values)) if len(values) else b""
  feature = _length_delimited(3, int64_list)
  entry = _length_delimited(1, name.encode()) + _length_delimited(2, feature)
  return _length_delimited(1, entry)


def encode_int64_example(features: dict) -> bytes:
  """Serialized tf.train.Example of non-negative int64 list features."""
  body = b"".join(_int64_feature_entry(k, np.asarray(v)) for k, v in features.items())
  return _length_delimited(1, body)


def encode_document(sentences: list[list[int]]) -> bytes:
  """A tokenized document (non-empty sentences) as a serialized tf.train.Example."""
  lengths = np.array([len(s) for s in sentences], np.int64)
  tokens = np.fromiter((t for s in sentences for t in s), np.int64, int(lengths.sum()))
  return encode_int64_example({"token_ids": tokens, "sentence_lengths": lengths})


# ------------------------------------------------------------------- reading prepared docs


def read_documents(files: list[str], batch_size: int = 256):
  """Yields (token_ids, sentence_lengths) numpy batches (flat + per-document row lengths).

  Each yielded dict: tokens [T] int64, token_rows [D] (tokens per doc), sentence_lengths
  [S] int64, sentence_rows [D] (sentences per doc), documents in file order.
  """
  tf = tensorflow(f"TFRecord files ({', '.join(files[:2])})")
  spec = {name: tf.io.RaggedFeature(tf.int64) for name in DOC_FEATURES}
  ds = tf.data.TFRecordDataset(files).batch(batch_size)
  ds = ds.map(lambda x: tf.io.parse_example(x, spec)).prefetch(2)
  for batch in ds:
    tokens, sents = batch["token_ids"], batch["sentence_lengths"]
    yield {"tokens": tokens.flat_values.numpy(), "token_rows": tokens.row_lengths().numpy(),
           "sentence_lengths": sents.flat_values.numpy(),
           "sentence_rows": sents.row_lengths().numpy()}


# ------------------------------------------------------------------- original BERT records


def bert_record_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
  tf = tensorflow()
  length = {"input_ids": max_seq_length, "input_mask": max_seq_length,
            "segment_ids": max_seq_length, "masked_lm_positions": max_predictions_per_seq,
            "masked_lm_ids": max_predictions_per_seq, "next_sentence_labels": 1}
  spec = {k: tf.io.FixedLenFeature([n], tf.int64) for k, n in length.items()}
  spec["masked_lm_weights"] = tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32)
  return spec


def parse_bert_record(serialized, *, max_seq_length: int, max_predictions_per_seq: int):
  """One serialized original-BERT example -> our feature dict (int32, label scalar)."""
  tf = tensorflow()
  ex = tf.io.parse_single_example(
      serialized, bert_record_spec(max_seq_length, max_predictions_per_seq))
  out = {k: tf.cast(ex[k], tf.int32) for k in BERT_INT_FEATURES}
  out["next_sentence_labels"] = out["next_sentence_labels"][0]
  out["masked_lm_weights"] = ex["masked_lm_weights"]
  return out


def read_bert_tfrecords(pattern: str, *, max_seq_length: int, max_predictions_per_seq: int):
  """tf.data.Dataset of the examples in original create_pretraining_data.py TFRecords.

  `pattern` is comma-separated globs; files are read in sorted order, unshuffled.
  """
  tf = tensorflow(f"original BERT TFRecords ({pattern})")
  files = text.expand_patterns(pattern)
  return tf.data.TFRecordDataset(files).map(
      lambda r: parse_bert_record(r, max_seq_length=max_seq_length,
                                  max_predictions_per_seq=max_predictions_per_seq),
      num_parallel_calls=tf.data.AUTOTUNE)
