"""Properties of the Flax BERT: sizes, padding invariance, determinism, scan/remat, errors."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import loader
from bert_jax.models import bert as model_lib
from bert_jax.models import layers as layers_lib
from bert_jax import objectives

SMALL = model_lib.BertConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                             intermediate_size=48, max_position_embeddings=24, type_vocab_size=2)


def _batch(rng, batch=3, length=12, vocab=97, preds=4):
  rng = np.random.default_rng(rng)
  lengths = rng.integers(preds, length + 1, size=batch)
  lengths[0] = length
  mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(5, vocab, size=(batch, length)) * mask
  segments = ((np.arange(length)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
  positions = np.stack([rng.choice(n, size=preds, replace=False) for n in lengths])
  return dict(input_ids=jnp.asarray(ids, jnp.int32), segment_ids=jnp.asarray(segments),
              input_mask=jnp.asarray(mask), masked_lm_positions=jnp.asarray(positions, jnp.int32))


def _init(module, batch):
  args = [batch[k] for k in ("input_ids", "segment_ids", "input_mask", "masked_lm_positions")]
  if isinstance(module, model_lib.BertModel):
    args = args[:3]
  return nn.unbox(module.init(jax.random.key(0), *args))


@pytest.mark.parametrize("name,expected", [
    ("tiny", 4_385_920), ("mini", 11_170_560), ("small", 28_763_648),
    ("medium", 41_373_184), ("base", 109_482_240), ("large", 335_141_888)])
def test_parameter_counts_match_the_paper(name, expected):
  cfg = model_lib.BertConfig.from_preset(name)
  ids = jnp.zeros((1, 4), jnp.int32)
  shapes = jax.eval_shape(lambda: model_lib.BertModel(cfg).init(jax.random.key(0), ids))
  assert model_lib.count_params(nn.unbox(shapes)) == expected


def test_output_shapes_and_dtypes():
  batch = _batch(0)
  m = model_lib.BertModel(SMALL)
  v = _init(m, batch)
  seq, pooled = m.apply(v, batch["input_ids"], batch["segment_ids"], batch["input_mask"])
  assert seq.shape == (3, 12, 32) and pooled.shape == (3, 32)
  pt = model_lib.BertForPreTraining(SMALL)
  out = pt.apply(_init(pt, batch), **batch)
  assert out["mlm_logits"].shape == (3, 4, 97) and out["nsp_logits"].shape == (3, 2)
  assert out["mlm_logits"].dtype == jnp.float32


def test_extra_padding_never_changes_outputs_at_real_tokens():
  batch = _batch(1)
  m = model_lib.BertModel(SMALL)
  v = _init(m, batch)
  seq, pooled = m.apply(v, batch["input_ids"], batch["segment_ids"], batch["input_mask"])
  pad = lambda x, value: jnp.pad(x, ((0, 0), (0, 7)), constant_values=value)
  # Padding with garbage ids and segments: the mask alone must hide them.
  seq2, pooled2 = m.apply(v, pad(batch["input_ids"], 42), pad(batch["segment_ids"], 1),
                          pad(batch["input_mask"], 0))
  real = np.asarray(batch["input_mask"], bool)
  np.testing.assert_allclose(np.asarray(seq2[:, :12])[real], np.asarray(seq)[real], atol=1e-5)
  np.testing.assert_allclose(pooled2, pooled, atol=1e-5)


def test_deterministic_mode_is_deterministic_and_dropout_is_not():
  batch = _batch(2)
  pt = model_lib.BertForPreTraining(SMALL)
  v = _init(pt, batch)
  a = pt.apply(v, **batch)["mlm_logits"]
  b = pt.apply(v, **batch, deterministic=True)["mlm_logits"]
  np.testing.assert_array_equal(a, b)
  drop = lambda k: pt.apply(v, **batch, deterministic=False, rngs={"dropout": jax.random.key(k)})["mlm_logits"]
  np.testing.assert_array_equal(drop(1), drop(1))
  assert not np.allclose(drop(1), drop(2))


def test_explicit_attention_path_matches_fused_path():
  # With a vanishing dropout rate the explicit (dropout-capable) attention must
  # compute what jax.nn.dot_product_attention computes.
  batch = _batch(3)
  cfg = SMALL.replace(hidden_dropout_rate=0.0, attention_dropout_rate=1e-12)
  pt = model_lib.BertForPreTraining(cfg)
  v = _init(pt, batch)
  fused = pt.apply(v, **batch, deterministic=True)
  explicit = pt.apply(v, **batch, deterministic=False, rngs={"dropout": jax.random.key(0)})
  for k in fused:
    np.testing.assert_allclose(explicit[k], fused[k], atol=2e-5)


def test_sequence_longer_than_position_table_is_a_clear_error():
  m = model_lib.BertModel(SMALL)
  ids = jnp.ones((1, 25), jnp.int32)
  with pytest.raises(ValueError, match="exceeds the position table.*max_position_embeddings=24"):
    m.init(jax.random.key(0), ids)


def test_bad_configs_are_clear_errors():
  with pytest.raises(ValueError, match="not divisible"):
    model_lib.BertConfig(hidden_size=30, num_heads=4)
  with pytest.raises(ValueError, match="Unknown model preset"):
    model_lib.BertConfig.from_preset("huge")
  with pytest.raises(ValueError, match="hidden_act"):
    model_lib.BertConfig(hidden_act="swish")


@pytest.mark.parametrize("remat", ["none", "attention", "full", "dots"])
def test_scan_and_remat_compute_the_same_function(remat):
  batch = _batch(4)
  base = model_lib.BertForPreTraining(SMALL)
  params = _init(base, batch)["params"]
  scanned_cfg = SMALL.replace(scan_layers=True, remat=remat)
  scanned = model_lib.BertForPreTraining(scanned_cfg)
  stacked = loader.to_layout(params, True)
  assert jax.tree_util.tree_structure(stacked) == jax.tree_util.tree_structure(
      _init(scanned, batch)["params"])
  labels = dict(masked_lm_ids=batch["input_ids"][:, :4], masked_lm_weights=jnp.ones((3, 4)),
                next_sentence_labels=jnp.array([0, 1, 0]))

  def loss(module, p):
    return objectives.pretraining().batch_loss(module.apply({"params": p}, **batch), labels)

  l1, g1 = jax.value_and_grad(lambda p: loss(base, p))(params)
  l2, g2 = jax.value_and_grad(lambda p: loss(scanned, p))(stacked)
  np.testing.assert_allclose(l1, l2, rtol=1e-6)
  g2 = loader.to_layout(g2, False)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g1, g2)


def test_bfloat16_compute_keeps_float32_params_and_close_outputs():
  batch = _batch(5)
  pt32 = model_lib.BertForPreTraining(SMALL)
  v = _init(pt32, batch)
  pt16 = model_lib.BertForPreTraining(SMALL.replace(dtype="bfloat16"))
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(_init(pt16, batch)))
  a = pt32.apply(v, **batch)["mlm_logits"]
  b = pt16.apply(v, **batch)["mlm_logits"]
  assert b.dtype == jnp.float32
  np.testing.assert_allclose(a, b, atol=0.1)


def test_pretraining_loss_is_weighted_mean_of_cross_entropies():
  logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]]))
  nsp = jnp.log(jnp.array([[0.25, 0.75]]))
  batch = dict(masked_lm_ids=jnp.array([[0, 1]]), masked_lm_weights=jnp.array([[1.0, 0.0]]),
               next_sentence_labels=jnp.array([1]))
  outputs = {"mlm_logits": logits, "nsp_logits": nsp}
  loss = objectives.pretraining().batch_loss(outputs, batch)
  m = objectives.pretraining_sums(outputs, batch)
  np.testing.assert_allclose(loss, -np.log(0.7) - np.log(0.75), rtol=1e-6)
  assert float(m["mlm_weight"]) == 1.0 and float(m["mlm_correct_sum"]) == 1.0
  assert float(m["nsp_correct_sum"]) == 1.0 and float(m["num_examples"]) == 1.0


# Three of the nine in the default tier (the rest moved to slow: its time, ~12 min on 2 cores).
@pytest.mark.parametrize("dropout_rng,remat,deterministic", [
    ("hash", "none", False), ("threefry", "full", False), ("hash", "attention", False),
    *(pytest.param(r, m, d, marks=pytest.mark.slow) for r in model_lib.DROPOUT_RNGS
      for m in ("none", "full") for d in (True, False)
      if (r, m, d) not in (("hash", "none", False), ("threefry", "full", False)))])
def test_pooled_only_gives_the_pooled_output_of_the_full_encoder(dropout_rng, remat, deterministic):
  """pooled_only computes the last layer at [CLS] alone: same pooled output (and dropout
  masks) as the full encoder, gradients included."""
  cfg = SMALL.replace(dropout_rng=dropout_rng, remat=remat, hidden_dropout_rate=0.3,
                      attention_dropout_rate=0.3)
  batch = _batch(4, batch=4)
  args = [batch[k] for k in ("input_ids", "segment_ids", "input_mask")]
  full, fast = model_lib.BertModel(cfg), model_lib.BertModel(cfg, pooled_only=True)
  params = _init(full, batch)["params"]

  def pooled(module, p):
    return module.apply({"params": p}, *args, deterministic,
                        rngs={"dropout": jax.random.key(7)})[1]
  seq, want = full.apply({"params": params}, *args, deterministic, rngs={"dropout": jax.random.key(7)})
  assert seq is not None
  none, got = fast.apply({"params": params}, *args, deterministic, rngs={"dropout": jax.random.key(7)})
  assert none is None and got.shape == want.shape
  np.testing.assert_allclose(got, want, atol=1e-6)
  g_full = jax.grad(lambda p: pooled(full, p).sum())(params)
  g_fast = jax.grad(lambda p: pooled(fast, p).sum())(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g_fast, g_full)
  if not deterministic:  # dropout is on (not a no-op) in the last layer
    other = fast.apply({"params": params}, *args, False, rngs={"dropout": jax.random.key(8)})[1]
    assert np.abs(np.asarray(other) - np.asarray(got)).max() > 1e-3


@pytest.mark.parametrize("deterministic", [True, False])
def test_pooled_only_on_packed_rows(deterministic):
  """Packed rows: the last layer computes each example's [CLS] row alone, with the same
  values as the full encoder gathered at cls_positions."""
  ids = jnp.asarray(np.random.default_rng(0).integers(5, 97, (2, 12)), jnp.int32)
  example_ids = jnp.asarray([[1] * 5 + [2] * 4 + [0] * 3, [1] * 7 + [2] * 3 + [3] * 2], jnp.int32)
  positions = jnp.asarray([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 0], list(range(7)) + [0, 1, 2, 0, 1]],
                          jnp.int32)
  cls = jnp.asarray([[0, 5, 0], [0, 7, 10]], jnp.int32)
  kw = dict(position_ids=positions, packed_example_ids=example_ids, cls_positions=cls)
  cfg = SMALL.replace(hidden_dropout_rate=0.3, attention_dropout_rate=0.3)
  full, fast = model_lib.BertModel(cfg), model_lib.BertModel(cfg, pooled_only=True)
  v = nn.unbox(full.init(jax.random.key(0), ids))
  rngs = {"dropout": jax.random.key(3)}
  want = full.apply(v, ids, jnp.zeros_like(ids), example_ids > 0, deterministic, rngs=rngs, **kw)[1]
  got = fast.apply(v, ids, jnp.zeros_like(ids), example_ids > 0, deterministic, rngs=rngs, **kw)[1]
  assert got.shape == (2, 3, 32)
  np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("nsp,dropout_rng,remat,deterministic", [
    pytest.param(True, "hash", "none", False, marks=pytest.mark.slow),  # its time (~12 min)
    (False, "hash", "none", True), (True, "threefry", "full", False)])
def test_pretraining_heads_read_the_last_layer_at_their_rows_only(nsp, dropout_rng, remat,
                                                                    deterministic):
  """BertForPreTraining computes the last layer only at the masked positions and [CLS]
  (head_rows, the default): the same MLM and NSP logits, dropout masks and gradients as
  the full last layer (head_rows=False), padding slots (position 0) included."""
  cfg = SMALL.replace(dropout_rng=dropout_rng, remat=remat, hidden_dropout_rate=0.3,
                      attention_dropout_rate=0.3)
  batch = _batch(5, batch=3, length=12, preds=4)
  batch["masked_lm_positions"] = batch["masked_lm_positions"].at[1, 3].set(0)  # a padding slot
  args = [batch[k] for k in ("input_ids", "segment_ids", "input_mask", "masked_lm_positions")]
  fast = model_lib.BertForPreTraining(cfg, nsp=nsp)
  full = model_lib.BertForPreTraining(cfg, nsp=nsp, head_rows=False)
  params = _init(full, batch)["params"]
  run = lambda m, p: m.apply({"params": p}, *args, deterministic,
                             rngs={"dropout": jax.random.key(11)})
  want, got = run(full, params), run(fast, params)
  assert want.keys() == got.keys() == ({"mlm_logits", "nsp_logits"} if nsp else {"mlm_logits"})
  for k in want:
    np.testing.assert_allclose(got[k], want[k], atol=2e-5, err_msg=k)
  loss = lambda m: lambda p: sum(jnp.sum(jnp.sin(v)) for v in run(m, p).values())
  g_full, g_fast = jax.grad(loss(full))(params), jax.grad(loss(fast))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), g_fast, g_full)
  if remat == "none" and nsp:  # it does less work: fewer FLOPs in the compiled forward
    cost = lambda m: jax.jit(lambda p: run(m, p)).lower(params).compile().cost_analysis()["flops"]
    assert cost(fast) < cost(full)


def test_pretraining_head_rows_on_packed_rows():
  """Packed rows: each example's [CLS] and the masked positions of the row, as the full
  last layer gives them."""
  ids = jnp.asarray(np.random.default_rng(0).integers(5, 97, (2, 12)), jnp.int32)
  example_ids = jnp.asarray([[1] * 5 + [2] * 4 + [0] * 3, [1] * 7 + [2] * 3 + [3] * 2], jnp.int32)
  positions = jnp.asarray([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 0], list(range(7)) + [0, 1, 2, 0, 1]],
                          jnp.int32)
  kw = dict(position_ids=positions, packed_example_ids=example_ids,
            cls_positions=jnp.asarray([[0, 5, 0], [0, 7, 10]], jnp.int32))
  masked = jnp.asarray([[2, 6, 7, 0], [3, 8, 11, 1]], jnp.int32)
  cfg = SMALL.replace(hidden_dropout_rate=0.3, attention_dropout_rate=0.3)
  fast = model_lib.BertForPreTraining(cfg)
  full = model_lib.BertForPreTraining(cfg, head_rows=False)
  v = nn.unbox(full.init(jax.random.key(0), ids, jnp.zeros_like(ids), example_ids > 0, masked))
  rngs = {"dropout": jax.random.key(3)}
  want = full.apply(v, ids, jnp.zeros_like(ids), example_ids > 0, masked, False, rngs=rngs, **kw)
  got = fast.apply(v, ids, jnp.zeros_like(ids), example_ids > 0, masked, False, rngs=rngs, **kw)
  assert got["nsp_logits"].shape == (2, 3, 2)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], atol=2e-5, err_msg=k)


def test_hash_bits_of_rows_are_the_rows_of_the_full_draw():
  key = jax.random.key(5)
  full = np.asarray(layers_lib.hash_bits(key, (3, 7, 5)))
  pos = jnp.asarray([[0, 4], [6, 6], [2, 0]], jnp.int32)
  rows = layers_lib.hash_bits(key, (3, 2, 5), model_lib.Rows(1, pos, 7))
  np.testing.assert_array_equal(rows, np.take_along_axis(full, np.asarray(pos)[:, :, None], 1))


def _embeddings_and_grads(dtype, batch):
  cfg = SMALL.replace(dtype=dtype, hidden_dropout_rate=0.0)
  emb = model_lib.Embeddings(cfg)
  ids, seg = batch["input_ids"], batch["segment_ids"]
  pos = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  params = nn.unbox(emb.init(jax.random.key(0), ids, seg, pos, True))
  g = jnp.asarray(np.random.default_rng(1).normal(size=ids.shape + (32,)), jnp.float32)
  loss = lambda p: jnp.sum(emb.apply(p, ids, seg, pos, True).astype(jnp.float32) * g)
  return emb, params, (ids, seg, pos), loss


def test_small_embedding_tables_take_no_scatter_add_in_the_gradient():
  """The gradient of a gather is a scatter-add whose rows collide when the table is small
  (all of a batch's tokens land on the 2 token-type rows): on an H200 that scatter took 138 ms
  of BERT-base's 134 ms step (L=128, batch 256, bf16). Only the word table may scatter."""
  batch = _batch(2)
  emb, params, _, loss = _embeddings_and_grads(jnp.bfloat16, batch)
  hlo = jax.jit(jax.grad(loss)).lower(params).as_text()
  scatters = hlo.count('"stablehlo.scatter"(')
  assert scatters == 1, f"{scatters} scatter-adds in the embeddings' gradient"


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_small_embedding_tables_look_up_exactly_and_sum_their_gradients(dtype):
  """The lookups' values are the table's rows bit for bit, and each row's gradient is the sum
  of the output gradients of the tokens that read it."""
  batch = _batch(3)
  emb, params, (ids, seg, pos), loss = _embeddings_and_grads(dtype, batch)
  tables = params["params"]
  ln_free = emb.bind(params)
  got_pos = np.asarray(ln_free.position_lookup(pos), np.float32)
  got_seg = np.asarray(ln_free.token_type_lookup(seg), np.float32)
  want_pos = np.asarray(tables["position_embeddings"]["embedding"].astype(dtype), np.float32)[pos]
  want_seg = np.asarray(tables["token_type_embeddings"]["embedding"].astype(dtype), np.float32)[seg]
  np.testing.assert_array_equal(got_pos, want_pos)
  np.testing.assert_array_equal(got_seg, want_seg)
  g = np.asarray(np.random.default_rng(4).normal(size=ids.shape + (32,)), np.float32)
  def table_grads(p):
    b = emb.bind(p)
    return jnp.sum((b.position_lookup(pos) + b.token_type_lookup(seg)).astype(jnp.float32) * g)
  grads = jax.grad(table_grads)(params)["params"]
  for name, idx in (("position_embeddings", np.asarray(pos)), ("token_type_embeddings", np.asarray(seg))):
    want = np.zeros(tables[name]["embedding"].shape, np.float64)
    np.add.at(want, idx.reshape(-1), g.reshape(-1, 32).astype(np.float64))
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(grads[name]["embedding"]), want, rtol=tol, atol=tol)


def test_exact_gelu_is_torchs_erf_form():
  """The "gelu" activation (transformers' exact GELU) is x/2 (1 + erf(x/sqrt 2)), torch's
  form: jax.nn.gelu(approximate=False)'s values and gradients within float32 rounding, without
  the erfc that makes jax's form several times slower on XLA:CPU."""
  import torch  # pylint: disable=g-import-not-at-top
  x = np.linspace(-8, 8, 4001, dtype=np.float32)
  gelu = model_lib.ACTIVATIONS["gelu"]
  got = np.asarray(gelu(jnp.asarray(x)))
  np.testing.assert_allclose(got, np.asarray(jax.nn.gelu(x, approximate=False)), atol=2e-6)
  np.testing.assert_allclose(got, torch.nn.functional.gelu(torch.from_numpy(x)).numpy(), atol=1e-6)
  grad = jax.vmap(jax.grad(gelu))(jnp.asarray(x))
  want = jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=False)))(jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(grad), np.asarray(want), atol=2e-6)
  assert "erfc" not in jax.jit(gelu).lower(jnp.asarray(x)).as_text()
