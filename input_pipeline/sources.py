"""Corpus files of records, one document a record: JSON Lines, Parquet, Arrow.

Which reader a file gets comes from its name (case-insensitive; a compression suffix, .gz
or .zst, is taken off first and the bytes decompressed by fileio.open_read):
  .jsonl, .ndjson, .json  JSON Lines: one object per line (C4's .json.gz, The Pile's
                          .jsonl.zst, OSCAR's .jsonl.gz); a file whose first non-blank
                          character is "[" is one JSON array of objects instead (read whole);
  .parquet                Parquet (Wikipedia, FineWeb on the HuggingFace Hub), a batch of
                          rows at a time, only the text column;
  .arrow                  Arrow IPC streams (or files): the files of a HuggingFace `datasets`
                          directory (`Dataset.save_to_disk`);
  anything else           plain text (text.py), .txt.gz and .txt.zst included.
A directory matched by an input pattern is read as a `datasets` directory when it holds
state.json (its .arrow files in the order listed); a DatasetDict's directory
(dataset_dict.json) is refused with its splits named, so that the user picks one.

A record's `text_field` (default "text") is read as a text file holding that string would be
(text.text_documents, with the same --format): in prose one document, its blank lines
ending paragraphs and its single newlines hard wraps; in BERT's one-sentence-per-line
format a line is a sentence and a blank line ends a document. A record whose text is blank
gives no document.

Bad records. The first record of a JSON file is checked strictly: when it is not JSON, not
an object or lacks the field, the file or --text_field is wrong, and the error says so and
lists the record's fields (Parquet and Arrow check their schema instead). Any other record
that is not valid JSON, lacks the field, or holds something other than a string there (null
included) is an error naming the file and the record (a JSON Lines file's line number; the
row number of the others), unless `max_bad_records` allows skipping it: the corpus's skipped
records are counted in stats["bad_records"] and each file with any is named in a warning. A
damaged compressed stream, Parquet or Arrow file is always an error naming the file and the
last record read whole.
"""
from __future__ import annotations

import io
import json
import os
import sys
from typing import Any, Callable, Iterable, Iterator

from absl import logging

from common import errors
from common import fileio
from input_pipeline import text as text_lib

RECORD_KINDS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".parquet": "parquet",
                ".arrow": "arrow"}
_BATCH_ROWS = 1024  # Parquet / Arrow rows converted to Python at a time
_SHOWN_FIELDS = 20


class BadRecordError(errors.UserError, ValueError):
  """A record of a corpus file holds no usable text (or the file is of another kind)."""


class DamagedFileError(errors.UserError, ValueError):
  """A corpus file cannot be read to its end: a damaged compressed stream or container."""


def record_kind(path: str | os.PathLike) -> str | None:
  """"json", "parquet" or "arrow" from the file name (see module doc); None: plain text."""
  name = os.fspath(path).lower()
  for suffix in fileio.COMPRESSIONS:
    if name.endswith(suffix):
      name = name[:-len(suffix)]
      break
  return next((kind for suffix, kind in RECORD_KINDS.items() if name.endswith(suffix)), None)


def dataset_files(directory: str) -> list[str]:
  """The .arrow files of a HuggingFace `datasets` directory (save_to_disk), in order; []
  for a directory of another kind."""
  base = directory.rstrip("/")
  splits = fileio.read_json(fileio.join(base, "dataset_dict.json"))
  if splits is not None:
    names = list(splits.get("splits", [])) if isinstance(splits, dict) else []
    example = names[0] if names else "train"
    raise errors.UserError(
        f"{base} is a HuggingFace DatasetDict with the splits {names}: give the directory of "
        f"the split to read, e.g. --input={base}/{example}.")
  state = fileio.read_json(fileio.join(base, "state.json"))
  if state is None:
    return []
  try:
    names = [entry["filename"] for entry in state["_data_files"]]
  except (KeyError, TypeError) as e:
    raise errors.UserError(f"{base}/state.json does not list the dataset's data files "
                           f"(no '_data_files' entry: {e!r}): is it a directory written by "
                           "datasets' save_to_disk?") from e
  if not names:
    raise errors.UserError(f"{base}/state.json lists no data files: the dataset is empty.")
  return [fileio.join(base, name) for name in names]


