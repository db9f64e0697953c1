"""Sentence(-pair) classification data: GLUE TSV files, TFDS glue/*, custom CSV/TSV/JSONL.

Every reader yields `Example(guid, text_a, text_b, label, line)`; `encode_examples`
turns them into fixed-shape numpy features `[CLS] a [SEP] (b [SEP])`. Bad files are
`DataError`s / `MissingDataError`s naming the file and line: an empty file, a label
outside the task's (or the declared) label set, a label seen once (`label_set`).
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import gzip
import io
import sys
import zlib
from typing import Iterable, Sequence

from absl import logging
import numpy as np

from common import errors
from common import fileio
from input_pipeline import records
from input_pipeline import features
from input_pipeline import text as text_lib

csv.field_size_limit(sys.maxsize)


class DataError(errors.UserError, ValueError):
  """A task's data file cannot be used as it is: the message names the file (and line)."""


class MissingDataError(errors.UserError, FileNotFoundError):
  """A task's data file is not where the config says."""


@dataclasses.dataclass(frozen=True)
class Example:
  guid: str
  text_a: str
  text_b: str | None
  label: str | float | None  # None on unlabelled test sets
  line: int = 0  # where the record starts in its file (1-based); 0 when not from a file


def where(path: str, ex: Example) -> str:
  """`path:line` of an example for messages (`path (example guid)` without a line)."""
  return f"{path}:{ex.line}" if ex.line else f"{path} (example {ex.guid})"


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Where a GLUE task's fields live and how it is scored."""
  name: str
  text_a: str | int  # header name, or column index when the file has no header
  text_b: str | int | None
  label: str | int | None
  labels: tuple[str, ...] | None  # None: regression
  metrics: tuple[str, ...]
  splits: dict[str, str]  # split -> file name in the task directory
  header: bool = True
  test_text_a: str | int | None = None  # the test files of some tasks differ
  submission_name: str = ""


