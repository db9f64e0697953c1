"""BERT's attention computations, functions of queries, keys, values and the additive bias
(`SelfAttention` in bert.py chooses among them with `model.attention_impl`): the explicit
softmax with the paper's dropout on the probabilities (`explicit_attention`), XLA's or cuDNN's
fused attention through jax.nn.dot_product_attention (`fused_attention`), and bert_jax.flash
on the segments the bias encodes, its probability dropout fused (`flash_attention`).

Axis legend as in bert.py.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from bert_jax import flash
from bert_jax.models.layers import NEG_INF, Rows, dropout

# None and "explicit" name the same path ("explicit" says so where None means "the job's
# choice": a pre-training job on GPU takes "pallas" from GPU_FLASH_FROM tokens on).
ATTENTION_IMPLS = (None, "explicit", "xla", "cudnn", "pallas")
# The sequence length from which a GPU job in bfloat16 runs bert_jax.flash
# (attention_impl="pallas") unless config.model.attention_impl is set. Measured on an H200
# (bench/RESULTS.md, 2026-12-04), bf16, the hash dropout: at L=512, batch 32, BERT-large's
# step 93.3 ms and 17.2 GiB against torch.compile's 96.8 ms and 21.7 GiB in the same call
# (XLA's explicit attention: 114.0 ms, 34.0 GiB, an earlier loan), BERT-base's 31.4 ms against
# 37.9 (explicit: 42.4); at L=128 BERT-base's tied (562.5k vs 558.3k tokens/s, 2026-11-27).
# 256 lies between the two measured lengths, where the explicit path's [B, H, L, L] scores
# (5 bytes each kept for the backward pass) start to outweigh its matmuls: not measured.
GPU_FLASH_FROM = 256


def gpu_defaults(length: int, fields: Mapping[str, Any]) -> dict[str, str]:
  """The attention a GPU job runs at sequence length `length` where the config (its model
  fields, `fields`) names none: the fused kernel in bfloat16 with the hash dropout, as
  measured (families.Family.gpu_defaults of BERT, RoBERTa and ELECTRA); float32 compute or
  threefry dropout masks (which the kernel does not draw) keep XLA's attention."""
  if (length < GPU_FLASH_FROM or str(fields.get("dtype")) != "bfloat16"
      or fields.get("dropout_rng") not in (None, "hash")):
    return {}
  return {"attention_impl": "pallas"}


def explicit_attention(q_BLHK, k_BMHK, v_BMHK, bias_B1LM, key, query_positions_BE, *, rate,
                       rng, length, dtype):
  """Softmax(q k^T / sqrt(K) + bias) with inverted dropout at `rate` on the probabilities
  (`key`, `rng`: `layers.dropout`'s), times v. Scores in `dtype`, the softmax in float32.
  With `query_positions_BE`, q holds only those rows of the `length` queries: the masks are
  the full array's at those rows."""
  scale = jnp.sqrt(q_BLHK.shape[-1]).astype(dtype)
  scores_BHLM = jnp.einsum("BLHK,BMHK->BHLM", q_BLHK, k_BMHK) / scale
  scores_BHLM = scores_BHLM.astype(jnp.float32) + bias_B1LM.astype(jnp.float32)
  probs_BHLM = jax.nn.softmax(scores_BHLM, axis=-1).astype(dtype)
  rows = None if query_positions_BE is None else Rows(2, query_positions_BE, length)
  probs_BHLM = dropout(probs_BHLM, rate, key, rng, rows)
  return jnp.einsum("BHLM,BMHK->BLHK", probs_BHLM, v_BMHK)


