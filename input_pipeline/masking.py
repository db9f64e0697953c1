"""Dynamic masked-LM masking: vectorized numpy with counter-based randomness (no TensorFlow).

`make_mask_fn(...)` returns a dict -> dict function of numpy arrays. Its input holds
input_ids [N, L] (or one example [L]) and mask_seed [2] int64; the same (seed, input)
always gives the same masks (numpy's Philox generator keyed by the seed: the same bits on
every platform and numpy version that has it), so a restarted run masks exactly as an
uninterrupted one. The pipeline masks a whole block of examples per call, so the work is a
few vectorized ops per block, not per example.

VERSION names the masks' random draws. Version 1 (bert_jax before 2026-11) drew them with
TensorFlow's stateless ops; version 2 with numpy: the same algorithm and statistics, other
draws. The pre-training iterator records it in its state and says so when a run saved
under another version resumes.

Per example (google-research/bert create_masked_lm_predictions, vectorized):
  * candidates: every token except the special ones ([CLS] [SEP] [PAD] [UNK] [MASK],
    "[unusedN]"), so padding and separators are never chosen;
  * n = floor(masked_lm_prob * #candidates + u), u ~ U[0,1) (stochastic rounding: the
    expected rate is exactly masked_lm_prob even for short sequences; the original rounds
    15% of all tokens, [CLS]/[SEP] included), capped at max_predictions_per_seq;
  * candidates, or whole words (a token and its continuation pieces) with whole-word
    masking, are taken in a random order while the total stays <= n (a word that would
    overflow ends the selection, where the original skips it and tries the next);
  * of the chosen tokens, `mask_ratios` = ([MASK], same, random) shares (BERT: 80% become
    [MASK], 10% stay, 10% a random non-special token; the paper's Table 8 varies them).
Outputs masked_lm_positions (ascending), masked_lm_ids, masked_lm_weights, padded to
max_predictions_per_seq with 0 / 0 / 0.0.
"""
from typing import Callable

import numpy as np

VERSION = 2
_LOWEST = np.iinfo(np.int32).min


def _generator(seed) -> np.random.Generator:
  """Philox keyed by the two 32-bit halves of `seed` ([2] int64)."""
  hi, lo = (int(x) & 0xFFFFFFFF for x in np.asarray(seed).reshape(-1)[:2])
  return np.random.Generator(np.random.Philox(key=(hi << 32) | lo))


def _priorities(ids, rng, candidate, is_continuation=None):
  """Random priorities of the tokens; the chosen tokens are the highest ones. Full-range
  int32: ties between two words (which would merge them) are rare (~3e-5 per length-512
  row). With `is_continuation` (whole-word masking) a word starts at every token that is
  not a continuation piece; specials are words of their own, so a word never spans a
  [SEP]. Its pieces share a priority."""
  priority = rng.integers(_LOWEST, np.iinfo(np.int32).max, ids.shape, dtype=np.int32,
                          endpoint=True)
  if is_continuation is None:
    return priority
  starts = ~is_continuation[ids] | ~candidate
  word = np.cumsum(starts, axis=1, dtype=np.int32) - 1
  return np.take_along_axis(priority, np.maximum(word, 0), axis=1)


MASK_RATIOS = (0.8, 0.1, 0.1)  # BERT's ([MASK], same, random)


