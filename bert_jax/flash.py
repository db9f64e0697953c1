"""Flash attention with BERT's attention-probability dropout fused, as Pallas kernels.

`flash_attention(q, k, v, q_segments, kv_segments, q_positions, dropout_keys, rate=...)`:
softmax(q k^T / sqrt(K)) v where a query sees the keys of its own segment (padding and packed
rows), optionally only earlier keys (causal) or those within `window` positions, with inverted
dropout of rate `rate` on the probabilities. Forward and backward (a custom VJP) run in
blocks: the [L, M] probabilities are never written to memory, and the backward recomputes
them and their dropout mask from the counters.

The dropout mask is `hash_bits`'s (bert_jax/models/layers.py), element for element: the
bits of probability (b, h, position, key) are fmix32(fmix32(index ^ k0) + k1) of its
row-major index in the [B, H, full_length, M] array, so this path drops exactly what the
explicit path (`SelfAttention` with `dropout_rng="hash"`) drops for the same key (tested).

Each query block loops over only the key blocks some of its queries read (and each key
block of the backward over only the query blocks that read it): a window, causal order or
packed segments skip the blocks that are wholly masked, which add nothing (exact zeros), so
the results are the same bits as looping over every block. A query that reads no key at all
(padding) gets zeros and passes no gradient: attention over nothing. The ranges come from
each row's keys sorted by (segment, index): O((L + M) log M) work and memory per call, no
[L, M] array (the same bits assume finite inputs: a NaN in a key nobody reads no longer
reaches the result).

Pallas lowers the kernels through Triton on NVIDIA GPUs; on CPU they run in Pallas's
interpret mode (slow: for tests); other backends are refused. Block sizes: 64 x 64 by
default, head dims padded to a power of two. Selected by `model.attention_impl=pallas`
(BERT) and `model.attention=flash` (ModernBERT, EuroBERT).
"""
from __future__ import annotations

import functools
import math

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp
import numpy as np

BATCH_AXES, HEAD_AXES = ("data", "fsdp"), ("tensor",)  # mesh axes (bert_jax/sharding.py)
MASKED = -0.7 * float(np.finfo(np.float32).max)  # a masked score (its probability: exactly 0)


def fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def hash_keys(key: jax.Array) -> jax.Array:
  """The (k0, k1) uint32 pair the dropout hash is keyed by: 64 threefry bits of `key` (what
  `layers.hash_bits` and these kernels both draw)."""
  return jax.random.bits(key, (2,), jnp.uint32)


def _keep(keys, bh, q_pos, k_idx, *, heads, full_length, kv_length, rate):
  """[bq, bk] bool: which probabilities survive dropout (see the module doc). `keys`: (k0,
  k1); `bh`: the program's global (batch, head), read outside the loops (interpret mode
  wants so)."""
  b, h = bh[0].astype(jnp.uint32), bh[1].astype(jnp.uint32)
  row = (b * jnp.uint32(heads) + h) * jnp.uint32(full_length)
  index = ((row + q_pos.astype(jnp.uint32))[:, None] * jnp.uint32(kv_length)
           + k_idx.astype(jnp.uint32)[None, :])
  bits = fmix32(fmix32(index ^ keys[0]) + keys[1])
  return bits >= jnp.uint32(min(round(rate * 2 ** 32), 2 ** 32 - 1))


def _program(keys_ref):
  """(k0, k1) and this program's (batch, head) in the whole array: `keys_ref` holds k0, k1
  and the batch and head offsets of this device's shard."""
  return ((keys_ref[0], keys_ref[1]),
          (pl.program_id(0).astype(jnp.uint32) + keys_ref[2],
           pl.program_id(1).astype(jnp.uint32) + keys_ref[3]))


def _dot(a, b, *, trans_a=False, trans_b=False):
  """a @ b (either side transposed) accumulated in float32: what `pl.dot` did before JAX
  0.11 removed it."""
  dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
  return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _scores(q, k, q_seg, k_seg, q_pos, k_idx, *, scale, causal, window):
  s = _dot(q, k, trans_b=True) * scale
  allowed = q_seg[:, None] == k_seg[None, :]
  if causal:
    allowed &= k_idx[None, :] <= q_pos[:, None]
  if window is not None:
    allowed &= jnp.abs(k_idx[None, :] - q_pos[:, None]) <= window
  return jnp.where(allowed, s, MASKED)


