"""Text pairs for contrastive fine-tuning (config.task=embed): (anchor, positive) with
optional hard negatives, or scored pairs (STS-B style) for evaluation, from JSON Lines, CSV,
TSV (with a header) or Parquet, and their features.

Every problem with a file is one DataError naming the file and the row (a missing column,
an empty text, a score that is not a number).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

from common import fileio
from input_pipeline import features
from input_pipeline import glue

DataError = glue.DataError


@dataclasses.dataclass(frozen=True)
class Pair:
  anchor: str
  positive: str
  negatives: tuple[str, ...] = ()
  score: float | None = None  # a scored pair (evaluation): how similar, e.g. STS-B's 0-5
  line: int = 0  # the record's line (row for Parquet) in its file, 1-based


def _parquet_records(path: str) -> list[tuple[int, dict]]:
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  with fileio.path(path).open("rb") as f:
    table = pq.read_table(f)
  return [(i + 1, r) for i, r in enumerate(table.to_pylist())]


def _number(value) -> float | None:
  """A record's value as a number (a CSV field's text too); None when it is none."""
  if isinstance(value, bool) or value is None or value == "":
    return None
  try:
    number = float(value)
  except (TypeError, ValueError):
    return None
  return number if np.isfinite(number) else None


# Columns named as ids or row numbers: id, qid, doc_id, query-id, idx, index, row, line.
_ID = re.compile(r"[a-z]?id|(.*[_\- ])?(id|idx|index)|idx|index|row|line")


def _could_be_scores(name: str, values: list) -> bool:
  """A column of numbers that are no id, no row number and not all the same."""
  numbers = [_number(v) for v in values]
  if None in numbers or len(set(numbers)) < 2:
    return False
  if _ID.fullmatch(name.lower()):
    return False
  return not np.array_equal(np.diff(numbers), np.ones(len(numbers) - 1))


def _check_unscored(path: str, records: list[tuple[int, dict]], score: str,
                    texts: Sequence[str]) -> None:
  """A dev file without the score column is ranked as unscored pairs: refused when another
  column holds numbers that could be its scores (an STS file under another name)."""
  columns = [k for k in records[0][1] if k not in texts]
  numeric = [k for k in columns if _could_be_scores(k, [r.get(k) for _, r in records])]
  if numeric:
    named = " and ".join(map(repr, numeric))
    raise DataError(
        f"{path}: no column {score!r} (config.score_column), but {named} "
        f"{'holds' if len(numeric) == 1 else 'hold'} numbers: set --config.score_column="
        f"{numeric[-1]} (the column of scores) to score the pairs (Spearman), or "
        f"--config.score_column= to rank them unscored (MRR@10); the columns are "
        f"{sorted(records[0][1])}.")


def _no_column(path: str, line: int, key: str, record: dict, field: str) -> DataError:
  """`key` missing from the record: the advice names the config field choosing that column
  (a dev file's eval_* field, whose empty value takes the training file's)."""
  own = field.removeprefix("eval_")  # the training file's field
  what = {"anchor_column": "anchors", "positive_column": "positives",
          "negative_columns": "hard negatives"}[own]
  whose = "the training file's" if own == field else "the dev file's"
  fallback = "" if own == field else f" (--config.{field}= reads the training file's, {own})"
  return DataError(f"{path}:{line}: no column {key!r}; the columns are {sorted(record)}: set "
                   f"--config.{field} to {whose} column of {what}{fallback}.")


TRAIN_FIELDS = ("anchor_column", "positive_column", "negative_columns")
DEV_FIELDS = ("eval_anchor_column", "eval_positive_column", "negative_columns")


def read_pairs(path: str, anchor: str, positive: str, negatives: Sequence[str] = (),
               score: str | None = None, fields: Sequence[str] = TRAIN_FIELDS) -> list[Pair]:
  """The pairs of a .jsonl / .csv / .tsv (optionally .gz) or .parquet file: the columns
  `anchor`, `positive`, each of `negatives` and, when given and present in the file, `score`
  (then in every row). A file without `score` whose other columns hold numbers that could be
  scores (not an id, a row number or one value) is a DataError: its pairs would be ranked
  unscored. `fields`: the config fields naming the anchor, positive and negative columns,
  which a missing column's message names."""
  records = (_parquet_records(path) if path.endswith(".parquet") else glue.read_records(path))
  if not records:
    raise DataError(f"{path} holds no pairs.")
  scored = bool(score) and any(score in r for _, r in records)
  if score and not scored:
    _check_unscored(path, records, score, (anchor, positive, *negatives))
  keys = (anchor, positive, *negatives)
  key_fields = (fields[0], fields[1]) + (fields[2],) * len(negatives)
  out = []
  for line, r in records:
    if scored and score not in r:
      raise DataError(f"{path}:{line}: no column {score!r} (config.score_column), which other "
                      f"rows have: every scored pair needs its score; the columns are "
                      f"{sorted(r)}: fix or remove the row.")
    for key, field in zip(keys, key_fields):
      if key not in r:
        raise _no_column(path, line, key, r, field)
    texts = [glue.text_field(r, key, path, line) for key in keys]
    for key, text in zip(keys, texts):
      if not text.strip():
        raise DataError(f"{path}:{line}: {key!r} is empty: every pair needs both texts (and "
                        "each hard negative): fix or remove the row.")
    value = None
    if scored:
      try:
        value = float(r[score])
      except (TypeError, ValueError):
        raise DataError(f"{path}:{line}: score {r[score]!r} is not a number.") from None
    out.append(Pair(texts[0], texts[1], tuple(texts[2:]), value, line))
  return out


def _encode(tokenizer, texts: list[str], max_seq_length: int) -> tuple[np.ndarray, np.ndarray]:
  """ids and mask [len(texts), max_seq_length] of [CLS] text [SEP], cut to fit."""
  ids = np.zeros((len(texts), max_seq_length), np.int32)
  mask = np.zeros_like(ids)
  for i, tokens in enumerate(tokenizer.encode_batch(texts)):
    row = features.encode_pair(tokenizer, list(tokens)[:max_seq_length - 2])[0]
    ids[i, :len(row)], mask[i, :len(row)] = row, 1
  return ids, mask


def encode_pairs(pairs: Sequence[Pair], tokenizer, max_seq_length: int,
                 num_negatives: int | None = None) -> dict[str, np.ndarray]:
  """input_ids / segment_ids / input_mask [N, L] of the anchors, positive_ids /
  positive_mask [N, L], and, when the pairs have negatives (or `num_negatives` asks for a
  shape, 0 included), negative_ids / negative_mask [N, K, L]."""
  ids, mask = _encode(tokenizer, [p.anchor for p in pairs], max_seq_length)
  pos_ids, pos_mask = _encode(tokenizer, [p.positive for p in pairs], max_seq_length)
  out = {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask,
         "positive_ids": pos_ids, "positive_mask": pos_mask}
  k = len(pairs[0].negatives) if num_negatives is None else num_negatives
  if k or num_negatives is not None:
    texts = [n for p in pairs for n in (p.negatives + ("",) * k)[:k]]
    neg_ids, neg_mask = _encode(tokenizer, texts, max_seq_length) if texts else (
        np.zeros((0, max_seq_length), np.int32),) * 2
    out["negative_ids"] = neg_ids.reshape(len(pairs), k, max_seq_length)
    out["negative_mask"] = neg_mask.reshape(len(pairs), k, max_seq_length)
  return out
