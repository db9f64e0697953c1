"""The feature schema: the names of the arrays every batch carries, and the one place a
`[CLS] A [SEP] B [SEP]` input is assembled for fine-tuning and inference.

  TEXT          input_ids, segment_ids, input_mask              [B, L] int32 (SWAG: [B, 4, L])
  PACKED        position_ids, packed_example_ids [B, L]; cls_positions [B, E] (packed rows)
  PRETRAINING   TEXT + masked_lm_positions [B, P] (the model's inputs); the targets are
                masked_lm_ids / masked_lm_weights [B, P], next_sentence_labels [B]
Labels of fine-tuning tasks: labels [B] (classification), start/end_positions [B] (span QA),
labels + label_weights [B, L] (tagging); example_weights [B] or [B, E] where rows are padding
or packed slots.
"""
from __future__ import annotations

from typing import Sequence

TEXT = ("input_ids", "segment_ids", "input_mask")
PACKED = ("position_ids", "packed_example_ids", "cls_positions")
PRETRAINING = TEXT + ("masked_lm_positions",)
MLM_TARGETS = ("masked_lm_ids", "masked_lm_weights")
MASKED_LM = ("masked_lm_positions",) + MLM_TARGETS
# A pre-training batch (input_pipeline/pretrain.py), in its order; packed rows add PACKED and
# example_weights.
PRETRAINING_BATCH = ("input_ids", "input_mask", "segment_ids") + MASKED_LM + ("next_sentence_labels",)


def pair_seps(tokenizer) -> int:
  """The separators between a pair's segments (1, or RoBERTa's 2)."""
  return getattr(tokenizer, "pair_seps", 1)


def special_count(tokenizer, pair: bool) -> int:
  """The special tokens encode_pair adds: [CLS] and [SEP], and the pair's separators."""
  return 2 + (pair_seps(tokenizer) if pair else 0)


def encode_pair(tokenizer, a: Sequence[int], b: Sequence[int] | None = None
                ) -> tuple[list[int], list[int]]:
  """`[CLS] a [SEP]` (+ `b [SEP]`) token ids and their segment ids (0 for the first
  segment with its [CLS] and [SEP], 1 for b and its [SEP]); a tokenizer whose pairs take
  two separators (RoBERTa's `<s> a </s></s> b </s>`, tokenizer.pair_seps) gets them, the
  extra one in segment 0. Truncation is the caller's (special_count)."""
  ids = [tokenizer.cls_id] + list(a) + [tokenizer.sep_id]
  if b is not None:
    ids += [tokenizer.sep_id] * (pair_seps(tokenizer) - 1)
  segments = [0] * len(ids)
  if b is not None:
    ids += list(b) + [tokenizer.sep_id]
    segments += [1] * (len(b) + 1)
  return ids, segments
