"""bert_jax.flash: the Pallas flash-attention kernels (interpret mode on CPU) against the
explicit maths: values, gradients, and dropout masks element for element."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import flash
from bert_jax.models import bert as model_lib
from bert_jax.models import layers as layers_lib
from bert_jax.models import modern
from tests import test_fused_attention
from tests import test_train_utils as tu


def _qkv(b=2, l=24, h=2, k=16, m=None, seed=0):
  rng = np.random.default_rng(seed)
  shape = lambda n: (b, n, h, k)
  return (jnp.asarray(rng.standard_normal(shape(l)), jnp.float32),
          jnp.asarray(rng.standard_normal(shape(m or l)), jnp.float32),
          jnp.asarray(rng.standard_normal(shape(m or l)), jnp.float32))


def _reference(q, k, v, allowed_BLM, rate=0.0, key=None):
  s = jnp.einsum("blhk,bmhk->bhlm", q, k) / np.sqrt(q.shape[-1])
  p = jax.nn.softmax(jnp.where(allowed_BLM[:, None], s, layers_lib.NEG_INF), -1)
  if rate:
    p = layers_lib.dropout(p, rate, key, "hash")
  return jnp.einsum("bhlm,bmhk->blhk", p, v)


def _check(got_fn, want_fn, args, rows, tol=2e-5):
  got, want = got_fn(*args), want_fn(*args)
  np.testing.assert_allclose(np.asarray(got)[rows], np.asarray(want)[rows], atol=tol)
  w = jnp.asarray(np.random.default_rng(9).standard_normal(want.shape), jnp.float32) * rows[..., None, None]
  g_got = jax.grad(lambda *a: jnp.sum(got_fn(*a) * w), argnums=(0, 1, 2))(*args)
  g_want = jax.grad(lambda *a: jnp.sum(want_fn(*a) * w), argnums=(0, 1, 2))(*args)
  for name, a, b in zip("qkv", g_got, g_want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, err_msg=f"d{name}")


def test_padding_and_dropout_equal_the_explicit_masks():
  """Keys past each row's length are masked; dropout 0.3 drops exactly model.hash_bits's
  probabilities for the same key (values and gradients of q, k, v)."""
  q, k, v = _qkv()
  mask = (np.arange(24)[None] < np.array([24, 13])[:, None]).astype(np.int32)
  key = jax.random.key(3)
  keys = jax.random.bits(key, (2,), jnp.uint32)
  pos = jnp.broadcast_to(jnp.arange(24), (2, 24))
  got = lambda q, k, v: flash.flash_attention(q, k, v, jnp.ones((2, 24), jnp.int32), mask, pos,
                                              keys, rate=0.3)
  want = lambda q, k, v: _reference(q, k, v, np.broadcast_to(mask[:, None] > 0, (2, 24, 24)),
                                    0.3, key)
  _check(got, want, (q, k, v), mask > 0)
  # No dropout: a different function (the masks above were really applied).
  plain = flash.flash_attention(q, k, v, jnp.ones((2, 24), jnp.int32), mask, pos)
  assert np.abs(np.asarray(plain) - np.asarray(got(q, k, v)))[mask > 0].max() > 1e-2


@pytest.mark.parametrize("window,causal", [(None, False), (3, False), (None, True)])
def test_packed_segments_windows_and_causal(window, causal):
  q, k, v = _qkv(b=1, l=40, k=8)
  seg = np.array([[1] * 17 + [2] * 15 + [0] * 8])
  pos = np.arange(40)
  allowed = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
  if window is not None:
    allowed &= np.abs(pos[:, None] - pos[None, :]) <= window
  if causal:
    allowed &= pos[None, :] <= pos[:, None]
  got = lambda q, k, v: flash.flash_attention(
      q, k, v, np.where(seg > 0, seg, -1), seg, pos[None], window=window, causal=causal,
      block_q=16, block_k=16)
  _check(got, lambda q, k, v: _reference(q, k, v, allowed), (q, k, v), seg > 0)


def test_fewer_queries_than_keys_at_their_positions():
  """The pre-training heads' last layer: queries at some positions of the row, keys all of it;
  dropout counters at those positions (the full [B, H, L, M] draw's rows)."""
  q, k, v = _qkv(b=2, l=24)
  at = np.array([[0, 3, 7, 20, 21], [0, 1, 2, 5, 8]])
  key = jax.random.key(1)
  keys = jax.random.bits(key, (2,), jnp.uint32)
  ones = jnp.ones((2, 5), jnp.int32)
  got = lambda q, k, v: flash.flash_attention(q, k, v, ones, jnp.ones((2, 24), jnp.int32),
                                              at, keys, rate=0.2)
  want_full = lambda q, k, v: _reference(q, k, v, np.ones((2, 24, 24), bool), 0.2, key)
  rows = jnp.asarray(at)[:, :, None, None]
  want = lambda q, k, v: jnp.take_along_axis(want_full(q, k, v), rows, 1)
  q5 = jnp.take_along_axis(q, rows, 1)
  # Queries given at their positions equal the full computation's rows there.
  np.testing.assert_allclose(np.asarray(got(q5, k, v)), np.asarray(want(q, k, v)), atol=2e-5)


@pytest.mark.parametrize("case", ["window", "causal", "packed", "rows", "rows_causal"])
def test_skipping_masked_blocks_changes_no_bit(case):
  """Each block loops over only the blocks it reads (far fewer here) and computes the same
  bits as looping over every block: values, and gradients under a cotangent on every row,
  the rows that read nothing included (padding in the middle of a row and at its end, and
  the rows padded to a whole block), with dropout, queries at shuffled positions too."""
  q, k, v = _qkv(b=2, l=72, k=8)
  seg = np.array([[1] * 20 + [0] * 5 + [2] * 30 + [3] * 10 + [0] * 7,
                  [4] * 40 + [5] * 32])
  pos = np.broadcast_to(np.arange(72), (2, 72))
  kw = dict(rate=0.2, dropout_keys=jax.random.bits(jax.random.key(5), (2,), jnp.uint32),
            block_q=16, block_k=16)
  q_seg = np.where(seg > 0, seg, -1)
  if case == "window":
    kw["window"] = 6
  elif case == "causal":
    kw["causal"], q_seg, seg = True, np.ones_like(seg), np.ones_like(seg)
  elif case.startswith("rows"):  # queries at some positions (in any order), keys at every one
    at = np.array([[0, 3, 30, 31, 60, 61, 70], [50, 2, 39, 40, 41, 1, 71]])
    q, q_seg, pos = jnp.take_along_axis(q, jnp.asarray(at)[:, :, None, None], 1), \
        np.take_along_axis(q_seg, at, 1), at
    kw.update(dict(window=6) if case == "rows" else dict(causal=True))
  fn = lambda skip: lambda q, k, v: flash.flash_attention(q, k, v, q_seg, seg, pos,
                                                           skip_blocks=skip, **kw)
  w = jnp.asarray(np.random.default_rng(2).standard_normal(q.shape), jnp.float32)
  for skip in (True, False):
    out = fn(skip)(q, k, v)
    grads = jax.grad(lambda *a: jnp.sum(fn(skip)(*a) * w), argnums=(0, 1, 2))(q, k, v)
    if skip:
      want = (out, grads)
  np.testing.assert_array_equal(np.asarray(want[0]), np.asarray(out))
  for name, a, b in zip("qkv", want[1], grads):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"d{name}")
  if not case.startswith("rows"):
    lp = 80  # 72 rounded up to the 16-row blocks
    q_ranges, k_ranges = flash._block_ranges(  # pylint: disable=protected-access
        jnp.pad(jnp.asarray(q_seg), ((0, 0), (0, 8)), constant_values=-1),
        jnp.pad(jnp.asarray(seg), ((0, 0), (0, 8)), constant_values=-2),
        jnp.pad(jnp.asarray(pos), ((0, 0), (0, 8))), 16, 16, causal=case == "causal",
        window=kw.get("window"), length=72)
    visits = lambda r: int(jnp.sum(r[..., 1] - r[..., 0]))
    full = 2 * (lp // 16) ** 2
    assert visits(q_ranges) < 0.8 * full and visits(k_ranges) < full, (q_ranges, k_ranges)


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_a_query_that_reads_no_key_gets_zeros_and_passes_no_gradient(rate):
  """Attention over no key at all (padding, segment -1 here): a row of zeros, and a
  cotangent there changes no gradient (it was the mean of the values, whose gradient went
  to every value, and to q and k)."""
  q, k, v = _qkv(b=1, l=40, k=8)
  seg = np.array([[1] * 17 + [2] * 15 + [0] * 8])
  q_seg = np.where(seg > 0, seg, -1)
  keys = jax.random.bits(jax.random.key(2), (2,), jnp.uint32)
  f = lambda q, k, v: flash.flash_attention(q, k, v, q_seg, seg, np.arange(40)[None], keys,
                                            rate=rate, block_q=16, block_k=16)
  out = np.asarray(f(q, k, v))
  np.testing.assert_array_equal(out[:, 32:], 0.0)
  w = jnp.asarray(np.random.default_rng(3).standard_normal(out.shape), jnp.float32)
  grads = lambda w: jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1, 2))(q, k, v)
  for name, a, b in zip("qkv", grads(w), grads(w.at[:, 32:].set(0.0))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"d{name}")