def fused_attention(q_BLHK, k_BMHK, v_BMHK, bias_B11M, implementation: str | None):
  """Softmax(q k^T / sqrt(K) + bias) v through jax.nn.dot_product_attention.

  None passes the additive bias as it is (XLA's attention). "xla" and "cudnn" pass what
  cuDNN's fused flash attention accepts, the same values: a padding bias [B, 1, 1, M] as the
  keys' lengths (every bert_jax batch pads at the end: input_mask is a prefix of ones), any
  other bias (packed rows, causal) broadcast to one per query [B, 1, L, M]; for cuDNN, at even
  lengths. cuDNN needs bfloat16 or float16 (BertConfig checks)."""
  if implementation is None:
    return jax.nn.dot_product_attention(q_BLHK, k_BMHK, v_BMHK, bias=bias_B11M)
  batch, length, _, _ = q_BLHK.shape
  keys = k_BMHK.shape[1]
  if bias_B11M.shape[2] == 1:  # padding only: the number of real keys of each row
    # At least one key: a row of padding alone (a filler row of a batch) stays finite.
    lengths_B = jnp.maximum(jnp.sum(bias_B11M[:, 0, 0, :] == 0, axis=-1), 1).astype(jnp.int32)
    bias_B1LM = None
  else:
    lengths_B = None
    bias_B1LM = jnp.broadcast_to(bias_B11M, (batch, 1, length, keys)).astype(q_BLHK.dtype)
  # cuDNN trains at even lengths only: an odd count of queries (e.g. the heads' rows) or keys
  # gets one more, a query nobody reads or a key nobody sees (past every length; bias -inf).
  pad_q, pad_k = (length % 2, keys % 2) if implementation == "cudnn" else (0, 0)
  if pad_q or pad_k:
    q_BLHK = jnp.pad(q_BLHK, ((0, 0), (0, pad_q), (0, 0), (0, 0)))
    k_BMHK, v_BMHK = (jnp.pad(x, ((0, 0), (0, pad_k), (0, 0), (0, 0))) for x in (k_BMHK, v_BMHK))
    if bias_B1LM is not None:
      bias_B1LM = jnp.pad(bias_B1LM, ((0, 0), (0, 0), (0, pad_q), (0, 0)))
      bias_B1LM = jnp.pad(bias_B1LM, ((0, 0), (0, 0), (0, 0), (0, pad_k)),
                          constant_values=NEG_INF)
  out = jax.nn.dot_product_attention(q_BLHK, k_BMHK, v_BMHK, bias=bias_B1LM,
                                     key_value_seq_lengths=lengths_B,
                                     implementation=implementation)
  return out[:, :length]


def flash_attention(q_BLHK, k_BMHK, v_BMHK, bias_B1LM, query_positions_BE, rate, key, causal):
  """bert_jax.flash on the segments the additive bias encodes: padding [B, 1, 1, M] (every
  query sees the real keys), left-to-right (the same, plus causal), or packed rows [B, 1, L, M]
  (a row's segment: the first key it sees; padding rows see padding only: finite, unread)."""
  batch, length = q_BLHK.shape[:2]
  full = k_BMHK.shape[1]
  allowed_BLM = bias_B1LM[:, 0] == 0
  if bias_B1LM.shape[2] == 1 or causal:
    kv_seg_BM = (allowed_BLM[:, 0] if bias_B1LM.shape[2] == 1
                 else jnp.diagonal(allowed_BLM, axis1=1, axis2=2)).astype(jnp.int32)
    q_seg_BL = jnp.ones((batch, length), jnp.int32)
  else:
    kv_seg_BM = jnp.where(allowed_BLM.any(-1), jnp.argmax(allowed_BLM, -1) + 1, 0).astype(jnp.int32)
    q_seg_BL = kv_seg_BM if query_positions_BE is None else jnp.take_along_axis(
        kv_seg_BM, query_positions_BE.astype(jnp.int32), 1)
  positions_BL = (jnp.broadcast_to(jnp.arange(full, dtype=jnp.int32), (batch, full))
                  if query_positions_BE is None else query_positions_BE.astype(jnp.int32))
  keys = None if key is None else flash.hash_keys(key)
  return flash.flash_attention(q_BLHK, k_BMHK, v_BMHK, q_seg_BL, kv_seg_BM, positions_BL, keys,
                               rate=rate, full_length=full, causal=causal)
