"""Sequence packing: several examples share one row, without contamination.

Each example keeps its own `[CLS] A [SEP] B [SEP]`; `packed_example_ids` (1, 2, ...;
0 = padding) makes attention block-diagonal, `position_ids` restart per example,
masked-LM positions are shifted into the row, and each example is scored at its own
[CLS] (`cls_positions` [R, E]); per-example features (NSP labels, class labels) become
[R, E] with `example_weights` [R, E] (0 for empty slots).

    rows = pack_examples(examples, max_seq_length=512, max_examples_per_row=8,
                         max_predictions_per_row=80)

Packing is greedy and order-preserving: each example goes into the first of the
`open_rows` most recently started rows it fits (tokens, examples and masked-LM
predictions per row), else starts a new row. A pure function of its input, so a block
of examples always packs into the same rows (the pipeline's resumable state counts rows).
"""
from __future__ import annotations

import numpy as np

from input_pipeline import features

TOKEN_KEYS = features.PRETRAINING_BATCH[:3]  # input_ids, input_mask, segment_ids
MLM_KEYS = features.MASKED_LM
ROW_KEYS = TOKEN_KEYS + ("position_ids", "packed_example_ids")


def assign_rows(lengths: np.ndarray, num_predictions: np.ndarray, *, max_seq_length: int,
                max_examples_per_row: int, max_predictions_per_row: int,
                open_rows: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
  """Row, slot, token start and prediction start of every example; and the row count."""
  n = len(lengths)
  row, slot = np.zeros(n, np.int64), np.zeros(n, np.int64)
  start, pred_start = np.zeros(n, np.int64), np.zeros(n, np.int64)
  used_len: list[int] = []
  used_pred: list[int] = []
  count: list[int] = []
  candidates: list[int] = []  # open rows, oldest first
  for i in range(n):
    l, p = int(lengths[i]), int(num_predictions[i])
    if l > max_seq_length or p > max_predictions_per_row:
      raise ValueError(
          f"Example {i} has {l} tokens and {p} masked-LM predictions; a packed row holds "
          f"{max_seq_length} tokens and {max_predictions_per_row} predictions. Raise the "
          "row sizes or shorten the examples.")
    for r in candidates:
      if (used_len[r] + l <= max_seq_length and used_pred[r] + p <= max_predictions_per_row):
        break
    else:
      r = len(used_len)
      used_len.append(0)
      used_pred.append(0)
      count.append(0)
      candidates.append(r)
      if len(candidates) > open_rows:
        candidates.pop(0)
    row[i], slot[i], start[i], pred_start[i] = r, count[r], used_len[r], used_pred[r]
    used_len[r] += l
    used_pred[r] += p
    count[r] += 1
    if count[r] == max_examples_per_row or used_len[r] == max_seq_length:
      candidates.remove(r)  # full
  return row, slot, start, pred_start, len(used_len)


def pack_examples(feats: dict[str, np.ndarray], max_seq_length: int, max_examples_per_row: int,
                  max_predictions_per_row: int | None = None, open_rows: int = 16,
                  rows: int | None = None) -> dict[str, np.ndarray]:
  """Packs examples [N, ...] (real tokens first in each row) into rows [R, ...].

  feats: input_ids, input_mask, segment_ids [N, L0]; optionally masked_lm_positions,
  masked_lm_ids, masked_lm_weights [N, P]; any other key is per-example ([N, ...]).
  Returns input_ids, input_mask, segment_ids, position_ids, packed_example_ids [R, L],
  cls_positions and example_weights [R, E], every per-example key as [R, E, ...], and
  masked_lm_* [R, P_row] (P_row = max_predictions_per_row, default P) when given. `rows`:
  R (empty rows at the end; fewer than needed is a ValueError), else the rows needed.
  """
  L, E = max_seq_length, max_examples_per_row
  mask = np.asarray(feats["input_mask"]) > 0
  lengths = mask.sum(-1)
  if not np.array_equal(mask, np.arange(mask.shape[1])[None] < lengths[:, None]):
    raise ValueError("pack_examples needs each example's real tokens first (input_mask "
                     "1...1 0...0).")
  has_mlm = "masked_lm_positions" in feats
  if has_mlm:
    keep = np.asarray(feats["masked_lm_weights"]) > 0
    P = int(max_predictions_per_row or keep.shape[1])
  else:
    keep = np.zeros((len(lengths), 0), bool)
    P = 0
  row, slot, start, pred_start, R = assign_rows(
      lengths, keep.sum(-1), max_seq_length=L, max_examples_per_row=E,
      max_predictions_per_row=P if has_mlm else 1 << 30, open_rows=open_rows)
  R = _planned(R, rows, len(lengths))

  out = {k: np.zeros((R, L), np.int32) for k in ROW_KEYS}
  ii, jj = np.nonzero(mask)  # every real token: example ii, column jj
  rr, cc = row[ii], start[ii] + jj
  for k in TOKEN_KEYS:
    out[k][rr, cc] = np.asarray(feats[k])[ii, jj]
  out["position_ids"][rr, cc] = jj
  out["packed_example_ids"][rr, cc] = slot[ii] + 1
  out["cls_positions"] = np.zeros((R, E), np.int32)
  out["cls_positions"][row, slot] = start
  weights = np.asarray(feats.get("example_weights", np.ones(len(lengths))), np.float32)
  out["example_weights"] = np.zeros((R, E), np.float32)
  out["example_weights"][row, slot] = weights
  for k, v in feats.items():
    if k in TOKEN_KEYS or k in MLM_KEYS or k == "example_weights":
      continue
    v = np.asarray(v)
    out[k] = np.zeros((R, E) + v.shape[1:], v.dtype)
    out[k][row, slot] = v
  if has_mlm:
    ii, kk = np.nonzero(keep)
    rank = (np.cumsum(keep, axis=1) - 1)[ii, kk]
    rr, pp = row[ii], pred_start[ii] + rank
    for k in MLM_KEYS:
      v = np.asarray(feats[k])
      out[k] = np.zeros((R, P), v.dtype)
      out[k][rr, pp] = v[ii, kk] + (start[ii] if k == "masked_lm_positions" else 0)
  return out



OPEN_ROWS = 64  # rows first-fit decreasing considers, when each batch is packed on its own


def _planned(needed: int, rows: int | None, n: int) -> int:
  if rows is not None and needed > rows:
    raise ValueError(f"{n} examples need {needed} packed rows; {rows} were planned.")
  return needed if rows is None else rows


def pack_texts(ids_NL: np.ndarray, mask_NL: np.ndarray, *, max_texts_per_row: int,
               rows: int | None = None, open_rows: int = OPEN_ROWS) -> dict[str, np.ndarray]:
  """Texts [N, L] (real tokens first) packed several to a row of L tokens, longest first
  (first-fit decreasing, over the `open_rows` most recent rows): input_ids, input_mask,
  segment_ids (0), position_ids and packed_example_ids (slot + 1; 0 = padding) [R, L], and
  `text_at` [N, 2], each text's (row, slot). `rows`: R (the rows needed if None; fewer
  than needed is a ValueError)."""
  mask = np.asarray(mask_NL) > 0
  lengths = mask.sum(-1)
  order = np.argsort(-lengths, kind="stable")
  row_o, slot_o, start_o, _, needed = assign_rows(
      lengths[order], np.zeros_like(lengths), max_seq_length=mask.shape[1],
      max_examples_per_row=max_texts_per_row, max_predictions_per_row=1, open_rows=open_rows)
  R = _planned(needed, rows, len(lengths))
  row, slot, start = (np.empty_like(v) for v in (row_o, slot_o, start_o))
  row[order], slot[order], start[order] = row_o, slot_o, start_o
  out = {k: np.zeros((R, mask.shape[1]), np.int32) for k in ROW_KEYS}
  ii, jj = np.nonzero(mask)
  rr, cc = row[ii], start[ii] + jj
  out["input_ids"][rr, cc] = np.asarray(ids_NL)[ii, jj]
  out["input_mask"][rr, cc] = 1
  out["position_ids"][rr, cc] = jj
  out["packed_example_ids"][rr, cc] = slot[ii] + 1
  out["text_at"] = np.stack([row, slot], -1).astype(np.int32)
  return out


def rows_needed(lengths_N: np.ndarray, max_seq_length: int, max_texts_per_row: int,
                open_rows: int = OPEN_ROWS) -> int:
  """The rows texts (examples) of these lengths take packed longest first (pack_texts)."""
  order = np.argsort(-np.asarray(lengths_N), kind="stable")
  return assign_rows(np.asarray(lengths_N)[order], np.zeros(len(order), np.int64),
                     max_seq_length=max_seq_length, max_examples_per_row=max_texts_per_row,
                     max_predictions_per_row=1, open_rows=open_rows)[-1]