def _forward_kernel(keys_ref, ranges_ref, q_ref, k_ref, v_ref, qseg_ref, qpos_ref, kseg_ref, o_ref,
                    lse_ref, *, cfg):
  q, q_seg, q_pos = q_ref[...], qseg_ref[...], qpos_ref[...]
  bq, bk = q.shape[0], cfg["block_k"]
  keys, bh = _program(keys_ref)

  def body(j, carry):
    acc, m, l = carry
    cols = pl.ds(j * bk, bk)
    k_idx = j * bk + jnp.arange(bk)
    s = _scores(q, k_ref[cols, :], q_seg, kseg_ref[cols], q_pos, k_idx, scale=cfg["scale"],
                causal=cfg["causal"], window=cfg["window"])
    m_new = jnp.maximum(m, s.max(axis=-1))
    correction = jnp.exp(m - m_new)
    # Masked scores are exactly MASKED: 0, also while a row has read no key yet (m still
    # MASKED), so values it never reads cannot overflow its sums before they are cleared.
    p = jnp.where(s == MASKED, 0.0, jnp.exp(s - m_new[:, None]))
    l = l * correction + p.sum(axis=-1)
    if cfg["rate"] > 0:
      keep = _keep(keys, bh, q_pos, k_idx, heads=cfg["heads"], full_length=cfg["full_length"],
                   kv_length=cfg["kv_length"], rate=cfg["rate"])
      p = jnp.where(keep, p / (1.0 - cfg["rate"]), 0.0)
    v = v_ref[cols, :]
    acc = acc * correction[:, None] + _dot(p.astype(v.dtype), v)
    return acc, m_new, l

  init = (jnp.zeros((bq, q.shape[1]), jnp.float32), jnp.full((bq,), MASKED, jnp.float32),
          jnp.zeros((bq,), jnp.float32))
  acc, m, l = lax.fori_loop(ranges_ref[0], ranges_ref[1], body, init)
  # A query that read no key (m never left MASKED): zeros, and an lse that makes its
  # probabilities 0 in the backward pass (no gradient).
  none = m == MASKED
  o_ref[...] = jnp.where(none[:, None], 0.0, acc / jnp.where(none, 1.0, l)[:, None]).astype(
      o_ref.dtype)
  lse_ref[...] = jnp.where(none, jnp.inf, m + jnp.log(jnp.where(none, 1.0, l)))


