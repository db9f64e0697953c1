"""Dynamic masked-LM masking: a vectorized TensorFlow function with stateless randomness.

`make_mask_fn(...)` returns a dict -> dict function for `tf.data.Dataset.map` (it also runs
eagerly). Its input holds input_ids [N, L] (or one example [L]) and mask_seed [2] int64;
the same (seed, input) always gives the same masks, so a restarted run masks exactly as
an uninterrupted one. The pipeline masks a whole block of examples per call, so the work
is a few vectorized ops per block, not per example.

Per example (google-research/bert create_masked_lm_predictions, vectorized):
  * candidates: every token except the special ones ([CLS] [SEP] [PAD] [UNK] [MASK],
    "[unusedN]"), so padding and separators are never chosen;
  * n = floor(masked_lm_prob * #candidates + u), u ~ U[0,1) (stochastic rounding: the
    expected rate is exactly masked_lm_prob even for short sequences; the original rounds
    15% of all tokens, [CLS]/[SEP] included), capped at max_predictions_per_seq;
  * candidates, or whole words (a token and its continuation pieces) with whole-word
    masking, are taken in a random order while the total stays <= n (a word that would
    overflow ends the selection, where the original skips it and tries the next);
  * 80% of the chosen tokens become [MASK], 10% a random non-special token, 10% stay.
Outputs masked_lm_positions (ascending), masked_lm_ids, masked_lm_weights, padded to
max_predictions_per_seq with 0 / 0 / 0.0.
"""
from typing import Callable

import numpy as np
import tensorflow as tf


def _priorities(ids, seed, candidate, is_continuation_t=None):
  """Random priorities of the tokens; the chosen tokens are the highest ones. Full-range
  int32: ties between two words (which would merge them) are rare (~3e-5 per length-512
  row). With `is_continuation_t` (whole-word masking) a word starts at every token that is
  not a continuation piece; specials are words of their own, so a word never spans a
  [SEP]. Its pieces share a priority."""
  priority = tf.random.stateless_uniform(tf.shape(ids), seed, dtype=tf.int32,
                                         minval=None, maxval=None)
  if is_continuation_t is None:
    return priority
  starts = ~tf.gather(is_continuation_t, ids) | ~candidate
  word = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1
  return tf.gather(priority, word, batch_dims=1)


def make_mask_fn(*, is_special: np.ndarray, is_continuation: np.ndarray, mask_id: int,
                 max_predictions_per_seq: int, masked_lm_prob: float,
                 whole_word_masking: bool) -> Callable[[dict], dict]:
  """Builds mask_tokens(features) -> features (see module doc).

  is_special / is_continuation: bool [V] tables from the Tokenizer.
  """
  num_preds = max_predictions_per_seq
  is_special_t = tf.constant(is_special, tf.bool)
  is_continuation_t = tf.constant(is_continuation, tf.bool)
  random_ids = tf.constant(np.flatnonzero(~is_special), tf.int32)

  def mask_batch(ids, seed, masked_lm_prob):
    n, length = tf.shape(ids)[0], ids.shape[1]
    k = min(num_preds + 1, length)  # The budget (<= P) never needs more of the order.
    seeds = tf.random.experimental.stateless_split(seed, 4)
    candidate = ~tf.gather(is_special_t, ids)
    priority = _priorities(ids, seeds[0], candidate,
                           is_continuation_t if whole_word_masking else None)
    lowest = tf.constant(np.iinfo(np.int32).min, tf.int32)
    priority = tf.where(candidate, priority, lowest)
    # top_k breaks ties by lower index: a word's pieces come out together, in order.
    top = tf.math.top_k(priority, k=k, sorted=True)
    num_candidates = tf.reduce_sum(tf.cast(candidate, tf.float64), axis=1)
    budget = tf.floor(num_candidates * masked_lm_prob
                      + tf.random.stateless_uniform([n], seeds[1], dtype=tf.float64))
    budget = tf.minimum(tf.cast(budget, tf.int32), num_preds)[:, None]
    # The longest prefix of the order that ends at a word boundary and fits the budget.
    rank = tf.range(1, k + 1)[None, :]
    values = top.values
    # A word ends where the next priority differs. With k < L the k-th entry only serves
    # as the "next" of the P-th and is dropped.
    after = tf.concat([values[:, 1:], tf.fill([n, 1], lowest)], axis=1)
    word_end = (values != after) & (values > lowest)
    if k < length:
      word_end = word_end[:, :-1]
      values, indices, rank = values[:, :-1], top.indices[:, :-1], rank[:, :-1]
    else:
      indices = top.indices
    take = tf.reduce_max(tf.where(word_end & (rank <= budget), rank, 0), axis=1)[:, None]
    # The chosen positions in ascending order, then padding: the P smallest keys.
    pos_key = tf.where(rank <= take, indices, indices + length)
    first = -tf.math.top_k(-pos_key, k=num_preds, sorted=True).values
    weights = first < length
    positions = tf.where(weights, first, 0)
    labels = tf.where(weights, tf.gather(ids, positions, batch_dims=1), 0)

    action = tf.random.stateless_uniform([n, num_preds], seeds[2])
    replacement = tf.gather(random_ids, tf.random.stateless_uniform(
        [n, num_preds], seeds[3], 0, tf.shape(random_ids)[0], dtype=tf.int32))
    shown = tf.where(action < 0.8, tf.constant(mask_id, ids.dtype),
                     tf.where(action < 0.9, replacement, labels))
    rows = tf.broadcast_to(tf.range(n)[:, None], [n, num_preds])
    new_ids = tf.tensor_scatter_nd_update(
        ids, tf.boolean_mask(tf.stack([rows, positions], -1), weights),
        tf.boolean_mask(shown, weights))
    return {"input_ids": new_ids, "masked_lm_positions": positions,
            "masked_lm_ids": labels, "masked_lm_weights": tf.cast(weights, tf.float32)}

  def mask_tokens(features: dict) -> dict:
    """`features` may carry its own "masked_lm_prob" (a masking-rate schedule's value for
    this block); else the rate given above."""
    ids = tf.convert_to_tensor(features["input_ids"])
    single = ids.shape.rank == 1
    rate = features.get("masked_lm_prob", masked_lm_prob)
    out = mask_batch(ids[None] if single else ids, features["mask_seed"], rate)
    if single:
      out = {k: v[0] for k, v in out.items()}
    result = {k: v for k, v in features.items() if k not in ("mask_seed", "masked_lm_prob")}
    result.update(out)
    return result

  return mask_tokens
