"""Token classification (CoNLL-2003) and multiple choice (SWAG) data.

CoNLL: one `token POS chunk tag` line per word, blank lines between sentences,
`-DOCSTART-` lines skipped. Only the first WordPiece of each word is labelled
(the others get weight 0), as in the BERT paper.
SWAG: the CSV release (`sent1`, `sent2`, `ending0..3`, `label`).
"""
from __future__ import annotations

import csv
import io

import numpy as np

from input_pipeline import features
from input_pipeline.glue import DataError, read_task_text, truncate_pair


def read_conll(path: str) -> list[tuple[list[str], list[str]]]:
  """[(words, tags)] per sentence; the tag is the last column."""
  sentences, words, tags = [], [], []
  for line_no, line in enumerate(read_task_text(path).splitlines(), 1):
    line = line.strip()
    if not line or line.startswith("-DOCSTART-"):
      if words:
        sentences.append((words, tags))
      words, tags = [], []
      continue
    cols = line.split()
    if len(cols) < 2:
      raise DataError(f"{path}:{line_no}: expected 'token ... tag', got {line!r}.")
    words.append(cols[0])
    tags.append(cols[-1])
  if words:
    sentences.append((words, tags))
  if not sentences:
    raise DataError(f"{path} holds no sentences: every input file needs at least one.")
  return sentences


def iob1_to_iob2(tags: list[str]) -> list[str]:
  """IOB1 (I- starts a chunk unless it continues one) -> IOB2 (every chunk starts with B-)."""
  out = []
  for i, tag in enumerate(tags):
    if tag.startswith("I-") and (i == 0 or tags[i - 1] == "O" or tags[i - 1][2:] != tag[2:]):
      out.append("B-" + tag[2:])
    else:
      out.append(tag)
  return out


def encode_conll(sentences, tokenizer, max_seq_length: int, labels: list[str]) -> dict[str, np.ndarray]:
  """Features with `labels` and `label_weights` [N, L]; `word_index` maps labelled tokens back."""
  index = {l: i for i, l in enumerate(labels)}
  n = len(sentences)
  feats = {k: np.zeros((n, max_seq_length), np.int32)
           for k in ("input_ids", "segment_ids", "input_mask", "labels")}
  feats["label_weights"] = np.zeros((n, max_seq_length), np.float32)
  feats["word_index"] = np.full((n, max_seq_length), -1, np.int32)
  for i, (words, tags) in enumerate(sentences):
    pieces = tokenizer.encode_batch(words)
    ids, pos = [tokenizer.cls_id], 1
    for w, (word_pieces, tag) in enumerate(zip(pieces, tags)):
      word_pieces = list(word_pieces) or [tokenizer.unk_id]
      if pos + len(word_pieces) > max_seq_length - 1:
        break  # Truncated: the remaining words are not scored.
      if tag not in index:
        raise ValueError(f"Tag {tag!r} is not in the label list {labels}.")
      feats["labels"][i, pos] = index[tag]
      feats["label_weights"][i, pos] = 1.0
      feats["word_index"][i, pos] = w
      ids += word_pieces
      pos += len(word_pieces)
    ids.append(tokenizer.sep_id)
    feats["input_ids"][i, :len(ids)] = ids
    feats["input_mask"][i, :len(ids)] = 1
  return feats


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
  feats = {k: np.zeros((n, 4, max_seq_length), np.int32) for k in ("input_ids", "segment_ids", "input_mask")}
  feats["labels"] = np.array([e["label"] for e in examples], np.int32)
  contexts = tokenizer.encode_batch([e["context"] for e in examples])
  endings = tokenizer.encode_batch([f"{e['start']} {end}" for e in examples for end in e["endings"]])
  for i in range(n):
    for k in range(4):
      a, b = list(contexts[i]), list(endings[4 * i + k])
      truncate_pair(a, b, max_seq_length - 3)
      ids, segments = features.encode_pair(tokenizer, a, b)
      feats["input_ids"][i, k, :len(ids)] = ids
      feats["segment_ids"][i, k, :len(ids)] = segments
      feats["input_mask"][i, k, :len(ids)] = 1
  return feats