def _dkv_kernel(keys_ref, ranges_ref, q_ref, k_ref, v_ref, qseg_ref, qpos_ref, kseg_ref, do_ref,
                lse_ref, delta_ref, dk_ref, dv_ref, *, cfg):
  k, v, k_seg = k_ref[...], v_ref[...], kseg_ref[...]
  bk, bq = k.shape[0], cfg["block_q"]
  keys, bh = _program(keys_ref)
  k_idx = pl.program_id(2) * bk + jnp.arange(bk)

  def body(i, carry):
    dk, dv = carry
    rows = pl.ds(i * bq, bq)
    q, do, q_pos = q_ref[rows, :], do_ref[rows, :], qpos_ref[rows]
    s = _scores(q, k, qseg_ref[rows], k_seg, q_pos, k_idx, scale=cfg["scale"],
                causal=cfg["causal"], window=cfg["window"])
    p = jnp.exp(s - lse_ref[rows][:, None])
    dp = _dot(do, v, trans_b=True)
    if cfg["rate"] > 0:
      keep = _keep(keys, bh, q_pos, k_idx, heads=cfg["heads"], full_length=cfg["full_length"],
                   kv_length=cfg["kv_length"], rate=cfg["rate"])
      p_dropped = jnp.where(keep, p / (1.0 - cfg["rate"]), 0.0)
      dp = jnp.where(keep, dp / (1.0 - cfg["rate"]), 0.0)
    else:
      p_dropped = p
    dv = dv + _dot(p_dropped.astype(do.dtype), do, trans_a=True)
    ds = jnp.where(s == MASKED, 0.0, p * (dp - delta_ref[rows][:, None]))
    dk = dk + _dot(ds.astype(q.dtype), q, trans_a=True) * cfg["scale"]
    return dk, dv

  zeros = jnp.zeros(k.shape, jnp.float32)
  dk, dv = lax.fori_loop(ranges_ref[0], ranges_ref[1], body, (zeros, zeros))
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(keys_ref, ranges_ref, q_ref, k_ref, v_ref, qseg_ref, qpos_ref, kseg_ref, do_ref,
               lse_ref, delta_ref, dq_ref, *, cfg):
  q, do, q_seg, q_pos = q_ref[...], do_ref[...], qseg_ref[...], qpos_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  bk = cfg["block_k"]
  keys, bh = _program(keys_ref)

  def body(j, dq):
    cols = pl.ds(j * bk, bk)
    k, v = k_ref[cols, :], v_ref[cols, :]
    k_idx = j * bk + jnp.arange(bk)
    s = _scores(q, k, q_seg, kseg_ref[cols], q_pos, k_idx, scale=cfg["scale"],
                causal=cfg["causal"], window=cfg["window"])
    p = jnp.exp(s - lse[:, None])
    dp = _dot(do, v, trans_b=True)
    if cfg["rate"] > 0:
      keep = _keep(keys, bh, q_pos, k_idx, heads=cfg["heads"], full_length=cfg["full_length"],
                   kv_length=cfg["kv_length"], rate=cfg["rate"])
      dp = jnp.where(keep, dp / (1.0 - cfg["rate"]), 0.0)
    ds = jnp.where(s == MASKED, 0.0, p * (dp - delta[:, None]))
    return dq + _dot(ds.astype(k.dtype), k) * cfg["scale"]

  dq = lax.fori_loop(ranges_ref[0], ranges_ref[1], body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = dq.astype(dq_ref.dtype)


def _specs(cfg, lp: int, mp: int, along: str):
  """BlockSpecs of (keys, ranges, q, k, v, q_seg, q_pos, kv_seg, do, lse, delta) for a grid over
  (batch, head, query blocks) or (batch, head, key blocks); `ranges`: the program's block's
  row of `_block_ranges`."""
  K, bq, bk = cfg["head_dim"], cfg["block_q"], cfg["block_k"]
  keys = pl.BlockSpec((4,), lambda b, h, i: (0,))
  ranges = pl.BlockSpec((None, None, 2), lambda b, h, i: (b, i, 0))
  if along == "q":
    q_rows = pl.BlockSpec((None, bq, None, K), lambda b, h, i: (b, i, h, 0))
    q_vec = pl.BlockSpec((None, bq), lambda b, h, i: (b, i))
    stat = pl.BlockSpec((None, None, bq), lambda b, h, i: (b, h, i))
    kv_rows = pl.BlockSpec((None, mp, None, K), lambda b, h, i: (b, 0, h, 0))
    kv_vec = pl.BlockSpec((None, mp), lambda b, h, i: (b, 0))
  else:
    q_rows = pl.BlockSpec((None, lp, None, K), lambda b, h, j: (b, 0, h, 0))
    q_vec = pl.BlockSpec((None, lp), lambda b, h, j: (b, 0))
    stat = pl.BlockSpec((None, None, lp), lambda b, h, j: (b, h, 0))
    kv_rows = pl.BlockSpec((None, bk, None, K), lambda b, h, j: (b, j, h, 0))
    kv_vec = pl.BlockSpec((None, bk), lambda b, h, j: (b, j))
  return dict(keys=keys, ranges=ranges, q=q_rows, k=kv_rows, v=kv_rows, q_seg=q_vec,
              q_pos=q_vec, kv_seg=kv_vec, do=q_rows, lse=stat, delta=stat)


@functools.lru_cache(maxsize=None)
def _attention(cfg_items: tuple):
  """The custom-VJP attention of one static configuration (on padded inputs)."""
  cfg = dict(cfg_items)
  # Triton's lowering (the default GPU lowering of this JAX is Mosaic GPU, whose copies want
  # whole warpgroups): 4 warps for head dims up to 64, 8 above.
  params = plgpu.CompilerParams(num_warps=4 if cfg["head_dim"] <= 64 else 8, num_stages=2)
  call = functools.partial(pl.pallas_call, interpret=cfg["interpret"], compiler_params=params)

  def forward(q, k, v, q_seg, kv_seg, q_pos, keys, q_ranges):
    B, lp, H, K = q.shape
    mp = k.shape[1]
    s = _specs(cfg, lp, mp, "q")
    o, lse = call(
        functools.partial(_forward_kernel, cfg=cfg), grid=(B, H, lp // cfg["block_q"]),
        in_specs=[s["keys"], s["ranges"], s["q"], s["k"], s["v"], s["q_seg"], s["q_pos"],
                  s["kv_seg"]],
        out_specs=[s["q"], s["lse"]],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((B, H, lp), jnp.float32)],
    )(keys, q_ranges, q, k, v, q_seg, q_pos, kv_seg)
    return o, lse

  @jax.custom_vjp
  def attention(q, k, v, q_seg, kv_seg, q_pos, keys, q_ranges, k_ranges):
    del k_ranges
    return forward(q, k, v, q_seg, kv_seg, q_pos, keys, q_ranges)[0]

  def fwd(q, k, v, q_seg, kv_seg, q_pos, keys, q_ranges, k_ranges):
    o, lse = forward(q, k, v, q_seg, kv_seg, q_pos, keys, q_ranges)
    return o, (q, k, v, q_seg, kv_seg, q_pos, keys, q_ranges, k_ranges, o, lse)

  def bwd(res, do):
    q, k, v, q_seg, kv_seg, q_pos, keys, q_ranges, k_ranges, o, lse = res
    B, lp, H, K = q.shape
    mp = k.shape[1]
    delta = jnp.einsum("blhk,blhk->bhl", o.astype(jnp.float32), do.astype(jnp.float32))
    args = (q, k, v, q_seg, q_pos, kv_seg, do, lse, delta)
    names = ("keys", "ranges", "q", "k", "v", "q_seg", "q_pos", "kv_seg", "do", "lse", "delta")
    sk = _specs(cfg, lp, mp, "k")
    dk, dv = call(functools.partial(_dkv_kernel, cfg=cfg), grid=(B, H, mp // cfg["block_k"]),
                  in_specs=[sk[n] for n in names], out_specs=[sk["k"], sk["v"]],
                  out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                             jax.ShapeDtypeStruct(v.shape, v.dtype)])(keys, k_ranges, *args)
    sq = _specs(cfg, lp, mp, "q")
    dq = call(functools.partial(_dq_kernel, cfg=cfg), grid=(B, H, lp // cfg["block_q"]),
              in_specs=[sq[n] for n in names], out_specs=sq["q"],
              out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype))(keys, q_ranges, *args)
    return dq, dk, dv, None, None, None, None, None, None

  attention.defvjp(fwd, bwd)
  return attention


def _interval(mask):
  """[..., n] bool -> (lo, hi): the first True and one past the last (0, 0 where none)."""
  n, some = mask.shape[-1], mask.any(-1)
  lo, hi = jnp.argmax(mask, -1), n - jnp.argmax(mask[..., ::-1], -1)
  return jnp.where(some, lo, 0), jnp.where(some, hi, 0)


def _lower_bound(sorted_seg, sorted_idx, seg, idx):
  """[B, L]: how many of each row's keys, sorted by (segment, index) into `sorted_seg` and
  `sorted_idx` [B, M], come before (seg, idx) [B, L]: a vectorised binary search."""
  m = sorted_seg.shape[1]
  lo, hi = jnp.zeros(seg.shape, jnp.int32), jnp.full(seg.shape, m, jnp.int32)
  for _ in range(max(1, m.bit_length())):
    mid = (lo + hi) // 2
    at = jnp.minimum(mid, m - 1)
    s_mid = jnp.take_along_axis(sorted_seg, at, 1)
    i_mid = jnp.take_along_axis(sorted_idx, at, 1)
    before = (s_mid < seg) | ((s_mid == seg) & (i_mid < idx))
    lo, hi = jnp.where((lo < hi) & before, mid + 1, lo), jnp.where((lo < hi) & ~before, mid, hi)
  return lo


def _keys_read(q_seg, kv_seg, q_pos, *, causal: bool, window):
  """(first, last) [B, L]: the first and last key each query reads (a key of its segment,
  within its window and causal bound), first > last where it reads none. Sorting the keys
  by (segment, index) makes it O((L + M) log M), no [L, M] array."""
  m = kv_seg.shape[1]
  idx = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), kv_seg.shape)
  sorted_seg, sorted_idx = lax.sort((kv_seg, idx), dimension=1, num_keys=2)
  window = None if window is None else min(window, m)  # no int32 overflow below
  lo = jnp.zeros_like(q_pos) if window is None else jnp.maximum(q_pos - window, 0)
  hi = jnp.full_like(q_pos, m - 1) if window is None else jnp.minimum(q_pos + window, m - 1)
  if causal:
    hi = jnp.minimum(hi, q_pos)
  at = lambda i: jnp.take_along_axis(sorted_idx, jnp.clip(i, 0, m - 1), 1)
  same = lambda i: (i >= 0) & (i < m) & (jnp.take_along_axis(sorted_seg, jnp.clip(i, 0, m - 1),
                                                             1) == q_seg)
  first = _lower_bound(sorted_seg, sorted_idx, q_seg, lo)
  last = _lower_bound(sorted_seg, sorted_idx, q_seg, hi + 1) - 1
  first = jnp.where(same(first), at(first), m)
  last = jnp.where(same(last), at(last), -1)
  return first, jnp.where(first <= hi, last, -1)