GLUE = {t.name: t for t in [
    TaskSpec("cola", 3, None, 1, ("0", "1"), ("mcc", "accuracy"),
             {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, header=False,
             test_text_a="sentence", submission_name="CoLA"),
    TaskSpec("sst2", "sentence", None, "label", ("0", "1"), ("accuracy",),
             {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, submission_name="SST-2"),
    TaskSpec("mrpc", "#1 String", "#2 String", "Quality", ("0", "1"), ("f1", "accuracy"),
             {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, submission_name="MRPC"),
    TaskSpec("stsb", "sentence1", "sentence2", "score", None, ("pearson", "spearman"),
             {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, submission_name="STS-B"),
    TaskSpec("qqp", "question1", "question2", "is_duplicate", ("0", "1"), ("f1", "accuracy"),
             {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, submission_name="QQP"),
    TaskSpec("mnli", "sentence1", "sentence2", "gold_label", ("contradiction", "entailment", "neutral"),
             ("accuracy",), {"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv",
                             "dev_mismatched": "dev_mismatched.tsv", "test_mismatched": "test_mismatched.tsv"},
             submission_name="MNLI-m"),
    TaskSpec("qnli", "question", "sentence", "label", ("entailment", "not_entailment"), ("accuracy",),
             {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, submission_name="QNLI"),
    TaskSpec("rte", "sentence1", "sentence2", "label", ("entailment", "not_entailment"), ("accuracy",),
             {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, submission_name="RTE"),
    TaskSpec("wnli", "sentence1", "sentence2", "label", ("0", "1"), ("accuracy",),
             {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, submission_name="WNLI"),
]}
# The CoLA public release names its files differently from the GLUE copy.
_COLA_RAW = {"train": "in_domain_train.tsv", "dev": "in_domain_dev.tsv"}


def read_task_text(path: str, missing: str = "") -> str:
  """A task file's text, as spreadsheets and scripts save it: UTF-8 (with or without the
  BOM Excel's "CSV UTF-8" writes), UTF-16 with its BOM, or gzip-compressed (any name).
  `missing`: what to do when the file is absent. A UTF-16 file without BOM is a DataError;
  bytes that are not UTF-8 are replaced by U+FFFD, and the file and first line are logged."""
  if not fileio.path(path).exists():
    raise MissingDataError(f"{path} does not exist{': ' + missing if missing else '.'}")
  data = fileio.path(path).read_bytes()
  if data[:2] == b"\x1f\x8b":
    try:
      data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
      raise DataError(f"{path} is a gzip file that does not decompress ({e}): copy it again, "
                      "or give the uncompressed file.") from None
  if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
    try:
      return data.decode("utf-16")
    except UnicodeDecodeError as e:
      raise DataError(f"{path} starts as UTF-16 but does not decode as it ({e.reason} at byte "
                      f"{e.start}): save it again as UTF-8.") from None
  if data.count(b"\x00") > len(data) // 4:
    raise DataError(f"{path} holds NUL bytes in every other position: it looks like UTF-16 "
                    "without a byte-order mark; save it as UTF-8 (or UTF-16 with its BOM).")
  text = data.decode("utf-8-sig", errors="replace")
  bad = text.count("\ufffd") - data.decode("utf-8-sig", errors="ignore").count("\ufffd")
  if bad:
    line = text[:text.index("\ufffd")].count("\n") + 1
    logging.warning("%s: %d bytes are not UTF-8 (the first on line %d) and read as U+FFFD: save "
                    "the file as UTF-8 to keep those characters.", path, bad, line)
  return text


def _rows(path: str, delimiter: str, quotechar: str | None = None,
          missing: str = "") -> list[tuple[int, list[str]]]:
  """(line where the row starts, fields) of every row of a CSV / TSV file."""
  text = read_task_text(path, missing)
  # GLUE TSVs hold bare quotes inside sentences: read them unquoted, as the original.
  reader = csv.reader(io.StringIO(text), delimiter=delimiter, quotechar=quotechar,
                      quoting=csv.QUOTE_MINIMAL if quotechar else csv.QUOTE_NONE)
  rows, start = [], 1
  try:
    for row in reader:
      rows.append((start, row))
      start = reader.line_num + 1
  except csv.Error as e:
    raise DataError(f"{path}:{start}: not a readable {'TSV' if delimiter == chr(9) else 'CSV'} "
                    f"row ({e}).") from None
  return rows


def _no_examples(path: str) -> DataError:
  return DataError(f"{path} holds no examples (an empty file, or a header and no rows): "
                   "every input file needs at least one labelled row.")


def _col(row: list[str], header: dict[str, int] | None, key: str | int, path: str) -> str:
  index = key if isinstance(key, int) else (header or {}).get(key)
  if index is None:
    raise DataError(f"{path}: no column {key!r}; columns are {sorted(header or {})}.")
  return row[index]


def read_glue(task: str, data_dir: str, split: str) -> list[Example]:
  """Reads one split of a GLUE task from the original TSV files."""
  if task not in GLUE:
    raise DataError(f"Unknown GLUE task {task!r}; choose one of {sorted(GLUE)}.")
  spec = GLUE[task]
  name = spec.splits.get(split)
  if name is None:
    raise DataError(f"{task} has no split {split!r}; it has {sorted(spec.splits)}.")
  names = [name] + ([_COLA_RAW[split]] if task == "cola" and split in _COLA_RAW else [])
  paths = [data_dir.rstrip("/") + "/" + n for n in names]  # the CoLA 1.1 release layout second
  path = next((p for p in paths if fileio.path(p).exists()), None)
  if path is None:
    raise MissingDataError(
        (f"{paths[0]} does not exist: " if len(paths) == 1 else
         f"Neither {paths[0]} nor {paths[1]} exists: ") +
        f"point data_dir at the {task} directory as distributed by GLUE (train.tsv, dev.tsv, "
        "test.tsv)" + (" or by the CoLA 1.1 release (in_domain_train.tsv, in_domain_dev.tsv)."
                       if len(paths) > 1 else "."))
  return read_glue_file(task, path, split)


_SKIPPED: dict[str, int] = {}  # path -> malformed rows skipped when this process read it


def skipped_rows(paths: Iterable[str] | None = None) -> dict[str, int]:
  """The malformed rows `read_glue_file` skipped, per file this process read (of `paths`
  only, when given): what the suite's report shows beside each task."""
  return {p: n for p, n in _SKIPPED.items() if paths is None or p in paths}


def read_glue_file(task: str, path: str, split: str) -> list[Example]:
  """Reads one GLUE TSV file laid out as `task`'s `split` ("test*": no labels; e.g. the
  diagnostic set AX, read as MNLI's test)."""
  spec = GLUE[task]
  header_flag = spec.header
  is_test = split.startswith("test")
  if task == "cola" and is_test:
    header_flag = True
  rows = _rows(path, "\t")
  if not rows:
    raise _no_examples(path)
  header = {h: i for i, h in enumerate(rows[0][1])} if header_flag else None
  rows = rows[1:] if header_flag else rows
  text_a = spec.test_text_a if is_test and spec.test_text_a is not None else spec.text_a
  examples, malformed = [], []
  for i, (line, row) in enumerate(rows):
    if not row or all(not c for c in row):
      continue
    guid = row[header["index"]] if header and "index" in header else str(i)
    try:
      a = _col(row, header, text_a, path)
      b = _col(row, header, spec.text_b, path) if spec.text_b is not None else None
      label = None if is_test else _col(row, header, spec.label, path)
    except IndexError:
      malformed.append(line)  # A handful of QQP/MNLI rows are malformed in the release; the
      continue  # original skips them: so do we, and say how many.
    if label is not None and spec.labels is None:
      try:
        label = float(label)
      except ValueError:
        raise DataError(f"{path}:{line}: score {label!r} is not a number ({task} is a regression "
                        "task): fix or remove the line.") from None
    elif label is not None and all(l.isdigit() for l in spec.labels):
      label = canonical_label(label)  # "1.0" (a spreadsheet's float column) is label "1"
    if spec.labels is not None and label is not None and label not in spec.labels:
      raise DataError(f"{path}:{line}: label {label!r} is not one of {list(spec.labels)}, the "
                      f"labels of {task}: fix or remove the line.")
    examples.append(Example(guid, a, b, label, line))
  _SKIPPED[path] = len(malformed)
  if malformed:
    shown = ", ".join(map(str, malformed[:5])) + (", ..." if len(malformed) > 5 else "")
    logging.warning("%s: skipped %d malformed rows (columns missing; lines %s), as the original "
                    "BERT code does; %d examples read.", path, len(malformed), shown,
                    len(examples))
  if not examples:
    raise _no_examples(path)
  return examples


def read_tfds_glue(task: str, split: str, data_dir: str | None = None,
                   name: str | None = None) -> list[Example]:
  """GLUE from a locally prepared TFDS copy (`glue/<task>`, or `name`); never downloads."""
  name = name or f"glue/{task}"
  tfds = records.tensorflow_datasets(f"GLUE's {task} from TFDS ({name}; data_dir=tfds)")
  split = {"dev": "validation", "dev_mismatched": "validation_mismatched"}.get(split, split)
  try:
    ds = tfds.load(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise MissingDataError(f"TFDS {name} is not prepared locally under {data_dir or '~/tensorflow_datasets'} "
                           f"({e}); prepare it on a machine with network, or use the GLUE TSV files.") from e
  spec = GLUE[task]
  keys = {"cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
          "stsb": ("sentence1", "sentence2"), "qqp": ("question1", "question2"),
          "mnli": ("premise", "hypothesis"), "qnli": ("question", "sentence"),
          "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2")}[task]
  out = []
  for ex in tfds.as_numpy(ds):
    a = ex[keys[0]].decode()
    b = ex[keys[1]].decode() if keys[1] else None
    raw = ex["label"]
    label = None if raw == -1 else (float(raw) if spec.labels is None else str(_tfds_label(task, int(raw))))
    out.append(Example(str(ex["idx"]), a, b, label))
  if not out:
    raise DataError(f"TFDS {name} split {split!r} under {data_dir or '~/tensorflow_datasets'} holds "
                    "no examples: prepare it again.")
  return out


def _tfds_label(task: str, index: int) -> str:
  # TFDS orders MNLI labels entailment/neutral/contradiction; GLUE TSVs use names.
  if task == "mnli":
    return ("entailment", "neutral", "contradiction")[index]
  if task in ("qnli", "rte"):
    return ("entailment", "not_entailment")[index]
  return str(index)


def read_custom(path: str, text_a: str, label: str, text_b: str | None = None) -> list[Example]:
  """A user's own classification file: .csv, .tsv (with a header) or .jsonl. Each example
  keeps the line it starts on; a file without rows is a DataError naming it. Numeric labels
  are compared as numbers (`1` and `1.0`, as pandas writes once a column held NaN, are one
  class: `canonical_label`); a text that is null or not a string is a DataError."""
  records = read_records(path)
  out = []
  for i, (line, r) in enumerate(records):
    for key in (text_a, label) + ((text_b,) if text_b else ()):
      if key not in r:
        raise DataError(f"{path}:{line}: record {i} has no field {key!r}; fields are {sorted(r)}. "
                        "Set text_a_column / text_b_column / label_column in the config.")
    texts = [text_field(r, key, path, line) for key in (text_a, text_b) if key]
    out.append(Example(str(i), texts[0], texts[1] if text_b else None,
                       None if r[label] in (None, "") else canonical_label(r[label]), line))
  return out


def read_records(path: str) -> list[tuple[int, dict]]:
  """(line, {field: value}) of each record of a .csv / .tsv file (with a header) or a .jsonl
  (.json) file, optionally .gz; a file without records, or a row with more or fewer fields
  than its header, is a DataError naming it (and the row)."""
  kind = path.removesuffix(".gz")
  if kind.endswith(".jsonl") or kind.endswith(".json"):
    records = list(text_lib.json_objects(read_task_text(path).split("\n"), path, DataError))
  else:
    rows = (_rows(path, "\t") if kind.endswith(".tsv") else _rows(path, ",", quotechar='"'))
    header = rows[0][1] if rows else []
    for line, r in rows[1:]:
      if r and len(r) != len(header):  # a field short (a column missing) or over (cut)
        raise DataError(f"{path}:{line}: {len(r)} field{'s' if len(r) > 1 else ''} where the "
                        f"header has {len(header)} ({', '.join(header)}): every row needs one "
                        "field a column; fix or remove the row.")
    records = [(line, dict(zip(header, r))) for line, r in rows[1:] if r]
  if not records:
    raise _no_examples(path)
  return records


def text_field(record: dict, key: str, path: str, line: int) -> str:
  """record[key] as a text; null or not a string is a DataError naming the file and line."""
  value = record[key]
  if isinstance(value, str):
    return value
  if value is None:
    raise DataError(f"{path}:{line}: field {key!r} is null: every row needs its text (fix or "
                    "remove the row).")
  raise DataError(f"{path}:{line}: field {key!r} holds {type(value).__name__} {value!r}, not a "
                  "text: put the text in quotes (a JSON string), or fix the row.")


def canonical_label(label) -> str:
  """A class label as a name. Numbers are named by value, integral ones as integers: the
  labels `1`, `1.0` and `1.00` (JSON 1 or 1.0, pandas' float columns) are one class "1"."""
  if isinstance(label, bool):
    return str(label).lower()
  text = str(label).strip() if isinstance(label, (int, float)) else str(label)
  try:
    value = float(text)
  except ValueError:
    return text
  if np.isfinite(value) and value == int(value):
    return str(int(value))
  return text


def truncate_pair(a: list[int], b: list[int] | None, max_tokens: int) -> None:
  """In place: drop from the end of the longer sequence until they fit (original BERT)."""
  while len(a) + len(b or []) > max_tokens:
    (a if not b or len(a) > len(b) else b).pop()


def encode_examples(examples: Sequence[Example], tokenizer, max_seq_length: int,
                    labels: Sequence[str] | None) -> dict[str, np.ndarray]:
  """[CLS] a [SEP] (b [SEP]), padded to max_seq_length; labels as ids (or floats)."""
  n = len(examples)
  ids = np.zeros((n, max_seq_length), np.int32)
  segs = np.zeros_like(ids)
  mask = np.zeros_like(ids)
  label_index = {l: i for i, l in enumerate(labels)} if labels is not None else None
  y = np.zeros((n,), np.int32 if labels is not None else np.float32)
  a_ids = tokenizer.encode_batch([e.text_a for e in examples])
  b_ids = tokenizer.encode_batch([e.text_b or "" for e in examples])
  for i, ex in enumerate(examples):
    a, b = list(a_ids[i]), (list(b_ids[i]) if ex.text_b is not None else None)
    truncate_pair(a, b, max_seq_length - features.special_count(tokenizer, b is not None))
    tokens, seg = features.encode_pair(tokenizer, a, b)
    ids[i, :len(tokens)], segs[i, :len(tokens)], mask[i, :len(tokens)] = tokens, seg, 1
    if ex.label is not None:
      if label_index is None:
        y[i] = float(ex.label)
      elif str(ex.label) not in label_index:
        raise ValueError(f"Example {ex.guid}: label {ex.label!r} is not one of {list(labels)}.")
      else:
        y[i] = label_index[str(ex.label)]
  return {"input_ids": ids, "segment_ids": segs, "input_mask": mask, "labels": y}


def infer_labels(examples: Iterable[Example]) -> tuple[str, ...]:
  return tuple(sorted({str(e.label) for e in examples if e.label is not None}))


def label_counts(examples: Iterable[Example]) -> dict[str, int]:
  """Label -> number of examples, in label order."""
  return dict(sorted(collections.Counter(str(e.label) for e in examples
                                         if e.label is not None).items()))


def parse_labels(declared) -> tuple[str, ...]:
  """A declared label set as names: a list/tuple of labels, or one comma-separated string
  (`--config.labels=neg,pos` arrives as ("neg,pos",)); empty = none declared."""
  if isinstance(declared, str):
    declared = (declared,)
  declared = tuple(declared or ())
  if len(declared) == 1 and isinstance(declared[0], str):
    declared = tuple(declared[0].split(","))
  return tuple(canonical_label(s) for s in (str(x).strip() for x in declared) if s)


def _require_labels(examples: Sequence[Example], path: str) -> None:
  for ex in examples:
    if ex.label is None:
      raise DataError(f"{where(path, ex)}: no label: every row of a fine-tuning file needs one "
                      "(fix or remove the row).")


def check_labels(examples: Sequence[Example], labels: Sequence[str], path: str,
                 what: str = "") -> None:
  """Every example of `path` has a label in `labels`; else a DataError naming file and line.
  `what` says where `labels` came from (for the message)."""
  _require_labels(examples, path)
  for ex in examples:
    if str(ex.label) not in labels:
      raise DataError(f"{where(path, ex)}: label {ex.label!r} is not one of "
                      f"{what + ' ' if what else ''}{list(labels)}: fix or remove the row"
                      + (", or add the label to --config.labels." if what else "."))


def label_set(train: Sequence[Example], declared, path: str) -> tuple[str, ...]:
  """The classes of a custom classification task, in order: `declared` (config.labels:
  names or a comma-separated string), every training label in it; or, when none are
  declared, the sorted labels of the training file `path`, each seen at least twice (a
  label seen once is most likely a typo that would add a class)."""
  declared = parse_labels(declared)
  if declared:
    if len(set(declared)) != len(declared):
      raise DataError(f"config.labels={','.join(declared)} names a label twice.")
    if len(declared) < 2:
      raise DataError(f"config.labels={','.join(declared)}: a classifier needs at least two labels.")
    check_labels(train, declared, path, what="the declared labels")
    return declared
  _require_labels(train, path)
  counts = label_counts(train)
  once = [l for l, n in counts.items() if n == 1]
  if once:
    ex = next(e for e in train if str(e.label) == once[0])
    raise DataError(f"{where(path, ex)}: label {ex.label!r} appears only once in the training file "
                    f"(label counts {counts}): fix the row if it is a typo; if it is a real class, "
                    f"declare the classes with --config.labels (e.g. {','.join(counts)}).")
  if len(counts) < 2:
    raise DataError(f"{path}: every row has the label {next(iter(counts))!r}: a classifier needs at "
                    "least two labels.")
  return tuple(counts)
