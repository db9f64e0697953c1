"""Sentence(-pair) classification data: GLUE TSV files, TFDS glue/*, custom CSV/TSV/JSONL.

Every reader yields `Example(guid, text_a, text_b, label)`; `encode_examples`
turns them into fixed-shape numpy features `[CLS] a [SEP] (b [SEP])`.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import sys
from typing import Iterable, Sequence

import numpy as np

from input_pipeline import features

csv.field_size_limit(sys.maxsize)


@dataclasses.dataclass(frozen=True)
class Example:
  guid: str
  text_a: str
  text_b: str | None
  label: str | float | None  # None on unlabelled test sets


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


def _rows(path: str, delimiter: str, quotechar: str | None = None) -> list[list[str]]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (heavy: loaded only where tf.io/tf.data is used)
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"{path} does not exist: point data_dir at the task's directory "
                            "as distributed by GLUE (train.tsv, dev.tsv, test.tsv).")
  with tf.io.gfile.GFile(path, "rb") as f:
    text = f.read().decode("utf-8", errors="replace")
  # GLUE TSVs hold bare quotes inside sentences: read them unquoted, as the original.
  return list(csv.reader(io.StringIO(text), delimiter=delimiter, quotechar=quotechar,
                         quoting=csv.QUOTE_MINIMAL if quotechar else csv.QUOTE_NONE))


def _col(row: list[str], header: dict[str, int] | None, key: str | int, path: str) -> str:
  index = key if isinstance(key, int) else (header or {}).get(key)
  if index is None:
    raise ValueError(f"{path}: no column {key!r}; columns are {sorted(header or {})}.")
  return row[index]


def read_glue(task: str, data_dir: str, split: str) -> list[Example]:
  """Reads one split of a GLUE task from the original TSV files."""
  if task not in GLUE:
    raise ValueError(f"Unknown GLUE task {task!r}; choose one of {sorted(GLUE)}.")
  spec = GLUE[task]
  name = spec.splits.get(split)
  if name is None:
    raise ValueError(f"{task} has no split {split!r}; it has {sorted(spec.splits)}.")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (gs:// paths too)
  path = data_dir.rstrip("/") + "/" + name
  header_flag = spec.header
  if task == "cola" and split in _COLA_RAW and not tf.io.gfile.exists(path):
    path = data_dir.rstrip("/") + "/" + _COLA_RAW[split]  # The CoLA 1.1 release layout.
  is_test = split.startswith("test")
  if task == "cola" and is_test:
    header_flag = True
  rows = _rows(path, "\t")
  header = {h: i for i, h in enumerate(rows[0])} if header_flag else None
  rows = rows[1:] if header_flag else rows
  text_a = spec.test_text_a if is_test and spec.test_text_a is not None else spec.text_a
  examples = []
  for i, row in enumerate(rows):
    if not row or all(not c for c in row):
      continue
    guid = row[header["index"]] if header and "index" in header else str(i)
    try:
      a = _col(row, header, text_a, path)
      b = _col(row, header, spec.text_b, path) if spec.text_b is not None else None
      label = None if is_test else _col(row, header, spec.label, path)
    except IndexError:
      continue  # A handful of QQP/MNLI rows are malformed in the release; the original skips them.
    if label is not None and spec.labels is None:
      label = float(label)
    examples.append(Example(guid, a, b, label))
  if not examples:
    raise ValueError(f"{path} holds no examples.")
  return examples


def read_tfds_glue(task: str, split: str, data_dir: str | None = None,
                   name: str | None = None) -> list[Example]:
  """GLUE from a locally prepared TFDS copy (`glue/<task>`, or `name`); never downloads."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (optional: only data_dir=tfds)
  name = name or f"glue/{task}"
  split = {"dev": "validation", "dev_mismatched": "validation_mismatched"}.get(split, split)
  try:
    ds = tfds.load(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise FileNotFoundError(f"TFDS glue/{name} is not prepared locally under {data_dir or '~/tensorflow_datasets'} "
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
  return out


def _tfds_label(task: str, index: int) -> str:
  # TFDS orders MNLI labels entailment/neutral/contradiction; GLUE TSVs use names.
  if task == "mnli":
    return ("entailment", "neutral", "contradiction")[index]
  if task in ("qnli", "rte"):
    return ("entailment", "not_entailment")[index]
  return str(index)


def read_custom(path: str, text_a: str, label: str, text_b: str | None = None) -> list[Example]:
  """A user's own classification file: .csv, .tsv (with a header) or .jsonl."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (heavy: loaded only where tf.io/tf.data is used)
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"{path} does not exist.")
  if path.endswith(".jsonl") or path.endswith(".json"):
    with tf.io.gfile.GFile(path) as f:
      records = [json.loads(line) for line in f if line.strip()]
    header = None
  else:
    rows = (_rows(path, "\t") if path.endswith(".tsv") else _rows(path, ",", quotechar='"'))
    header, records = rows[0], rows[1:]
    records = [dict(zip(header, r)) for r in records if r]
  out = []
  for i, r in enumerate(records):
    for key in (text_a, label) + ((text_b,) if text_b else ()):
      if key not in r:
        raise ValueError(f"{path}: record {i} has no field {key!r}; fields are {sorted(r)}. "
                         "Set text_a_column / text_b_column / label_column in the config.")
    out.append(Example(str(i), str(r[text_a]), str(r[text_b]) if text_b else None,
                       None if r[label] in (None, "") else str(r[label])))
  del header
  return out


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
    truncate_pair(a, b, max_seq_length - (3 if b is not None else 2))
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
