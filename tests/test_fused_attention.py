"""BERT's fused attention arguments (model.attention_impl "xla" / "cudnn"): the same values
and gradients as the reference bias path, in the shapes cuDNN's fused attention accepts.

cuDNN itself needs a GPU; here its calls run on XLA with the very arguments the model passes
(recorded and checked against cuDNN's own shape rules), so what CPU can prove is proven:
padded rows (lengths instead of a [B, 1, 1, M] bias, the cause of the crash on an H200),
packed rows, left-to-right rows, the pre-training heads' reduced last layer, filler rows.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import bert as model_lib
from common import errors

SMALL = model_lib.BertConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                             intermediate_size=48, max_position_embeddings=24,
                             hidden_dropout_rate=0.0, attention_dropout_rate=0.0)


def _padded(batch=3, length=12, preds=4, seed=0):
  rng = np.random.default_rng(seed)
  lengths = np.array([length, 5, 0][:batch])  # full, padded, a filler row of padding alone
  mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(5, 97, (batch, length)) * mask
  return dict(input_ids=jnp.asarray(ids, jnp.int32), segment_ids=jnp.zeros_like(ids),
              input_mask=jnp.asarray(mask),
              masked_lm_positions=jnp.asarray(np.tile(np.arange(preds), (batch, 1)), jnp.int32)), mask


def _packed():
  ids = jnp.asarray(np.random.default_rng(0).integers(5, 97, (2, 12)), jnp.int32)
  example_ids = jnp.asarray([[1] * 5 + [2] * 4 + [0] * 3, [1] * 7 + [2] * 3 + [3] * 2], jnp.int32)
  positions = jnp.asarray([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 0], list(range(7)) + [0, 1, 2, 0, 1]],
                          jnp.int32)
  batch = dict(input_ids=ids, segment_ids=jnp.zeros_like(ids), input_mask=(example_ids > 0).astype(jnp.int32),
               masked_lm_positions=jnp.asarray([[2, 6, 7, 0], [3, 8, 11, 1]], jnp.int32))
  kw = dict(position_ids=positions, packed_example_ids=example_ids,
            cls_positions=jnp.asarray([[0, 5, 0], [0, 7, 10]], jnp.int32))
  return batch, kw


@pytest.fixture
def cudnn_calls(monkeypatch):
  """jax.nn.dot_product_attention with implementation="cudnn" run on XLA, each call's
  arguments recorded and checked against cuDNN's rules (jax's own check where it exists)."""
  calls, real = [], jax.nn.dot_product_attention

  def fake(query, key, value, bias=None, mask=None, *, implementation=None, **kw):
    if implementation == "cudnn":
      calls.append(dict(q=query.shape, k=key.shape, bias=None if bias is None else bias.shape,
                        kw={k: (v.shape, v.dtype) for k, v in kw.items() if v is not None}))
      assert query.dtype in (jnp.bfloat16, jnp.float16) and mask is None
      if bias is not None:  # cuDNN: one bias row per query, one column per key
        assert bias.shape[2] == query.shape[1] and bias.shape[3] == key.shape[1], bias.shape
      for name in ("query_seq_lengths", "key_value_seq_lengths"):
        if kw.get(name) is not None:
          assert kw[name].shape == (query.shape[0],) and kw[name].dtype == jnp.int32
      try:
        from jax._src.cudnn import fused_attention_stablehlo as fa  # pylint: disable=g-import-not-at-top
        fa.check_layout(query, key, value, bias, kw.get("query_seq_lengths"),
                        kw.get("key_value_seq_lengths"), None, None, None, None,
                        fa.AttentionLayout.BTNH)
      except ImportError:  # a private module: its rules are asserted above as well
        pass
      implementation = "xla"
    return real(query, key, value, bias, mask, implementation=implementation, **kw)

  monkeypatch.setattr(jax.nn, "dot_product_attention", fake)
  return calls


def _close(got, want, rows, atol):
  """Every output at `rows` (a filler row of padding alone is nobody's output)."""
  for k in want:
    np.testing.assert_allclose(np.asarray(got[k], np.float32)[rows],
                               np.asarray(want[k], np.float32)[rows], atol=atol, err_msg=k)


@pytest.mark.parametrize("impl,dtype,atol", [("xla", "float32", 2e-5),
                                             pytest.param("cudnn", "bfloat16", 3e-2,
                                                          marks=pytest.mark.slow)])
def test_padded_rows_values_and_gradients(cudnn_calls, impl, dtype, atol):
  batch, mask = _padded()
  ref_cfg = SMALL.replace(dtype=dtype)
  ref = model_lib.BertForPreTraining(ref_cfg)
  fused = model_lib.BertForPreTraining(ref_cfg.replace(attention_impl=impl))
  v = nn.unbox(ref.init(jax.random.key(0), **batch))
  want, got = jax.jit(ref.apply)(v, **batch), jax.jit(fused.apply)(v, **batch)
  _close(got, want, slice(0, 2), atol)
  assert np.isfinite(np.asarray(got["mlm_logits"], np.float32)).all()  # the filler row too

  def loss(params, module):
    out = module.apply({"params": params}, **batch)
    return jnp.sum(out["mlm_logits"][:2].astype(jnp.float32) ** 2) + jnp.sum(
        out["nsp_logits"][:2].astype(jnp.float32))

  g_ref = jax.jit(jax.grad(loss), static_argnums=1)(v["params"], ref)
  g_fused = jax.jit(jax.grad(loss), static_argnums=1)(v["params"], fused)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_ref), jax.tree.leaves(g_fused)):
    scale = max(float(np.abs(np.asarray(a, np.float32)).max()), 1e-3)
    np.testing.assert_allclose(np.asarray(b, np.float32) / scale, np.asarray(a, np.float32) / scale,
                               atol=atol, err_msg=jax.tree_util.keystr(path))
  if impl == "cudnn":
    # Padding goes as key lengths (no [B, 1, 1, M] bias), in every layer; the last layer
    # computes the heads' rows only (queries [B, 1 + P], made even for cuDNN: 6).
    assert cudnn_calls and all(c["bias"] is None and "key_value_seq_lengths" in c["kw"]
                               for c in cudnn_calls)
    assert {c["q"][1] for c in cudnn_calls} == {12, 1 + 4 + 1}


