"""The prepared corpus on disk: three flat arrays that every host memory-maps.

A prepared directory (format_version 2, written by prepare.py) holds, beside summary.json:
  tokens.npy           [T] token ids, uint16 (uint32 for vocabularies over 65,536 entries),
                       every document's sentences back to back;
  sentence_starts.npy  [S+1] int64, token offset of each sentence (and T at the end);
  document_starts.npy  [D+1] int64, sentence offset of each document (and S at the end).
Documents are dealt round-robin to `num_shards` shards (corpus document g goes to shard
g % num_shards, as its record g // num_shards) and stored shard after shard, so a shard, the
unit dealt to hosts, is one contiguous range of each array (summary["shard_documents"]).

Reading costs no time and no memory up front: the arrays are opened with
np.load(mmap_mode="r"), so a host pages in only the documents it reads. np.memmap needs a
local file: a gs:// corpus is first copied to a local cache directory (once per machine,
reused while the summary's "created" stamp and the file sizes match), or mount the bucket
(gcsfuse) and give the mounted path.

Writing streams (ShardWriter): each shard's arrays grow in scratch files in the output
directory; `finish` concatenates them into the final .npy files (header first, then the
data in chunks of a few MB), so memory stays flat whatever the corpus size.

Directories of the first format (TFRecord shards of tf.train.Example documents) are
refused with the command that converts them (`python -m input_pipeline.prepare
--convert=OLD --output_dir=NEW`, which copies the token ids without tokenizing again).
"""
import contextlib
import hashlib
import io
import json
import os
import tempfile

import numpy as np

from bert_jax import errors
from bert_jax import fileio

FORMAT_VERSION = 2
TOKENS, SENTENCES, DOCUMENTS = "tokens.npy", "sentence_starts.npy", "document_starts.npy"
FILES = (TOKENS, SENTENCES, DOCUMENTS)
SCRATCH = "scratch"
_CHUNK = 1 << 22  # Elements per streamed copy.
_CACHE_ENV = "BERT_JAX_CORPUS_CACHE"


def token_dtype(vocab_size: int) -> np.dtype:
  """The smallest unsigned dtype that holds every id of the vocabulary."""
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _npy_header(dtype: np.dtype, length: int) -> bytes:
  out = io.BytesIO()
  np.lib.format.write_array_header_1_0(
      out, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype).newbyteorder("<")),
            "fortran_order": False, "shape": (int(length),)})
  return out.getvalue()


class ShardWriter:
  """Streams documents into a prepared directory's arrays, shard by shard (module doc).

    writer = ShardWriter(output_dir, num_shards, vocab_size)
    writer.add(shard, tokens, sentence_lengths, document_sentences)   # any number of docs
    writer.finish()   # -> shard_documents; writes the three .npy files
  """

  _PARTS = (("tokens", None), ("sentence_lengths", np.int64),
            ("document_sentences", np.int64))

  def __init__(self, output_dir: str, num_shards: int, vocab_size: int):
    self.output_dir, self.num_shards = output_dir, num_shards
    self.dtype = token_dtype(vocab_size)
    self.scratch = fileio.path(output_dir) / SCRATCH
    if self.scratch.exists():  # Left by a run that was killed.
      self.scratch.rmtree()
    self.scratch.mkdir(parents=True)
    self.counts = {name: [0] * num_shards for name, _ in self._PARTS}
    self.shard_documents = [0] * num_shards
    # epath's gs:// open() is a context manager: the stack holds them all open.
    self._stack = contextlib.ExitStack()
    self._files = {(name, s): self._stack.enter_context(
        (self.scratch / f"{s:05d}.{name}").open("wb"))
                   for name, _ in self._PARTS for s in range(num_shards)}

  def _dtype(self, name: str) -> np.dtype:
    return np.dtype(dict(self._PARTS)[name] or self.dtype)

  def add(self, shard: int, tokens, sentence_lengths, document_sentences) -> None:
    """Appends documents to a shard: their tokens, the length of each of their sentences,
    and the number of sentences of each document."""
    arrays = {"tokens": tokens, "sentence_lengths": sentence_lengths,
              "document_sentences": document_sentences}
    for name, values in arrays.items():
      values = np.asarray(values)
      self._files[name, shard].write(values.astype(self._dtype(name).newbyteorder("<"),
                                                   copy=False).tobytes())
      self.counts[name][shard] += len(values)
    self.shard_documents[shard] += len(arrays["document_sentences"])

  def close(self) -> None:
    self._stack.close()
    self._files = {}

  def _chunks(self, name: str):
    """The scratch values of `name`, shard after shard, in chunks."""
    dtype = self._dtype(name).newbyteorder("<")
    for s in range(self.num_shards):
      with (self.scratch / f"{s:05d}.{name}").open("rb") as f:
        while chunk := f.read(_CHUNK * dtype.itemsize):
          yield np.frombuffer(chunk, dtype)

  def _write(self, file_name: str, dtype, length: int, chunks) -> None:
    with (fileio.path(self.output_dir) / file_name).open("wb") as f:
      f.write(_npy_header(dtype, length))
      for chunk in chunks:
        f.write(chunk.astype(np.dtype(dtype).newbyteorder("<"), copy=False).tobytes())

  def _starts(self, name: str):
    """[0, cumsum(values)...] of a scratch array, streamed."""
    yield np.zeros(1, np.int64)
    offset = 0
    for chunk in self._chunks(name):
      yield offset + np.cumsum(chunk, dtype=np.int64)
      offset += int(chunk.sum(dtype=np.int64))

  def finish(self) -> list[int]:
    """Writes the final arrays, removes the scratch files; returns shard_documents."""
    self.close()
    self._write(TOKENS, self.dtype, sum(self.counts["tokens"]), self._chunks("tokens"))
    self._write(SENTENCES, np.int64, sum(self.counts["sentence_lengths"]) + 1,
                self._starts("sentence_lengths"))
    self._write(DOCUMENTS, np.int64, sum(self.counts["document_sentences"]) + 1,
                self._starts("document_sentences"))
    self.discard()
    return list(self.shard_documents)

  def discard(self) -> None:
    self.close()
    if self.scratch.exists():
      self.scratch.rmtree()


