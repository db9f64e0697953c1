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
np.load(mmap_mode="r"), so a host pages in only the documents it reads. A memory map needs
a local file: of a gs:// corpus, a host copies the byte ranges of its own documents (its
shards, and the held-out documents) into sparse files of a local cache directory
($BERT_JAX_CORPUS_CACHE, default /tmp/bert_jax_corpus_cache), once per machine and reused
while the summary's "created" stamp and the file sizes match; the copy is local, so the
cache uses the local file system directly (a lock file, sparse files, a rename). Or mount
the bucket (gcsfuse) and give the mounted path.

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

from common import errors
from common import fileio

FORMAT_VERSION = 2
TOKENS, SENTENCES, DOCUMENTS = "tokens.npy", "sentence_starts.npy", "document_starts.npy"
FILES = (TOKENS, SENTENCES, DOCUMENTS)
SCRATCH = "scratch"
_CHUNK = 1 << 22  # Elements per streamed copy.
_CACHE_ENV = "BERT_JAX_CORPUS_CACHE"
_GAP = 1 << 20  # Bytes: ranges of a remote file closer than this are copied as one.


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

  def close(self) -> None:
    self._stack.close()
    self._files = {}

  def _chunks(self, name: str):
    """The scratch values of `name`, shard after shard, in chunks."""
    dtype = self._dtype(name).newbyteorder("<")
    for s in range(self.num_shards):
      if not self.counts[name][s]:
        continue  # an empty file may not exist: gs:// writes none for an empty object
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
      starts = offset + np.cumsum(chunk, dtype=np.int64)
      offset = int(starts[-1])
      yield starts

  def finish(self) -> list[int]:
    """Writes the final arrays, removes the scratch files; returns shard_documents."""
    self.close()
    self._write(TOKENS, self.dtype, sum(self.counts["tokens"]), self._chunks("tokens"))
    self._write(SENTENCES, np.int64, sum(self.counts["sentence_lengths"]) + 1,
                self._starts("sentence_lengths"))
    self._write(DOCUMENTS, np.int64, sum(self.counts["document_sentences"]) + 1,
                self._starts("document_sentences"))
    self.discard()
    return list(self.counts["document_sentences"])  # Documents per shard.

  def discard(self) -> None:
    self.close()
    if self.scratch.exists():
      self.scratch.rmtree()


class FormatError(errors.UserError, ValueError):
  """A prepared directory of another format than this version reads."""


class DamagedCorpusError(errors.UserError, ValueError):
  """A prepared directory whose files are cut short, unreadable or from another run."""


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


def _merge(ranges, gap: int = 0) -> list[list[int]]:
  """Sorted [start, stop) ranges joined where they overlap or lie within `gap`."""
  out = []
  for a, b in sorted((int(a), int(b)) for a, b in ranges if b > a):
    if out and a <= out[-1][1] + gap:
      out[-1][1] = max(out[-1][1], b)
    else:
      out.append([a, b])
  return out


def _subtract(ranges, done) -> list[list[int]]:
  out = []
  for a, b in ranges:
    for c, d in done:
      if d <= a or c >= b:
        continue
      if c > a:
        out.append([a, c])
      a = max(a, d)
    if a < b:
      out.append([a, b])
  return out