def test_values_a_query_never_reads_cannot_overflow_its_row():
  """Rows of a block that meet their first key late: the values of the keys before it
  (huge here, finite) never enter their sums; a window larger than int32 allows is a whole
  row's (found in review)."""
  q, k, v = _qkv(b=1, l=48, k=8)
  q_seg, seg = np.array([[1] * 8 + [2] * 40]), np.array([[1] * 16 + [2] * 32])
  v = v.at[:, :16].set(6e37)
  pos = np.arange(48)[None]
  for skip in (True, False):
    f = lambda q, k, v: flash.flash_attention(q, k, v, q_seg, seg, pos, block_q=16, block_k=16,
                                              skip_blocks=skip)
    assert np.isfinite(np.asarray(f(q, k, v))[:, 8:]).all(), skip
    w = jnp.zeros((1, 48, 2, 8)).at[:, 8:].set(1.0)
    dq, dk = jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1))(q, k, v)
    # (rows 0-7 read the huge values themselves: their own sums may overflow)
    assert np.isfinite(np.asarray(dq)[:, 8:]).all() and np.isfinite(np.asarray(dk)[:, 16:]).all()
  one = np.ones((1, 48), np.int32)
  wide = lambda skip: flash.flash_attention(q, k, v, one, one, pos, window=2 ** 31 - 1,
                                            block_q=16, block_k=16, skip_blocks=skip)
  np.testing.assert_array_equal(np.asarray(wide(True)), np.asarray(wide(False)))
  np.testing.assert_array_equal(np.asarray(wide(True)), np.asarray(
      flash.flash_attention(q, k, v, one, one, pos, block_q=16, block_k=16)))