def _block_ranges(q_seg, kv_seg, q_pos, bq: int, bk: int, *, causal: bool, window,
                  length: int | None = None):
  """(q_ranges [B, Lp/bq, 2], k_ranges [B, Mp/bk, 2]) int32: the key blocks each query block
  loops over (forward, dq) and the query blocks each key block loops over (dk, dv), as
  ranges [lo, hi) of block numbers. A query block visits the key blocks from the first to
  the last key its queries read; a key block, the query blocks whose range holds it. Queries
  that read no key, and those from `length` on (rows padded to whole blocks), need none."""
  B, lp = q_seg.shape
  nq, nk = lp // bq, kv_seg.shape[1] // bk
  first, last = _keys_read(q_seg, kv_seg, q_pos, causal=causal, window=window)
  reads = (jnp.arange(lp) < (lp if length is None else length)) & (first <= last)
  big = jnp.iinfo(jnp.int32).max
  lo = jnp.where(reads, first // bk, big).reshape(B, nq, bq).min(-1)
  hi = jnp.where(reads, last // bk + 1, 0).reshape(B, nq, bq).max(-1)
  lo = jnp.where(lo < hi, lo, 0)  # (0, 0) where no query of the block reads a key
  j = jnp.arange(nk)[None, :, None]
  k_lo, k_hi = _interval((lo[:, None, :] <= j) & (j < hi[:, None, :]))  # [B, nk]
  return (jnp.stack([lo, hi], -1).astype(jnp.int32),
          jnp.stack([k_lo, k_hi], -1).astype(jnp.int32))


def _block(n: int, block: int) -> int:
  """A power-of-two block of at most `block`, at least 16 (Triton's smallest dot)."""
  return max(16, min(block, pl.next_power_of_2(n)))


def flash_attention(q_BLHK, k_BMHK, v_BMHK, q_segments_BL, kv_segments_BM, q_positions_BL,
                    dropout_keys=None, *, rate: float = 0.0, full_length: int | None = None,
                    causal: bool = False, window: int | None = None, block_q: int = 64,
                    block_k: int = 64, interpret: bool | None = None,
                    skip_blocks: bool = True) -> jax.Array:
  """Attention of queries [B, L, H, K] over keys and values [B, M, H, K] (see the module doc).

  q_segments_BL / kv_segments_BM: int; a query sees the keys of equal segment. q_positions_BL:
  each query's position among the M keys (the causal and window masks, and the dropout
  counters: `full_length` rows in all, default M). dropout_keys: uint32 [2] (`hash_keys` of the
  dropout key), needed when rate > 0. skip_blocks=False loops over every block pair (the
  same values; for tests and timing). A query that reads no key gets zeros and passes no
  gradient (the masked softmax's reference gives the mean of the values: a row the models
  never read)."""
  B, L, H, K = q_BLHK.shape
  M = k_BMHK.shape[1]
  if rate > 0 and dropout_keys is None:
    raise ValueError("flash_attention with dropout needs dropout_keys (uint32 [2]).")
  full = M if full_length is None else full_length
  if math.prod((B, H, full, M)) >= 2 ** 32:
    raise ValueError(f"dropout counters are uint32; [B, H, L, M] = {(B, H, full, M)} has too many.")
  bq, bk = _block(L, block_q), _block(M, block_k)
  lp, mp = -(-L // bq) * bq, -(-M // bk) * bk
  kp = pl.next_power_of_2(K)
  pad = lambda x, n, k=K: jnp.pad(x, ((0, 0), (0, n - x.shape[1]), (0, 0), (0, kp - k)))
  q, k, v = pad(q_BLHK, lp), pad(k_BMHK, mp), pad(v_BMHK, mp)
  # Padded queries and keys get segments that match nothing (their rows are dropped).
  q_seg = jnp.pad(q_segments_BL.astype(jnp.int32), ((0, 0), (0, lp - L)), constant_values=-1)
  kv_seg = jnp.pad(kv_segments_BM.astype(jnp.int32), ((0, 0), (0, mp - M)), constant_values=-2)
  q_pos = jnp.pad(q_positions_BL.astype(jnp.int32), ((0, 0), (0, lp - L)))
  if skip_blocks:
    q_ranges, k_ranges = _block_ranges(q_seg, kv_seg, q_pos, bq, bk, causal=causal,
                                       window=window, length=L)
  else:
    every = lambda n, blocks: jnp.broadcast_to(jnp.array([0, n], jnp.int32), (B, blocks, 2))
    q_ranges, k_ranges = every(mp // bk, lp // bq), every(lp // bq, mp // bk)
  keys = jnp.zeros((4,), jnp.uint32)  # k0, k1, batch offset, head offset (set per shard)
  if dropout_keys is not None:
    keys = keys.at[:2].set(jnp.asarray(dropout_keys, jnp.uint32))
  if jax.default_backend() not in ("gpu", "cpu"):
    raise ValueError(f"bert_jax.flash is a GPU kernel (Triton); on {jax.default_backend()} use "
                     "XLA's attention (model.attention_impl unset) or, for ModernBERT on TPU, "
                     "model.attention=splash.")
  cfg = dict(scale=1.0 / math.sqrt(K), rate=float(rate), heads=H, full_length=full, kv_length=M,
             block_q=bq, block_k=bk, head_dim=kp, causal=causal, window=window)
  kernel = lambda interp: _attention(tuple(sorted(dict(cfg, interpret=interp).items())))
  if interpret is None:  # chosen when the program is lowered: Triton for CUDA, else Pallas's
    # interpreter (the same maths; on CPU, for tests)
    attention = lambda *args: lax.platform_dependent(*args, cuda=kernel(False),
                                                     default=kernel(True))
  else:
    attention = kernel(interpret)
  return _per_shard(attention, B, H)(q, k, v, q_seg, kv_seg, q_pos, keys, q_ranges,
                                     k_ranges)[:, :L, :, :K]


def _per_shard(attention, batch: int, heads: int):
  """`attention` run on each device's rows and heads when the mesh splits them (the
  partitioner cannot split a kernel call), its dropout counters the whole array's (the
  shard's offsets in keys[2:]); `attention` itself otherwise."""
  mesh = jax.sharding.get_abstract_mesh()
  split = lambda names, n: tuple(a for a in names if a in mesh.axis_names and mesh.shape[a] > 1
                                 and n % mesh.shape[a] == 0)
  batch_axes, head_axes = split(BATCH_AXES, batch), split(HEAD_AXES, heads)
  if not (batch_axes or head_axes):
    return attention

  def local(q, k, v, q_seg, kv_seg, q_pos, keys, q_ranges, k_ranges):
    offsets = [lax.axis_index(axes) * n if axes else 0
               for axes, n in ((batch_axes, q.shape[0]), (head_axes, q.shape[2]))]
    keys = keys.at[2:].set(jnp.asarray(offsets, jnp.int32).astype(jnp.uint32))
    return attention(q, k, v, q_seg, kv_seg, q_pos, keys, q_ranges, k_ranges)
  P = jax.sharding.PartitionSpec
  rows = P(batch_axes or None, None, head_axes or None, None)
  vec = P(batch_axes or None, None)
  blocks = P(batch_axes or None, None, None)
  return jax.shard_map(local, mesh=mesh,
                       in_specs=(rows, rows, rows, vec, vec, vec, P(), blocks, blocks),
                       out_specs=rows, check_vma=False)
