"""Token classification data (CoNLL-2003): one `token POS chunk tag` line per word, blank
lines between sentences, `-DOCSTART-` lines skipped. Only the first WordPiece of each word
is labelled (the others get weight 0), as in the BERT paper. Words are tokenized as in
the sentence's running text (`Tokenizer.encode_words`: each word after the first with its
leading space, which byte-level BPE vocabularies encode as part of the token).
"""
from __future__ import annotations

import numpy as np

from input_pipeline import features
from input_pipeline.glue import DataError, read_task_text


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
           for k in features.TEXT + ("labels",)}
  feats["label_weights"] = np.zeros((n, max_seq_length), np.float32)
  feats["word_index"] = np.full((n, max_seq_length), -1, np.int32)
  for i, (words, tags) in enumerate(sentences):
    pieces = tokenizer.encode_words(words)
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
