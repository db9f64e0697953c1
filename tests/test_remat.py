"""model.remat in every family: what the backward pass keeps (the residuals of jax.vjp) and
that recomputing changes no value. `attention` keeps no [.., L, M] score, probability or
dropout-mask tensor (and every other residual); `dots` keeps the layers' matmul outputs;
`full` keeps each layer's input alone. At every `remat`, the activations (and ModernBERT's gated
MLP) keep their inputs alone."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import families
from bert_jax.models import bert as model_lib
from bert_jax.models import deberta, layers, modern

B, L, F = 2, 40, 96  # no other axis is 40 or 96 long
FAMILIES = {
    "bert": lambda **kw: model_lib.BertConfig(
        vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=F,
        max_position_embeddings=64, attention_dropout_rate=0.2, **kw),
    "deberta": lambda **kw: deberta.DebertaConfig(
        vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=F,
        max_position_embeddings=64, position_buckets=8, attention_dropout_rate=0.2, **kw),
    # Local layers (window 16) over their band: blocks of 8 queries reading 24 keys.
    "modernbert": lambda **kw: modern.ModernConfig.from_preset(
        "modernbert-tiny", vocab_size=64, intermediate_size=F, local_window=16,
        attention_dropout_rate=0.2, **kw),
}


def _scores(a) -> bool:
  """An [.., L, M] tensor over queries and keys: the dense L x L, or a band's blocks (W
  queries reading 3 W keys)."""
  s = a.shape
  return a.ndim >= 4 and (s[-2:] == (L, L) or (s[-1] == 3 * s[-2] and L % s[-2] == 0))


def _loss_and_residuals(cfg, params=None, values=True):
  """The encoder's (dropout on) sum of squares, its gradient (jitted; None without `values`),
  and the shapes of the residuals its vjp keeps."""
  enc = families.of(cfg).encoder(cfg)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(3, 60, (B, L)), jnp.int32)
  mask = jnp.ones((B, L), jnp.int32).at[1, 29:].set(0)
  seg = jnp.zeros((B, L), jnp.int32).at[:, 20:].set(1)
  if params is None:
    params = enc.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, ids, seg,
                      mask, deterministic=False)["params"]  # (dropout on: no cuDNN call)

  def loss(p):
    out = enc.apply({"params": p}, ids, seg, mask, deterministic=False,
                    rngs={"dropout": jax.random.key(2)})
    return sum((x.astype(jnp.float32) ** 2).sum() for x in jax.tree.leaves(out))
  kept = jax.eval_shape(lambda p: jax.tree.leaves(jax.vjp(loss, p)[1]), params)
  if not values:
    return params, None, None, kept
  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  return params, value, grads, kept


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_attention_remat_keeps_no_scores_and_changes_no_value(family):
  params, value, grads, kept = _loss_and_residuals(FAMILIES[family]())
  assert any(_scores(a) for a in kept)  # the test sees them when they are kept
  _, value2, grads2, kept2 = _loss_and_residuals(FAMILIES[family](remat="attention"), params)
  assert not [a.shape for a in kept2 if _scores(a)]
  # Everything else is still kept: a layer's feed-forward output is not recomputed.
  assert any(a.shape == (B, L, F) for a in kept2)
  np.testing.assert_array_equal(value2, value)
  jax.tree.map(np.testing.assert_array_equal, grads2, grads)


@pytest.mark.parametrize("family,kernel", [
    ("bert", dict(dtype="bfloat16", attention_impl="cudnn")),  # cuDNN has no dropout
    ("modernbert", dict(attention="flash", dropout_rng="threefry")),  # flash draws hash masks
])
def test_attention_remat_recomputes_where_a_kernel_gives_way_to_xla(family, kernel):
  """With the probabilities' dropout on, these kernels give way to XLA's attention: its
  scores are recomputed like any other's."""
  kept = _loss_and_residuals(FAMILIES[family](**kernel), values=False)[3]
  assert any(_scores(a) for a in kept)
  kept = _loss_and_residuals(FAMILIES[family](remat="attention", **kernel), values=False)[3]
  assert not [a.shape for a in kept if _scores(a)]


def test_attention_remat_under_scan_where_the_layer_kind_is_traced():
  """ModernBERT's scanned layers choose global or local attention in a lax.cond: each branch
  recomputes its own. The loss is bitwise the same, the gradients to float32 rounding (XLA
  fuses the scanned body differently)."""
  cfg = FAMILIES["modernbert"](scan_layers=True)
  params, value, grads, kept = _loss_and_residuals(cfg)
  assert any(_scores(a) for a in kept)
  _, value2, grads2, kept2 = _loss_and_residuals(cfg.replace(remat="attention"), params)
  assert not [a.shape for a in kept2 if _scores(a)]
  np.testing.assert_array_equal(value2, value)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads2)):
    assert float(jnp.abs(a - b).max()) <= 1e-4 * float(jnp.abs(a).max()), a.shape