class FormatError(errors.UserError, ValueError):
  """A prepared directory of another format than this version reads."""


def check_format(prepared_dir: str, summary: dict) -> None:
  """Refuses a directory of another format, with the command that converts it."""
  version = summary.get("format_version", 1)
  if version == FORMAT_VERSION:
    return
  if version == 1:
    raise FormatError(
        f"{prepared_dir} holds a prepared corpus of the first format (TFRecord files), "
        "which is no longer read: the corpus is now stored as memory-mapped arrays. "
        "Convert it (token ids are copied, nothing is tokenized again) with `python -m "
        f"input_pipeline.prepare --convert={prepared_dir} --output_dir=NEW_DIR` and use "
        "NEW_DIR, or delete the directory to prepare it again.")
  raise FormatError(f"{prepared_dir} has format_version {version}, which this version of "
                   f"bert_jax does not read (it reads {FORMAT_VERSION}): update bert_jax.")


def _cache_root(cache_dir: str | None) -> str:
  return cache_dir or os.environ.get(_CACHE_ENV) or os.path.join(
      tempfile.gettempdir(), "bert_jax_corpus_cache")


def _local_copy(prepared_dir: str, summary: dict, cache_dir: str | None) -> str:
  """A local directory holding the arrays of a remote prepared corpus (copied once).

  The cache key is the directory, its summary's creation stamp and the file sizes, so a
  corpus prepared again is copied again. Each file is copied to a temporary name and
  renamed (atomic on a local disk), so processes sharing a machine never read a partial
  copy.
  """
  remote = fileio.path(prepared_dir)
  sizes = {name: (remote / name).stat().length for name in FILES}
  key = hashlib.sha256(json.dumps([prepared_dir.rstrip("/"), summary.get("created"), sizes],
                                  sort_keys=True).encode()).hexdigest()[:16]
  local = os.path.join(_cache_root(cache_dir), key)
  os.makedirs(local, exist_ok=True)
  for name, size in sizes.items():
    target = os.path.join(local, name)
    if os.path.exists(target) and os.path.getsize(target) == size:
      continue
    fd, tmp = tempfile.mkstemp(dir=local, prefix=name + ".")
    try:
      with os.fdopen(fd, "wb") as out, (remote / name).open("rb") as src:
        while chunk := src.read(64 << 20):
          out.write(chunk)
      os.replace(tmp, target)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
  return local


def open_arrays(prepared_dir: str, summary: dict, cache_dir: str | None = None) -> dict:
  """{"tokens", "sentence_starts", "document_starts"}: read-only views of memory maps."""
  check_format(prepared_dir, summary)
  local = _local_copy(prepared_dir, summary, cache_dir) if fileio.is_remote(
      prepared_dir) else prepared_dir
  out = {}
  for key, name in zip(("tokens", "sentence_starts", "document_starts"), FILES):
    path = fileio.path(local) / name
    if not path.exists():
      raise FileNotFoundError(f"{fileio.join(prepared_dir, name)} is missing: the prepared "
                              "corpus is incomplete. Run prepare again.")
    try:
      # A plain ndarray view of the map: np.memmap's subclass hooks would run on every
      # slice and scalar read of the pairing loop (a 15% slower pipeline).
      out[key] = np.asarray(np.load(os.fspath(path), mmap_mode="r"))
    except (OSError, ValueError) as e:
      raise ValueError(f"{fileio.join(prepared_dir, name)} is damaged or incomplete ({e}). "
                       "Run prepare again.") from e
  expected = {"tokens": summary["tokens"], "sentence_starts": summary["sentences"] + 1,
              "document_starts": summary["documents"] + 1}
  for key, length in expected.items():
    if len(out[key]) != length:
      raise ValueError(f"{prepared_dir}: {key} has {len(out[key]):,} entries where its "
                       f"summary.json says {length:,}: the files are damaged or from "
                       "another run. Run prepare again.")
  return out
