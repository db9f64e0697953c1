"""The modern encoders' attention computations, functions of queries, keys, values and the
rows' example ids (`Attention` in modern.py chooses among them with `model.attention`):
rotary position embedding (`rope`); the XLA reference over every L x L score
(`dense_attention`); local (sliding-window) layers over their band only (`banded_attention`);
global layers on packed rows over only the block pairs that share an example
(`packed_global_attention`); and the Pallas kernels (`splash_attention` for TPU,
`flash_attention`: bert_jax.flash, for GPU).

Local layers compute only their band: the sequence is cut into blocks at least half a window
long and each query block reads its own and the two neighbouring key blocks, so their cost
grows with L x window, not L x L. Padding (example id 0) reads and is read by nothing.

Axis legend as in bert.py, plus G = key/value heads (grouped-query attention), N = blocks,
W = block length.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from bert_jax import flash
from bert_jax.models.layers import NEG_INF


def rope(x_BLHK: jax.Array, positions_BL: jax.Array, theta: float) -> jax.Array:
  """Rotary position embedding, transformers' layout (the two halves of the head dim
  rotate together), computed in float32."""
  k = x_BLHK.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, k, 2, dtype=jnp.float32) / k))
  angles_BLk = positions_BL.astype(jnp.float32)[..., None] * inv_freq
  angles_BLK = jnp.concatenate([angles_BLk, angles_BLk], -1)[:, :, None, :]
  x = x_BLHK.astype(jnp.float32)
  half = jnp.concatenate([-x[..., k // 2:], x[..., :k // 2]], -1)
  return (x * jnp.cos(angles_BLK) + half * jnp.sin(angles_BLK)).astype(x_BLHK.dtype)


def _attend(q_BLHK, k_BMGK, v_BMGK, allowed_BLM, dtype, dropout=None):
  """Softmax attention where `allowed` [B, L, M] (or [B, N, W, M'] blocks) is true; grouped
  keys/values (G divides H). Head-major einsums, the mask as an additive bias; scores and
  softmax in float32 (on XLA:CPU this is ~20% faster than jax.nn.dot_product_attention's
  XLA path at L=1024: bench/RESULTS.md)."""
  h, g = q_BLHK.shape[-2], k_BMGK.shape[-2]
  lead = q_BLHK.ndim - 3  # batch (and block) dims
  heads = lambda x: jnp.moveaxis(x, -2, lead)  # [..., L, H, K] -> [..., H, L, K]
  q = heads(q_BLHK).reshape(q_BLHK.shape[:lead] + (g, h // g) + q_BLHK.shape[-3:-2]
                            + q_BLHK.shape[-1:])
  k_GMK, v_GMK = heads(k_BMGK), heads(v_BMGK)
  bias = jnp.where(allowed_BLM, 0.0, NEG_INF)[..., None, None, :, :]
  scores = jnp.einsum("...GRLK,...GMK->...GRLM", q, k_GMK).astype(jnp.float32)
  probs = jax.nn.softmax(scores * (1.0 / math.sqrt(q_BLHK.shape[-1])) + bias, axis=-1)
  probs = probs.astype(dtype)
  if dropout is not None:
    probs = dropout(probs)
  ctx = jnp.einsum("...GRLM,...GMK->...GRLK", probs, v_GMK)
  ctx = ctx.reshape(ctx.shape[:lead] + (h,) + ctx.shape[-2:])
  return jnp.moveaxis(ctx, lead, -2)


def allowed_keys(seg_q, seg_k, pos_q, pos_k, half_window):
  """Which keys a query reads: same example (segment id > 0: padding reads nothing and is
  read by nothing), and within `half_window` positions when given."""
  ok = (seg_q[..., :, None] == seg_k[..., None, :]) & (seg_k[..., None, :] > 0)
  if half_window is not None:
    ok &= jnp.abs(pos_q[..., :, None] - pos_k[..., None, :]) <= half_window
  return ok


def _blocks(x, n, w):
  """[B, L, ...] -> [B, N, W, ...] (L padded to N * W)."""
  pad = n * w - x.shape[1]
  x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  return x.reshape((x.shape[0], n, w) + x.shape[2:])


def _neighbours(x_BNW):
  """[B, N, W, ...] -> [B, N, 3W, ...]: each block with the one before and after (zeros
  past the ends)."""
  pad = [(0, 0), (1, 1)] + [(0, 0)] * (x_BNW.ndim - 2)
  p = jnp.pad(x_BNW, pad)
  return jnp.concatenate([p[:, :-2], p[:, 1:-1], p[:, 2:]], axis=2)


def banded_attention(q_BLHK, k_BLGK, v_BLGK, segment_ids_BL, half_window, dtype, dropout=None):
  """Local attention computing only the band: blocks of W >= half_window queries read
  3W keys (their block and its neighbours), masked to |i - j| <= half_window within one
  example. Executed score FLOPs: 3W/L of dense."""
  batch, length = segment_ids_BL.shape
  w = min(half_window, length)
  n = -(-length // w)
  pos_BL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  seg_BNW, pos_BNW = _blocks(segment_ids_BL, n, w), _blocks(pos_BL, n, w)
  allowed = allowed_keys(seg_BNW, _neighbours(seg_BNW), pos_BNW, _neighbours(pos_BNW), half_window)
  k_BNMGK, v_BNMGK = _neighbours(_blocks(k_BLGK, n, w)), _neighbours(_blocks(v_BLGK, n, w))
  ctx = _attend(_blocks(q_BLHK, n, w), k_BNMGK, v_BNMGK, allowed, dtype, dropout)
  return ctx.reshape((batch, n * w) + ctx.shape[3:])[:, :length]


def _segment_range(seg_BNW):
  """[B, N, W] segment ids -> the lowest and highest example id (> 0) in each block; an
  all-padding block gets an empty range (lo > hi)."""
  big = jnp.iinfo(jnp.int32).max
  lo = jnp.min(jnp.where(seg_BNW > 0, seg_BNW, big), -1)
  hi = jnp.max(jnp.where(seg_BNW > 0, seg_BNW, 0), -1)
  return lo, hi


def block_pairs_needed(segment_ids_BL, block: int) -> jax.Array:
  """[B, N, N]: which query/key block pairs share an example. Examples are contiguous, so a
  block holds a contiguous range of example ids; two blocks interact when ranges overlap."""
  length = segment_ids_BL.shape[1]
  w = min(block, length)
  lo, hi = _segment_range(_blocks(segment_ids_BL, -(-length // w), w))
  return (jnp.maximum(lo[:, :, None], lo[:, None, :])
          <= jnp.minimum(hi[:, :, None], hi[:, None, :]))


def block_pair_attention(q_BLHK, k_BLGK, v_BLGK, segment_ids_BL, need_BNN, pairs: int,
                         block: int, dtype):
  """Attention computed over the first `pairs` needed block pairs only (gathered; unused
  slots masked), the softmax over each query's pairs in float32 through segment max / sum.
  Exact when the pairs cover every needed one (packed_global_attention checks)."""
  batch, length = segment_ids_BL.shape
  w = min(block, length)
  n = -(-length // w)
  seg_BNW = _blocks(segment_ids_BL, n, w)
  b, i, j = jnp.nonzero(need_BNN, size=pairs, fill_value=0)
  valid = jnp.arange(pairs) < jnp.sum(need_BNN)
  q_PWHK = _blocks(q_BLHK, n, w)[b, i]
  k_PWGK, v_PWGK = _blocks(k_BLGK, n, w)[b, j], _blocks(v_BLGK, n, w)[b, j]
  sq, sk = seg_BNW[b, i], seg_BNW[b, j]
  allowed = (sq[:, :, None] == sk[:, None, :]) & (sk[:, None, :] > 0) & valid[:, None, None]
  h, g = q_PWHK.shape[-2], k_PWGK.shape[-2]
  q = q_PWHK.reshape(q_PWHK.shape[:-2] + (g, h // g, q_PWHK.shape[-1]))
  scores = jnp.einsum("PLGRK,PMGK->PGRLM", q, k_PWGK).astype(jnp.float32)
  scores = jnp.where(allowed[:, None, None], scores / math.sqrt(q.shape[-1]), NEG_INF)
  group = b * n + i  # the query block of each pair
  top = jax.ops.segment_max(scores.max(-1), group, num_segments=batch * n)
  e = jnp.where(allowed[:, None, None], jnp.exp(scores - top[group][..., None]), 0.0)
  denom = jax.ops.segment_sum(e.sum(-1), group, num_segments=batch * n)  # [BN, G, R, L]
  numer = jax.ops.segment_sum(jnp.einsum("PGRLM,PMGK->PGRLK", e.astype(dtype), v_PWGK)
                              .astype(jnp.float32), group, num_segments=batch * n)
  ctx = numer / jnp.maximum(denom, 1e-30)[..., None]  # padding queries: 0
  ctx = ctx.reshape(batch, n, g, h // g, w, -1).transpose(0, 1, 4, 2, 3, 5)
  return ctx.reshape(batch, n * w, h, -1)[:, :length].astype(dtype)


def packed_global_attention(q_BLHK, k_BLGK, v_BLGK, segment_ids_BL, dtype, block: int,
                            budget: float):
  """Global attention over packed rows computing only the block pairs that share an
  example (block_pairs_needed), gathered into a static budget of `budget` x all B x N x N
  pairs; a batch that needs more takes the dense path (lax.cond: exact either way, one
  branch executed). Executed score FLOPs: `budget` of dense when the batch fits."""
  batch, length = segment_ids_BL.shape
  n = -(-length // min(block, length))
  pairs = max(1, int(math.ceil(budget * batch * n * n)))
  dense = lambda: dense_attention(q_BLHK, k_BLGK, v_BLGK, segment_ids_BL, None, dtype)
  if pairs >= batch * n * n:
    return dense()
  need_BNN = block_pairs_needed(segment_ids_BL, block)
  return jax.lax.cond(jnp.sum(need_BNN) <= pairs, lambda: block_pair_attention(
      q_BLHK, k_BLGK, v_BLGK, segment_ids_BL, need_BNN, pairs, block, dtype), dense)


def dense_attention(q_BLHK, k_BLGK, v_BLGK, segment_ids_BL, half_window, dtype, dropout=None):
  """The reference: every L x L score, masked (to the band when `half_window`)."""
  pos_BL = jnp.broadcast_to(jnp.arange(segment_ids_BL.shape[1], dtype=jnp.int32),
                            segment_ids_BL.shape)
  allowed = allowed_keys(segment_ids_BL, segment_ids_BL, pos_BL, pos_BL, half_window)
  return _attend(q_BLHK, k_BLGK, v_BLGK, allowed, dtype, dropout)


SPLASH_BLOCK = 512  # splash's query/key block (the sequence is padded to a multiple)
BATCH_AXES = flash.BATCH_AXES  # mesh axes the rows are split over (bert_jax/sharding.py)


def splash_attention(q_BLHK, k_BLGK, v_BLGK, segment_ids_BL, half_window, dtype):
  """The Pallas splash-attention kernel (jax.experimental.pallas.ops.tpu): blocks outside a
  local layer's band are skipped by its static mask, packed examples kept apart by segment
  ids. Compiled for TPU; interpreted on other backends (slow: for tests). Grouped keys and
  values are repeated to the query heads; the sequence is padded to whole blocks with
  segment 0, which no real token reads."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # pylint: disable=g-import-not-at-top  (Pallas: only this path)
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm  # pylint: disable=g-import-not-at-top
  batch, length, h, k = q_BLHK.shape
  block = min(SPLASH_BLOCK, -(-length // 128) * 128)
  padded = -(-length // block) * block
  pad = lambda x: jnp.pad(x, [(0, 0), (0, padded - length)] + [(0, 0)] * (x.ndim - 2))
  heads = lambda x: jnp.repeat(x, h // x.shape[2], axis=2).transpose(0, 2, 1, 3)  # [B, H, L, K]
  q = heads(pad(q_BLHK * jnp.asarray(1.0 / math.sqrt(k), q_BLHK.dtype)))
  kk, v = heads(pad(k_BLGK)), heads(pad(v_BLGK))
  seg = pad(segment_ids_BL.astype(jnp.int32))
  shape = (padded, padded)
  one = (sm.FullMask(shape) if half_window is None
         else sm.LocalMask(shape, window_size=(half_window, half_window), offset=0))
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                        block_q_dq=block, block_kv_dq=block)
  kernel = sk.make_splash_mha(sm.MultiHeadMask([one] * h), head_shards=1, q_seq_shards=1,
                              block_sizes=sizes, interpret=jax.default_backend() != "tpu")
  run = jax.vmap(lambda q1, k1, v1, s1: kernel(q1, k1, v1, segment_ids=sk.SegmentIds(s1, s1)))
  mesh = jax.sharding.get_abstract_mesh()
  axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names and mesh.shape[a] > 1)
  if axes and batch % math.prod(mesh.shape[a] for a in axes) == 0:
    # A kernel runs on each device's rows (the partitioner cannot split a kernel call).
    spec = jax.sharding.PartitionSpec(axes)
    run = jax.shard_map(run, mesh=mesh, in_specs=(spec,) * 4, out_specs=spec, check_vma=False)
  return run(q, kk, v, seg).transpose(0, 2, 1, 3)[:, :length].astype(dtype)


def flash_attention(q_BLHK, k_BLGK, v_BLGK, segment_ids_BL, half_window, rate=0.0, key=None):
  """bert_jax.flash over a row's examples (padding, segment 0, reads and is read by nothing:
  its rows are zeros, unread), within `half_window` positions when given; grouped keys
  and values repeated to the query heads. With `rate`, the probabilities' dropout draws
  `dense_attention`'s masks for the same key (dropout_rng "hash")."""
  h, g = q_BLHK.shape[2], k_BLGK.shape[2]
  if g != h:
    k_BLGK, v_BLGK = jnp.repeat(k_BLGK, h // g, axis=2), jnp.repeat(v_BLGK, h // g, axis=2)
  batch, length = segment_ids_BL.shape
  seg = segment_ids_BL.astype(jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  keys = None if key is None or rate == 0 else flash.hash_keys(key)
  return flash.flash_attention(q_BLHK, k_BLGK, v_BLGK, jnp.where(seg > 0, seg, -1), seg,
                               positions, keys, rate=rate, window=half_window)


def attention_flops(cfg: Any, seq_len: int, executed: bool = False) -> int:
  """Score and weighted-sum FLOPs of all the layers of a modern encoder over one sequence:
  global layers every L x L pair, local layers their band (2 * (window // 2) + 1 keys per
  query). `executed`: what the banded implementation computes (modern.banded_attention's 3
  blocks of at least window // 2 keys; over packed rows, global layers the budgeted share
  of block pairs, modern.packed_global_attention, when the batch fits it)."""
  L, D = seq_len, cfg.num_heads * cfg.head_dim
  half = cfg.local_window // 2
  block = min(half, L)
  # Executed: each of the n padded blocks' queries reads 3 blocks of keys.
  band = 3 * block * (-(-L // block) * block) / L if executed else min(L, 2 * half + 1)
  budget = cfg.global_block_budget if executed and 0 < cfg.global_block_budget < 1 else 1.0
  keys = [L * budget if cfg.is_global(i) else band for i in range(cfg.num_layers)]
  return int(sum(4 * L * k * D for k in keys))