def test_the_kernels_skip_the_blocks_no_query_reads():
  """Values at keys no query reads never reach the result when whole blocks of them are
  skipped (NaN there: finite output and gradients); looping over every block, 0 x NaN
  spreads it."""
  q, k, v = _qkv(b=1, l=64, k=8)
  seg = np.array([[1] * 32 + [2] * 16 + [3] * 16])
  q_seg = np.where(seg == 2, 3, seg)  # segment 2's keys (the third block): read by no query
  v = v.at[:, 32:48].set(jnp.nan)
  pos = np.arange(64)[None]
  f = lambda skip: lambda q, k, v: flash.flash_attention(q, k, v, q_seg, seg, pos, block_q=16,
                                                         block_k=16, skip_blocks=skip)
  assert np.isfinite(np.asarray(f(True)(q, k, v))).all()
  assert np.isnan(np.asarray(f(False)(q, k, v))).any()
  grads = jax.grad(lambda *a: jnp.sum(f(True)(*a)), argnums=(0, 1, 2))(q, k, v)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads[:2])
  assert np.isfinite(np.delete(np.asarray(grads[2]), np.s_[32:48], 1)).all()


def test_block_ranges_need_no_length_by_length_array():
  """The ranges come from sorting each row's keys, not from an [L, M] array: XLA's
  temporaries at L = M = 8192 stay far below B x L x M bytes."""
  b, n = 4, 8192
  spec = lambda dtype: jax.ShapeDtypeStruct((b, n), dtype)
  compiled = jax.jit(lambda s, t, p: flash._block_ranges(  # pylint: disable=protected-access
      s, t, p, 64, 64, causal=False, window=64)).lower(
          spec(jnp.int32), spec(jnp.int32), spec(jnp.int32)).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < b * n * n / 16