# BERT's layers take REMAT_POLICIES through layers.layer_stack (tests/test_model.py checks the
# values); DeBERTa's applied full remat for `dots` until this test.
@pytest.mark.parametrize("family", ["deberta", pytest.param("bert", marks=pytest.mark.slow)])
def test_dots_keeps_the_matmul_outputs_and_full_keeps_none(family):
  params, value, grads, _ = _loss_and_residuals(FAMILIES[family]())
  for remat, kept_f in (("dots", True), ("full", False)):
    _, value2, grads2, kept = _loss_and_residuals(FAMILIES[family](remat=remat), params)
    assert any(a.shape == (B, L, F) for a in kept) == kept_f, remat
    assert not [a.shape for a in kept if _scores(a)], remat
    np.testing.assert_allclose(value2, value, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads2,
                 grads)


# What a layer's feed-forward keeps for the backward pass: BERT's and DeBERTa's intermediate
# output and its GELU (the output layer's weight gradient reads it); ModernBERT's gate, up and
# their product. The activations recompute their tanh or erf (layers.recomputed), which
# autodiff would keep: 6, 4 and 6 such [B, L, F] tensors a layer before.
FFN_KEPT = {"bert": 2, "deberta": 2, "modernbert": 3}


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float32", marks=pytest.mark.slow)])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_activations_keep_their_input_alone_with_autodiffs_values(family, dtype, monkeypatch):
  cfg = FAMILIES[family](dtype=dtype)
  params, value, grads, kept = _loss_and_residuals(cfg)
  assert sum(a.shape == (B, L, F) for a in kept) == FFN_KEPT[family] * cfg.num_layers
  # The same values as autodiff through the plain functions (bitwise in bfloat16; XLA fuses
  # float32's differently, to its rounding).
  monkeypatch.setitem(layers.ACTIVATIONS, "gelu", layers.gelu)
  monkeypatch.setitem(layers.ACTIVATIONS, "gelu_tanh", layers.gelu_tanh)
  monkeypatch.setitem(modern.GATED, "gelu", lambda gate, up: layers.gelu(gate) * up)
  _, value2, grads2, kept2 = _loss_and_residuals(cfg, params)
  assert sum(a.shape == (B, L, F) for a in kept2) > FFN_KEPT[family] * cfg.num_layers
  np.testing.assert_array_equal(value2, value)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads2)):
    if dtype == "bfloat16":
      np.testing.assert_array_equal(a, b)
    else:
      assert float(jnp.abs(a - b).max()) <= 1e-6 * float(jnp.abs(a).max()), a.shape


def test_activations_gradients_are_autodiffs_under_jit_and_vmap():
  x = jnp.linspace(-6, 6, 97, dtype=jnp.float32)
  for name, plain in (("gelu", layers.gelu), ("gelu_tanh", layers.gelu_tanh)):
    act = layers.ACTIVATIONS[name]
    assert [r.shape for r in jax.tree.leaves(jax.vjp(act, x)[1])] == [x.shape]
    np.testing.assert_array_equal(act(x), plain(x))
    for transform in (lambda f: jax.jit(jax.grad(lambda v: (f(v) * x).sum())),
                      lambda f: jax.vmap(jax.grad(f))):
      np.testing.assert_array_equal(transform(act)(x), transform(plain)(x))


@pytest.mark.parametrize("name", sorted(modern.GATED))
def test_gated_mlps_keep_gate_and_up_alone_with_autodiffs_gradients(name):
  """GeGLU and SwiGLU (EuroBERT's silu): act(gate) * up recomputed in the backward pass."""
  plain = modern.PLAIN_ACTIVATIONS[name]
  rng = np.random.default_rng(0)
  gate, up = (jnp.asarray(rng.normal(size=(3, 97)), jnp.float32) for _ in range(2))
  glu = modern.GATED[name]
  assert [r.shape for r in jax.tree.leaves(jax.vjp(glu, gate, up)[1])] == [gate.shape] * 2
  np.testing.assert_array_equal(glu(gate, up), plain(gate) * up)
  grad = lambda f: jax.jit(jax.grad(lambda g, u: (f(g, u) * gate).sum(), argnums=(0, 1)))
  for a, b in zip(grad(glu)(gate, up), grad(lambda g, u: plain(g) * u)(gate, up)):
    np.testing.assert_array_equal(a, b)