class _Records:
  """Counts a file's records and bad ones against the corpus's allowance."""

  def __init__(self, path: str, text_field: str, stats: dict, max_bad_records: int,
               fmt: str):
    self.path, self.field, self.stats, self.max_bad = path, text_field, stats, max_bad_records
    self.fmt = fmt
    self.count, self.bad = 0, 0

  def documents(self, value: Any, where: str, strict: bool = False) -> list[dict]:
    """The documents of a parsed record, none for a blank one or a skipped bad one."""
    if not isinstance(value, dict):
      return self.reject(where, f"is a JSON {type(value).__name__}, not an object", strict)
    if self.field not in value:
      fields = sorted(map(str, value))
      shown = fields[:_SHOWN_FIELDS] + (["..."] if len(fields) > _SHOWN_FIELDS else [])
      return self.reject(where, f"has no field {self.field!r} (its fields: {shown})", strict)
    return self.text(value[self.field], where)

  def text(self, value: Any, where: str) -> list[dict]:
    if not isinstance(value, str):
      kind = "null" if value is None else type(value).__name__
      return self.reject(where, f"holds {kind} in field {self.field!r}, not a string")
    return text_lib.text_documents(value, self.fmt)

  def reject(self, where: str, problem: str, strict: bool = False) -> list[dict]:
    if strict:
      raise BadRecordError(
          f"{self.path}: {where} {problem}. The first record decides whether a file can be "
          "read: check that the file is what its name says and that --text_field names the "
          "field holding the text (the training job: --config.build.text_field).")
    self.bad += 1
    self.stats["bad_records"] += 1
    if self.stats["bad_records"] > self.max_bad:
      raise BadRecordError(
          f"{self.path}: {where} {problem}. Fix or remove the record, or allow skipping a "
          f"few with --max_bad_records=N (now {self.max_bad}; the training job: "
          "--config.build.max_bad_records).")
    return []

  def warn(self) -> None:
    if self.bad:
      logging.warning("%s: skipped %d bad records of %d (%d in the corpus so far, "
                      "--max_bad_records=%d).", self.path, self.bad, self.count,
                      self.stats["bad_records"], self.max_bad)


def _json_documents(path: str, records: _Records, max_replaced_fraction: float
                    ) -> Iterator[dict]:
  lines = text_lib.read_lines(path, records.stats, max_replaced_fraction)
  first = True
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    if first and line.lstrip().startswith("["):  # one JSON array, not JSON Lines
      yield from _json_array(path, "\n".join([line, *lines]), records)
      return
    records.count += 1
    where = f"line {number}"
    try:
      value = json.loads(line)
    except ValueError as e:
      docs = records.reject(where, f"is not valid JSON ({e})", strict=first)
    else:
      docs = records.documents(value, where, strict=first)
    first = False
    yield from docs


def _json_array(path: str, content: str, records: _Records) -> Iterator[dict]:
  try:
    values = json.loads(content)
  except ValueError as e:
    raise BadRecordError(f"{path}: starts with '[' but is not one valid JSON array ({e}). "
                         "A JSON Lines file has one object per line.") from e
  if not isinstance(values, list):
    raise BadRecordError(f"{path}: holds a JSON {type(values).__name__}, not an array of "
                         "records or one record per line.")
  for number, value in enumerate(values, 1):
    records.count += 1
    yield from records.documents(value, f"record {number}", strict=number == 1)


def _column_documents(batches: Iterable[Any], records: _Records) -> Iterator[dict]:
  """Documents of the text column of Arrow record batches (one column each)."""
  import pyarrow.compute as pc  # pylint: disable=g-import-not-at-top
  for batch in batches:
    column = batch.column(0)
    records.stats["bytes"] += int(pc.sum(pc.binary_length(column)).as_py() or 0)
    for value in column.to_pylist():
      records.count += 1
      yield from records.text(value, f"row {records.count}")