def test_block_ranges_cover_every_block_pair_a_query_reads():
  """Random layouts of segments, padding, windows, causal order, queries at shuffled
  positions and rows padded to whole blocks: every (query block, key block) pair where a
  query reads a key is visited."""
  rng = np.random.default_rng(0)
  for trial in range(40):
    b, mp, bq, bk = 2, 64, 8, 16
    lp, length = (64, 64) if trial % 4 else (32, 27)  # fewer queries; rows padded to blocks
    seg = np.cumsum(rng.random((b, mp)) < 0.08, 1) + 1
    seg[rng.random((b, mp)) < 0.1] = 0  # padding reads nothing and is read by nothing
    pos = np.stack([rng.permutation(mp)[:lp] if trial % 4 == 0 else np.arange(lp)] * b)
    q_seg = np.take_along_axis(np.where(seg > 0, seg, -1), pos, 1)
    causal, window = bool(trial % 2), (None if trial % 3 else int(rng.integers(1, 20)))
    reads = q_seg[:, :, None] == seg[:, None, :]
    if causal:
      reads &= np.arange(mp)[None, None] <= pos[:, :, None]
    if window is not None:
      reads &= np.abs(np.arange(mp)[None, None] - pos[:, :, None]) <= window
    reads &= (np.arange(lp) < length)[None, :, None]  # rows past `length` need nothing
    need = reads.reshape(b, lp // bq, bq, mp // bk, bk).any(axis=(2, 4))
    q_ranges, k_ranges = (np.asarray(r) for r in flash._block_ranges(  # pylint: disable=protected-access
        jnp.asarray(q_seg), jnp.asarray(seg), jnp.asarray(pos), bq, bk, causal=causal,
        window=window, length=length))
    for ranges, pairs in ((q_ranges, need), (k_ranges, need.transpose(0, 2, 1))):
      for row, r in np.ndindex(ranges.shape[:2]):
        lo, hi = ranges[row, r]
        assert 0 <= lo <= hi <= pairs.shape[2], (trial, row, r, ranges[row, r])
        visited = np.zeros(pairs.shape[2], bool)
        visited[lo:hi] = True
        assert not (pairs[row, r] & ~visited).any(), (trial, row, r, ranges[row, r])


def test_missing_dropout_keys_is_an_error():
  q, k, v = _qkv()
  with pytest.raises(ValueError, match="dropout_keys"):
    flash.flash_attention(q, k, v, jnp.ones((2, 24)), jnp.ones((2, 24)),
                          jnp.zeros((2, 24)), rate=0.1)


def _bert_batch():
  rng = np.random.default_rng(0)
  mask = (np.arange(12)[None] < np.array([12, 5, 8])[:, None]).astype(np.int32)
  ids = rng.integers(5, 97, (3, 12)) * mask
  return dict(input_ids=jnp.asarray(ids, jnp.int32), segment_ids=jnp.zeros((3, 12), jnp.int32),
              input_mask=jnp.asarray(mask),
              masked_lm_positions=jnp.asarray(np.tile(np.arange(4), (3, 1)), jnp.int32))


@pytest.mark.parametrize("causal", [False, True])
def test_bert_training_step_with_the_kernel_equals_the_explicit_path(causal):
  """BertForPreTraining training (dropout 0.1 hidden, 0.2 attention; the heads' reduced last
  layer) with attention_impl="pallas": the same outputs and gradients as the explicit
  attention with its dropout, for the same rngs."""
  cfg = model_lib.BertConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=2,
                             intermediate_size=48, max_position_embeddings=24,
                             hidden_dropout_rate=0.1, attention_dropout_rate=0.2, causal=causal)
  batch = _bert_batch()
  ref, fused = model_lib.BertForPreTraining(cfg), model_lib.BertForPreTraining(
      cfg.replace(attention_impl="pallas"))
  v = nn.unbox(ref.init(jax.random.key(0), **batch))
  rngs = {"dropout": jax.random.key(5)}

  def loss(params, module):
    out = module.apply({"params": params}, **batch, deterministic=False, rngs=rngs)
    return jnp.sum(out["mlm_logits"] ** 2) + jnp.sum(out["nsp_logits"]), out

  (l_ref, o_ref), g_ref = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(
      v["params"], ref)
  (l_got, o_got), g_got = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(
      v["params"], fused)
  for k in o_ref:
    np.testing.assert_allclose(o_got[k], o_ref[k], atol=1e-5, err_msg=k)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_ref), jax.tree.leaves(g_got)):
    np.testing.assert_allclose(b, a, atol=5e-5, err_msg=jax.tree_util.keystr(path))


def test_modern_flash_equals_dense_with_dropout_and_grouped_heads():
  q, _, _ = _qkv(b=2, l=37, h=4, k=8)
  _, k, v = _qkv(b=2, l=37, h=2, k=8, seed=1)
  seg = np.ones((2, 37), np.int32)
  seg[1, 20:] = 2
  seg[1, 33:] = 0
  key = jax.random.key(2)
  for half in (None, 3):
    drop = lambda p: layers_lib.dropout(p, 0.25, key, "hash")
    want = modern.dense_attention(q, k, v, seg, half, jnp.float32, drop)
    got = modern.flash_attention(q, k, v, seg, half, 0.25, key)
    np.testing.assert_allclose(np.asarray(got)[seg > 0], np.asarray(want)[seg > 0], atol=2e-5)