class _LocalCopy:
  """A local copy of a remote prepared corpus, filled range by range (module doc).

  Each array is a sparse local file of the remote file's size; `fetch` copies the byte
  ranges a host reads (and the .npy header), and NAME.ranges.json records what is
  there, so a second loader on the machine (the eval split, another process) copies
  only what is missing. A lock file serializes the processes of one machine.
  """

  def __init__(self, prepared_dir: str, summary: dict, cache_dir: str | None):
    self.remote = fileio.path(prepared_dir)
    self.sizes = {name: (self.remote / name).stat().length for name in FILES}
    key = hashlib.sha256(json.dumps([prepared_dir.rstrip("/"), summary.get("created"),
                                     self.sizes], sort_keys=True).encode()).hexdigest()[:16]
    self.dir = os.path.join(_cache_root(cache_dir), key)
    os.makedirs(self.dir, exist_ok=True)
    self.offsets = {}

  def path(self, name: str) -> str:
    return os.path.join(self.dir, name)

  def _offset(self, name: str, src) -> tuple[int, np.dtype]:
    """(data offset, dtype) of a remote .npy file, from its header."""
    if name not in self.offsets:
      src.seek(0)
      header = io.BytesIO(src.read(4096))
      np.lib.format.read_magic(header)
      _, _, dtype = np.lib.format.read_array_header_1_0(header)
      self.offsets[name] = (header.tell(), dtype)
    return self.offsets[name]

  def fetch(self, name: str, element_ranges=None) -> None:
    """Copies the header and the given element ranges (None: all) of array `name`; a remote
    file numpy cannot read or shorter than the ranges is a DamagedCorpusError."""
    try:
      self._fetch(name, element_ranges)
    except (ValueError, EOFError) as e:
      raise DamagedCorpusError(f"{self.remote / name} is damaged or incomplete "
                               f"({str(e).rstrip('.')}). Run prepare again.") from e

  def _fetch(self, name: str, element_ranges) -> None:
    import fcntl  # pylint: disable=g-import-not-at-top  (POSIX; the cache is local)
    local, record = self.path(name), self.path(name + ".ranges.json")
    with open(os.path.join(self.dir, "LOCK"), "a") as lock, (self.remote / name).open(
        "rb") as src:
      fcntl.flock(lock, fcntl.LOCK_EX)
      offset, dtype = self._offset(name, src)
      size = self.sizes[name]
      if element_ranges is None:
        wanted = [[0, size]]
      else:
        wanted = _merge([[0, offset]] + [
            [offset + a * dtype.itemsize, offset + b * dtype.itemsize]
            for a, b in element_ranges], gap=_GAP)
      if wanted[-1][1] > size:
        raise ValueError(f"{size:,} bytes, its documents need {wanted[-1][1]:,}")
      done = []
      if os.path.exists(record):
        with open(record) as f:
          done = json.load(f)
      todo = _subtract(wanted, done)
      if not todo:
        return
      if not os.path.exists(local):
        with open(local, "wb") as f:
          f.truncate(size)  # Sparse: unfetched ranges take no disk.
      with open(local, "r+b") as dst:
        for a, b in todo:
          src.seek(a)
          dst.seek(a)
          while a < b:
            chunk = src.read(min(64 << 20, b - a))
            if not chunk:
              raise ValueError(f"{self.remote / name} ends at byte {a:,}, before its "
                               f"size {size:,}: it changed while being copied.")
            dst.write(chunk)
            a += len(chunk)
        dst.flush()
        os.fsync(dst.fileno())
      tmp = record + ".tmp"
      with open(tmp, "w") as f:
        json.dump(_merge(done + todo), f)
      os.replace(tmp, record)


def _fetch_documents(copy: _LocalCopy, positions) -> None:
  """Copies what the documents at `positions` (None: all) need of each array."""
  copy.fetch(DOCUMENTS)
  if positions is None:
    copy.fetch(SENTENCES)
    copy.fetch(TOKENS)
    return
  doc_starts = np.load(copy.path(DOCUMENTS), mmap_mode="r")
  positions = np.asarray(positions, np.int64)
  breaks = np.flatnonzero(np.diff(positions) != 1) + 1
  runs = [(int(p[0]), int(p[-1]) + 1) for p in np.split(positions, breaks) if len(p)]
  sentences = [(int(doc_starts[a]), int(doc_starts[b])) for a, b in runs]
  copy.fetch(SENTENCES, [(a, b + 1) for a, b in sentences])
  sent_start = np.load(copy.path(SENTENCES), mmap_mode="r")
  copy.fetch(TOKENS, [(int(sent_start[a]), int(sent_start[b])) for a, b in sentences])


def open_arrays(prepared_dir: str, summary: dict, cache_dir: str | None = None,
                positions=None) -> dict:
  """{"tokens", "sentence_starts", "document_starts"}: read-only views of memory maps.

  A remote corpus is copied to the local cache first: of tokens and sentence_starts only
  what the documents at `positions` (in the stored order; None: all) need. The other
  ranges of those arrays read as zeros, so read only those documents.
  """
  check_format(prepared_dir, summary)
  local = prepared_dir
  if fileio.is_remote(prepared_dir):
    copy = _LocalCopy(prepared_dir, summary, cache_dir)
    _fetch_documents(copy, positions)
    local = copy.dir
  out = {}
  for key, name in zip(("tokens", "sentence_starts", "document_starts"), FILES):
    path = fileio.path(local) / name
    if not path.is_file():
      raise errors.PathError(f"{fileio.join(prepared_dir, name)} is missing: the prepared "
                             "corpus is incomplete. Run prepare again.")
    try:
      # A plain ndarray view of the map: np.memmap's subclass hooks would run on every
      # slice and scalar read of the pairing loop (a 15% slower pipeline). Never unpickled.
      out[key] = np.asarray(np.load(os.fspath(path), mmap_mode="r", allow_pickle=False))
    except (OSError, ValueError, EOFError) as e:
      raise DamagedCorpusError(f"{fileio.join(prepared_dir, name)} is damaged or incomplete "
                               f"({str(e).rstrip('.')}). Run prepare again.") from e
  expected = {"tokens": summary["tokens"], "sentence_starts": summary["sentences"] + 1,
              "document_starts": summary["documents"] + 1}
  for key, length in expected.items():
    if len(out[key]) != length:
      raise DamagedCorpusError(f"{prepared_dir}: {key} has {len(out[key]):,} entries where "
                               f"its summary.json says {length:,}: the files are damaged or "
                               "from another run. Run prepare again.")
  return out
