"""Multiple choice data (SWAG): the CSV release (`sent1`, `sent2`, `ending0..3`, `label`),
each example encoded as four `[CLS] context [SEP] start + ending [SEP]` rows.
"""
from __future__ import annotations

import csv
import io

import numpy as np

from input_pipeline import features
from input_pipeline.glue import DataError, read_task_text, truncate_pair


def read_swag(path: str) -> list[dict]:
  reader = csv.DictReader(io.StringIO(read_task_text(path)))
  need = {"sent1", "sent2", "ending0", "ending1", "ending2", "ending3"}
  if not need <= set(reader.fieldnames or ()):
    raise DataError(f"{path} is not a SWAG CSV: needs columns {sorted(need)} (+ label).")
  out, line = [], reader.line_num + 1
  for i, r in enumerate(_csv_records(reader, path)):
    label = r.get("label") or ""
    if label not in ("", "0", "1", "2", "3"):
      raise DataError(f"{path}:{line}: label {label!r} is not a choice (0, 1, 2 or 3): fix or "
                      "remove the row.")
    out.append({"id": r.get("fold-ind", str(i)), "context": r["sent1"], "start": r["sent2"],
                "endings": [r[f"ending{k}"] for k in range(4)],
                "label": int(label) if label else -1})
    line = reader.line_num + 1
  if not out:
    raise DataError(f"{path} holds no examples (a header and no rows): every input file needs "
                    "at least one.")
  return out


def _csv_records(reader, path: str):
  """The reader's records; a malformed row is a DataError naming the file and line."""
  while True:
    start = reader.line_num + 1
    try:
      yield next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      raise DataError(f"{path}:{start}: not a readable CSV row ({e}).") from None


def encode_swag(examples: list[dict], tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
  """[N, 4, L]: [CLS] context [SEP] start + ending [SEP] for each choice."""
  n = len(examples)
  feats = {k: np.zeros((n, 4, max_seq_length), np.int32) for k in features.TEXT}
  feats["labels"] = np.array([e["label"] for e in examples], np.int32)
  contexts = tokenizer.encode_batch([e["context"] for e in examples])
  endings = tokenizer.encode_batch([f"{e['start']} {end}" for e in examples for end in e["endings"]])
  for i in range(n):
    for k in range(4):
      a, b = list(contexts[i]), list(endings[4 * i + k])
      truncate_pair(a, b, max_seq_length - features.special_count(tokenizer, True))
      ids, segments = features.encode_pair(tokenizer, a, b)
      feats["input_ids"][i, k, :len(ids)] = ids
      feats["segment_ids"][i, k, :len(ids)] = segments
      feats["input_mask"][i, k, :len(ids)] = 1
  return feats