def test_bert_packed_rows_with_the_kernel_equal_the_explicit_path():
  """Packed rows (segments from the block-diagonal bias), each example's [CLS] and the masked
  positions computed in the last layer, dropout on."""
  batch, kw = test_fused_attention._packed()  # pylint: disable=protected-access
  cfg = model_lib.BertConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=2,
                             intermediate_size=48, max_position_embeddings=24,
                             hidden_dropout_rate=0.3, attention_dropout_rate=0.3)
  ref = model_lib.BertForPreTraining(cfg)
  fused = model_lib.BertForPreTraining(cfg.replace(attention_impl="pallas"))
  v = nn.unbox(ref.init(jax.random.key(0), **batch, **kw))
  rngs = {"dropout": jax.random.key(3)}
  want = jax.jit(lambda v: ref.apply(v, **batch, **kw, deterministic=False, rngs=rngs))(v)
  got = jax.jit(lambda v: fused.apply(v, **batch, **kw, deterministic=False, rngs=rngs))(v)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], atol=1e-5, err_msg=k)


def test_sharded_over_rows_and_heads_equals_one_device():
  """Under a (data 2, tensor 2) mesh the kernel runs on each device's rows and heads
  (shard_map) and draws the whole array's dropout masks: the same outputs and gradients as
  on one device."""
  code = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, Mesh
from bert_jax import flash
rng = np.random.default_rng(0)
q, k, v = (jnp.asarray(rng.standard_normal((4, 24, 4, 16)), jnp.float32) for _ in range(3))
mask = (np.arange(24)[None] < np.array([24, 13, 5, 20])[:, None]).astype(np.int32)
pos = jnp.broadcast_to(jnp.arange(24), (4, 24))
keys = jax.random.bits(jax.random.key(3), (2,), jnp.uint32)
f = lambda q, k, v: flash.flash_attention(q, k, v, jnp.ones((4, 24), jnp.int32), mask, pos, keys,
                                          rate=0.3)
loss = lambda q, k, v: jnp.sum(f(q, k, v) * mask[:, :, None, None] * jnp.sin(q))
step = jax.jit(lambda q, k, v: (f(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)))
want = step(q, k, v)
mesh = Mesh(np.array(jax.devices()).reshape(2, 1, 2), ("data", "fsdp", "tensor"),
            axis_types=(AxisType.Auto,) * 3)
with jax.set_mesh(mesh):
  text = step.lower(q, k, v).as_text()
  got = step(q, k, v)
assert "shard_map" in text or "sdy.manual_computation" in text, text[:2000]
for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
  np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5)
print("OK")
"""
  assert "OK" in tu.run_python(code, devices=4)


@pytest.mark.parametrize("dtype,head_dim", [("bfloat16", 64), ("float32", 32), ("bfloat16", 128)])
def test_the_kernels_lower_through_triton_for_cuda(dtype, head_dim):
  """No GPU here, but Pallas's Triton lowering runs: the forward and both backward kernels
  (padding, dropout, packed segments, a window, queries at some positions) become Triton
  kernels of a CUDA program."""
  q = jnp.zeros((2, 100, 4, head_dim), dtype)
  seg = jnp.ones((2, 100), jnp.int32)
  pos = jnp.broadcast_to(jnp.arange(100), (2, 100))
  keys = jnp.zeros((2,), jnp.uint32)
  for kw in (dict(rate=0.1), dict(window=8), dict(causal=True, rate=0.2)):
    f = lambda q, k, v: flash.flash_attention(q, k, v, seg[:, :40], seg, pos[:, :40], keys,
                                              interpret=False, **kw)
    step = jax.jit(lambda q, k, v: jax.grad(
        lambda q, k, v: f(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v))
    text = step.trace(q[:, :40], q, q).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call @__gpu$xla.gpu.triton") == 3, (kw, text[:500])  # fwd, dkv, dq


def test_attention_bench_counts_the_block_pairs_the_kernels_visit():
  from bench.accel import attention_flops  # pylint: disable=g-import-not-at-top
  one = np.ones((1, 512), np.int32)
  assert attention_flops.flash_visits(one, None) == (1.0, 1.0)
  assert attention_flops.flash_visits(one, 64) == (22 / 64, 22 / 64)  # 3 blocks, 2 at the ends
  two = np.repeat([[1, 2]], 256, axis=1)
  assert attention_flops.flash_visits(two, None) == (0.5, 0.5)
