"""Packed rows give the same loss and gradients as the unpacked batch of the same examples."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import bert as model_lib
from bert_jax import objectives
from input_pipeline.packing import pack_examples

CFG = model_lib.BertConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                           max_position_embeddings=64, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)


def _unpacked(n=5, length=24, preds=4, seed=0):
  rng = np.random.default_rng(seed)
  b = {k: np.zeros((n, length), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  b.update(masked_lm_positions=np.zeros((n, preds), np.int32), masked_lm_ids=np.zeros((n, preds), np.int32),
           masked_lm_weights=np.zeros((n, preds), np.float32), next_sentence_labels=rng.integers(0, 2, n).astype(np.int32))
  for i in range(n):
    la, lb = rng.integers(2, 8, size=2)
    ids = [2] + list(rng.integers(5, 60, la)) + [3] + list(rng.integers(5, 60, lb)) + [3]
    b["input_ids"][i, :len(ids)] = ids
    b["input_mask"][i, :len(ids)] = 1
    b["segment_ids"][i, la + 2:len(ids)] = 1
    k = rng.integers(1, preds + 1)
    pos = np.sort(rng.choice(np.arange(1, len(ids) - 1), size=k, replace=False))
    b["masked_lm_positions"][i, :k] = pos
    b["masked_lm_ids"][i, :k] = rng.integers(5, 60, k)
    b["masked_lm_weights"][i, :k] = 1.0
  return b


@pytest.mark.slow  # ~55 s (CI runs the slow tier; test_pretrain_packing's step test is in the default suite)
def test_packing_matches_unpacked_loss_and_gradients():
  b = _unpacked()
  packed = pack_examples(b, max_seq_length=48, max_examples_per_row=4, max_predictions_per_row=12)
  assert packed["input_ids"].shape[0] < 5  # Really packed.
  assert packed["example_weights"].sum() == 5
  assert (packed["input_mask"].sum() == b["input_mask"].sum())
  m = model_lib.BertForPreTraining(CFG)
  ids = jnp.asarray(b["input_ids"])
  params = nn.unbox(m.init(jax.random.key(0), ids, ids, ids, jnp.asarray(b["masked_lm_positions"])))["params"]

  def loss_unpacked(p):
    out = m.apply({"params": p}, b["input_ids"], b["segment_ids"], b["input_mask"], b["masked_lm_positions"])
    return objectives.pretraining().batch_loss(out, b)

  def loss_packed(p):
    out = m.apply({"params": p}, packed["input_ids"], packed["segment_ids"], packed["input_mask"],
                  packed["masked_lm_positions"], position_ids=packed["position_ids"],
                  packed_example_ids=packed["packed_example_ids"], cls_positions=packed["cls_positions"])
    return objectives.pretraining().batch_loss(out, packed)

  l1, g1 = jax.value_and_grad(loss_unpacked)(params)
  l2, g2 = jax.value_and_grad(loss_packed)(params)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  jax.tree_util.tree_map(lambda a, c: np.testing.assert_allclose(a, c, atol=2e-5), g1, g2)


def test_packed_examples_do_not_see_each_other():
  b = _unpacked(n=2, seed=3)
  packed = pack_examples(b, 48, 2, 8)
  assert packed["input_ids"].shape[0] == 1
  m = model_lib.BertModel(CFG)
  v = nn.unbox(m.init(jax.random.key(1), jnp.asarray(packed["input_ids"])))
  run = lambda ids: m.apply(v, ids, packed["segment_ids"], packed["input_mask"], position_ids=packed["position_ids"],
                            packed_example_ids=packed["packed_example_ids"])[0]
  changed = packed["input_ids"].copy()
  second = packed["packed_example_ids"][0] == 2
  changed[0, second] = 7  # Rewrite example 2 entirely.
  first = packed["packed_example_ids"][0] == 1
  np.testing.assert_allclose(np.asarray(run(changed))[0, first], np.asarray(run(packed["input_ids"]))[0, first], atol=1e-6)


def test_pack_examples_layout_and_limits():
  b = _unpacked(n=40, seed=5)
  b["labels"] = np.arange(40, dtype=np.int32)
  rows = pack_examples(b, max_seq_length=48, max_examples_per_row=3, max_predictions_per_row=6)
  w = rows["example_weights"] > 0
  assert w.sum() == 40 and w.sum(-1).max() <= 3
  assert (rows["masked_lm_weights"].sum(-1) <= 6).all()
  # Order-preserving: reading the slots row by row by example order gives every example once.
  got = sorted(rows["labels"][w].tolist())
  assert got == list(range(40))
  for r in range(len(rows["input_ids"])):
    for e in np.nonzero(w[r])[0]:
      i = rows["labels"][r, e]
      l = int(b["input_mask"][i].sum())
      s = rows["cls_positions"][r, e]
      np.testing.assert_array_equal(rows["input_ids"][r, s:s + l], b["input_ids"][i, :l])
      np.testing.assert_array_equal(rows["position_ids"][r, s:s + l], np.arange(l))
      assert (rows["packed_example_ids"][r, s:s + l] == e + 1).all()
  # Masked positions point at the same tokens as before packing.
  for r in range(len(rows["input_ids"])):
    k = rows["masked_lm_weights"][r] > 0
    assert (rows["input_mask"][r, rows["masked_lm_positions"][r, k]] == 1).all()
  assert rows["input_mask"].sum() == b["input_mask"].sum()


def test_pack_examples_rejects_what_does_not_fit():
  b = _unpacked(n=3, length=24)
  with np.testing.assert_raises_regex(ValueError, "packed row holds"):
    pack_examples(b, max_seq_length=4, max_examples_per_row=2)