@pytest.mark.parametrize("causal", [False, True])
def test_packed_and_left_to_right_rows(cudnn_calls, causal):
  batch, kw = _packed()
  cfg = SMALL.replace(dtype="bfloat16", causal=causal)
  ref = model_lib.BertForPreTraining(cfg)
  fused = model_lib.BertForPreTraining(cfg.replace(attention_impl="cudnn"))
  rows = slice(None)
  if causal:  # left-to-right models do not pack: plain padded rows, causal as a bias
    batch, _ = _padded()
    kw, rows = {}, slice(0, 2)
  v = nn.unbox(ref.init(jax.random.key(0), **batch, **kw))
  _close(jax.jit(fused.apply)(v, **batch, **kw), jax.jit(ref.apply)(v, **batch, **kw), rows, 3e-2)
  assert cudnn_calls and all(c["bias"] is not None and c["bias"][2] == c["q"][1]
                             for c in cudnn_calls)


def test_encoder_sequence_output_with_the_xla_arguments(cudnn_calls):
  """BertModel's full sequence output (fine-tuning's token heads) in float32."""
  batch, mask = _padded()
  enc = model_lib.BertModel(SMALL)
  args = (batch["input_ids"], batch["segment_ids"], batch["input_mask"])
  v = nn.unbox(enc.init(jax.random.key(1), *args))
  seq_ref, pooled_ref = enc.apply(v, *args)
  seq, pooled = model_lib.BertModel(SMALL.replace(attention_impl="xla")).apply(v, *args)
  np.testing.assert_allclose(seq[mask > 0], seq_ref[mask > 0], atol=2e-5)
  np.testing.assert_allclose(pooled[:2], pooled_ref[:2], atol=2e-5)


def test_attention_impl_is_checked():
  with pytest.raises(errors.ConfigError, match="bfloat16"):
    SMALL.replace(attention_impl="cudnn")
  with pytest.raises(errors.ConfigError, match="unknown"):
    SMALL.replace(attention_impl="flash")


@pytest.mark.parametrize("impl", ["cudnn", "pallas"])
@pytest.mark.parametrize("rows", ["padded", "causal", "packed"])
def test_the_training_step_lowers_for_cuda(monkeypatch, impl, rows):
  """No GPU here, but the CUDA program of a training step's gradient is built: for cuDNN
  through jax's own cuDNN checks (its version and chip checks stubbed as a Hopper's), which
  refused the [B, 1, 1, M] bias before and odd lengths with a bias (the heads' rows of packed
  rows: 2 + 5 queries); for the Pallas kernels through Triton, attention dropout on."""
  fa = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
  if not hasattr(fa, "check_cudnn_version") or not hasattr(fa, "check_compute_capability"):
    pytest.skip("this jax's cuDNN checks differ")
  monkeypatch.setattr(fa, "check_cudnn_version", lambda: 91000)
  monkeypatch.setattr(fa, "check_compute_capability", lambda capability: True)
  cfg = model_lib.BertConfig(vocab_size=97, hidden_size=128, num_layers=2, num_heads=2,
                             intermediate_size=64, max_position_embeddings=64, dtype="bfloat16",
                             attention_impl=impl, hidden_dropout_rate=0.1,
                             attention_dropout_rate=0.1 if impl == "pallas" else 0.0,
                             causal=rows == "causal")
  B, L, P = 2, 63, 5
  batch = dict(input_ids=jnp.ones((B, L), jnp.int32), segment_ids=jnp.zeros((B, L), jnp.int32),
               input_mask=jnp.ones((B, L), jnp.int32), masked_lm_positions=jnp.zeros((B, P), jnp.int32))
  kw = {} if rows != "packed" else dict(
      position_ids=jnp.zeros((B, L), jnp.int32), packed_example_ids=jnp.ones((B, L), jnp.int32),
      cls_positions=jnp.zeros((B, 2), jnp.int32))
  model = model_lib.BertForPreTraining(cfg)
  params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), **batch, **kw)))["params"]

  def loss(p):
    out = model.apply({"params": p}, **batch, **kw, deterministic=False,
                      rngs={"dropout": jax.random.key(1)})
    return out["mlm_logits"].astype(jnp.float32).sum()

  text = jax.jit(jax.grad(loss)).trace(params).lower(lowering_platforms=("cuda",)).as_text()
  if impl == "cudnn":
    assert "__cudnn$fmha" in text and "Backward" in text
  else:
    assert text.count("custom_call @__gpu$xla.gpu.triton") == 3 * cfg.num_layers