def _check_column(path: str, schema: Any, field: str) -> None:
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  if field not in schema.names:
    raise BadRecordError(f"{path}: has no column {field!r} (its columns: {schema.names}); "
                         "set --text_field (the training job: --config.build.text_field).")
  kind = schema.field(field).type
  if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
    raise BadRecordError(f"{path}: column {field!r} holds {kind}, not strings; set "
                         "--text_field to the column holding the text.")


def _parquet_documents(path: str, f: Any, records: _Records) -> Iterator[dict]:
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  parquet = pq.ParquetFile(f)
  _check_column(path, parquet.schema_arrow, records.field)
  yield from _column_documents(
      parquet.iter_batches(batch_size=_BATCH_ROWS, columns=[records.field]), records)


def _arrow_documents(path: str, f: Any, records: _Records) -> Iterator[dict]:
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  try:
    reader = pa.ipc.open_stream(f)  # what datasets' save_to_disk writes
  except pa.ArrowInvalid:
    f.seek(0)
    reader = pa.ipc.open_file(f)
    batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
  else:
    batches = iter(reader)
  _check_column(path, reader.schema, records.field)
  index = reader.schema.get_field_index(records.field)
  yield from _column_documents((b.select([index]) for b in batches), records)


class _RandomAccess(io.RawIOBase):
  """A seekable binary file as pyarrow wants one: the path layer's gs:// file object
  (TensorFlow's GFile) has no `closed` attribute, which pyarrow reads before every call."""

  def __init__(self, f: Any):
    super().__init__()
    self._f = f

  def readable(self) -> bool:
    return True

  def seekable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    data = self._f.read(len(buffer))
    buffer[:len(data)] = data
    return len(data)

  def read(self, size: int = -1) -> bytes:
    return self._f.read(size)

  def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
    self._f.seek(offset, whence)
    return self._f.tell()

  def tell(self) -> int:
    return self._f.tell()


def _container_documents(path: str, kind: str, records: _Records) -> Iterator[dict]:
  if fileio.compression(path):
    raise errors.UserError(f"{path}: compressed {kind.capitalize()} files are not read "
                           "(their format compresses inside): decompress it first.")
  with fileio.path(path).open("rb") as f:
    read = _parquet_documents if kind == "parquet" else _arrow_documents
    yield from read(path, _RandomAccess(f), records)


def _read_errors() -> tuple[type[BaseException], ...]:
  """Damaged compressed streams; damaged Parquet / Arrow when pyarrow is in use (it is
  imported only for those files)."""
  arrow = sys.modules.get("pyarrow")
  return fileio.decompression_errors() + ((arrow.ArrowException,) if arrow else ())


def guarded(path: str, docs: Iterator[dict], count: Callable[[], str]) -> Iterator[dict]:
  """`docs` with a damaged file's errors turned into DamagedFileError naming the file and
  `count()` (how far reading got)."""
  try:
    yield from docs
  except _read_errors() as e:
    raise DamagedFileError(
        f"{path}: damaged after {count()} ({type(e).__name__}: {e}). Download or write it "
        "again, or leave it out of --input.") from e


def iter_record_documents(path: str, kind: str, *, text_field: str, stats: dict,
                          max_bad_records: int = 0,
                          max_replaced_fraction: float = text_lib.MAX_REPLACED_FRACTION,
                          fmt: str = "auto") -> Iterator[dict]:
  """The documents of one record file of `kind` (record_kind); see module doc."""
  records = _Records(path, text_field, stats, max_bad_records, fmt)
  if kind == "json":
    docs = _json_documents(path, records, max_replaced_fraction)
  elif kind in ("parquet", "arrow"):
    docs = _container_documents(path, kind, records)
  else:
    raise ValueError(f"Unknown record file kind {kind!r}.")
  yield from guarded(path, docs, lambda: f"{records.count} records")
  records.warn()