def _positions(priority: np.ndarray, candidate: np.ndarray, rng, num_preds: int,
               masked_lm_prob: float) -> tuple[np.ndarray, np.ndarray]:
  """(positions [n, P] int32, weights [n, P] bool) of the tokens to predict: whole
  priority groups (words) in priority order, as many as the row's budget allows (its
  candidates x masked_lm_prob, randomly rounded; at most P), ascending, then padding."""
  n, length = priority.shape
  priority = np.where(candidate, priority, _LOWEST)
  # Highest priority first, ties by lower index (a stable sort of the negated keys): a
  # word's pieces come out together, in order. The budget (<= P) never needs more than
  # the first P + 1 of the order.
  k = min(num_preds + 1, length)
  order = np.argsort(-priority.astype(np.int64), axis=1, kind="stable")[:, :k]
  values = np.take_along_axis(priority, order, axis=1)
  budget = np.floor(candidate.sum(1).astype(np.float64) * masked_lm_prob
                    + rng.random(n))
  budget = np.minimum(budget.astype(np.int64), num_preds)[:, None]
  # The longest prefix of the order that ends at a word boundary and fits the budget.
  # A word ends where the next priority differs; with k < L the k-th entry only serves
  # as the "next" of the P-th and is dropped.
  rank = np.arange(1, k + 1)[None, :]
  after = np.concatenate([values[:, 1:], np.full((n, 1), _LOWEST, np.int32)], axis=1)
  word_end = (values != after) & (values > _LOWEST)
  if k < length:
    word_end, order, rank = word_end[:, :-1], order[:, :-1], rank[:, :-1]
  take = np.max(np.where(word_end & (rank <= budget), rank, 0), axis=1, initial=0)[:, None]
  # The chosen positions in ascending order, then padding: the P smallest keys.
  pos_key = np.sort(np.where(rank <= take, order, order + length), axis=1)[:, :num_preds]
  if pos_key.shape[1] < num_preds:  # L < P: the rest is padding
    pos_key = np.pad(pos_key, ((0, 0), (0, num_preds - pos_key.shape[1])),
                     constant_values=length)
  weights = pos_key < length
  positions = np.where(weights, pos_key, 0).astype(np.int32)
  return positions, weights


def make_mask_fn(*, is_special: np.ndarray, is_continuation: np.ndarray, mask_id: int,
                 max_predictions_per_seq: int, masked_lm_prob: float,
                 whole_word_masking: bool,
                 mask_ratios: tuple[float, float, float] = MASK_RATIOS
                 ) -> Callable[[dict], dict]:
  """Builds mask_tokens(features) -> features (see module doc).

  is_special / is_continuation: bool [V] tables from the Tokenizer.
  """
  num_preds = max_predictions_per_seq
  # One uniform draw per prediction: [MASK] below mask_below, a random token up to
  # random_below, the token itself above (BERT's 0.8 and 0.9: the same masks as before).
  mask_below = float(mask_ratios[0])
  random_below = 1.0 - float(mask_ratios[1])
  is_special = np.asarray(is_special, bool)
  is_continuation = np.asarray(is_continuation, bool)
  random_ids = np.flatnonzero(~is_special).astype(np.int32)

  def mask_batch(ids, seed, masked_lm_prob):
    n, length = ids.shape
    rng = _generator(seed)
    candidate = ~is_special[ids]
    priority = _priorities(ids, rng, candidate,
                           is_continuation if whole_word_masking else None)
    positions, weights = _positions(priority, candidate, rng, num_preds, masked_lm_prob)
    labels = np.where(weights, np.take_along_axis(ids, positions, axis=1), 0).astype(ids.dtype)

    action = rng.random((n, num_preds))
    replacement = random_ids[rng.integers(0, len(random_ids), (n, num_preds))]
    shown = np.where(action < mask_below, mask_id,
                     np.where(action < random_below, replacement, labels))
    new_ids = ids.copy()
    rows = np.broadcast_to(np.arange(n)[:, None], (n, num_preds))
    new_ids[rows[weights], positions[weights]] = shown[weights]
    return {"input_ids": new_ids, "masked_lm_positions": positions,
            "masked_lm_ids": labels, "masked_lm_weights": weights.astype(np.float32)}

  def mask_tokens(features: dict) -> dict:
    """`features` may carry its own "masked_lm_prob" (a masking-rate schedule's value for
    this block); else the rate given above."""
    ids = np.asarray(features["input_ids"])
    single = ids.ndim == 1
    rate = float(features.get("masked_lm_prob", masked_lm_prob))
    out = mask_batch(ids[None] if single else ids, features["mask_seed"], rate)
    if single:
      out = {k: v[0] for k, v in out.items()}
    result = {k: v for k, v in features.items() if k not in ("mask_seed", "masked_lm_prob")}
    result.update(out)
    return result

  return mask_tokens
