"""Sequence packing: several pre-training examples share one row, without contamination.

Each example keeps its own `[CLS] A [SEP] B [SEP]`; `packed_example_ids` (1, 2, ...;
0 = padding) makes attention block-diagonal, `position_ids` restart per example,
masked-LM positions are shifted into the row, and NSP is scored at every example's
[CLS] (`cls_positions`, `next_sentence_labels`/`next_sentence_weights` [R, E]).
"""
from __future__ import annotations

import numpy as np


def pack_examples(batch: dict[str, np.ndarray], max_seq_length: int, max_examples_per_row: int,
                  max_predictions_per_row: int) -> dict[str, np.ndarray]:
  """Greedy first-fit packing of an unpacked batch (examples in order) into rows."""
  lengths = batch["input_mask"].sum(-1).astype(int)
  n_preds = (batch["masked_lm_weights"] > 0).sum(-1).astype(int)
  rows: list[list[int]] = []
  used_len, used_pred = [], []
  for i, (l, p) in enumerate(zip(lengths, n_preds)):
    for r, members in enumerate(rows):
      if (used_len[r] + l <= max_seq_length and used_pred[r] + p <= max_predictions_per_row
          and len(members) < max_examples_per_row):
        members.append(i)
        used_len[r] += l
        used_pred[r] += p
        break
    else:
      rows.append([i])
      used_len.append(l)
      used_pred.append(p)
  R, L, E, P = len(rows), max_seq_length, max_examples_per_row, max_predictions_per_row
  out = {k: np.zeros((R, L), np.int32) for k in
         ("input_ids", "input_mask", "segment_ids", "position_ids", "packed_example_ids")}
  out.update(masked_lm_positions=np.zeros((R, P), np.int32), masked_lm_ids=np.zeros((R, P), np.int32),
             masked_lm_weights=np.zeros((R, P), np.float32), cls_positions=np.zeros((R, E), np.int32),
             next_sentence_labels=np.zeros((R, E), np.int32), next_sentence_weights=np.zeros((R, E), np.float32))
  for r, members in enumerate(rows):
    start = pred = 0
    for e, i in enumerate(members):
      l, sl = lengths[i], slice(start, start + lengths[i])
      out["input_ids"][r, sl] = batch["input_ids"][i, :l]
      out["segment_ids"][r, sl] = batch["segment_ids"][i, :l]
      out["input_mask"][r, sl] = 1
      out["position_ids"][r, sl] = np.arange(l)
      out["packed_example_ids"][r, sl] = e + 1
      keep = batch["masked_lm_weights"][i] > 0
      k = int(keep.sum())
      out["masked_lm_positions"][r, pred:pred + k] = batch["masked_lm_positions"][i][keep] + start
      out["masked_lm_ids"][r, pred:pred + k] = batch["masked_lm_ids"][i][keep]
      out["masked_lm_weights"][r, pred:pred + k] = batch["masked_lm_weights"][i][keep]
      out["cls_positions"][r, e] = start
      out["next_sentence_labels"][r, e] = batch["next_sentence_labels"][i]
      out["next_sentence_weights"][r, e] = 1.0
      start += l
      pred += k
  return out
