"""Fine-tuning heads: shapes, losses, and loading the encoder from a pre-trained checkpoint."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import formats, heads, loader, objectives
from bert_jax.models import bert as model_lib

CFG = model_lib.BertConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2,
                           intermediate_size=32, max_position_embeddings=16)


def _inputs(*shape):
  ids = jnp.ones(shape, jnp.int32)
  return ids, jnp.zeros_like(ids), jnp.ones_like(ids)


@pytest.mark.parametrize("module,shape,expected", [
    (heads.BertForSequenceClassification(CFG, num_labels=3), (4, 8), [(4, 3)]),
    (heads.BertForSequenceClassification(CFG, num_labels=1), (4, 8), [(4, 1)]),
    (heads.BertForQuestionAnswering(CFG), (4, 8), [(4, 8), (4, 8)]),
    (heads.BertForTokenClassification(CFG, num_labels=5), (4, 8), [(4, 8, 5)]),
    (heads.BertForMultipleChoice(CFG), (2, 4, 8), [(2, 4)]),
])
def test_head_shapes_and_encoder_under_bert(module, shape, expected):
  v = nn.unbox(module.init(jax.random.key(0), *_inputs(*shape)))
  out = module.apply(v, *_inputs(*shape))
  out = out if isinstance(out, tuple) else (out,)
  assert [o.shape for o in out] == expected
  assert set(v["params"]) == {"bert", "classifier"}


def test_pretrained_encoder_drops_into_a_head(tmp_path):
  pt = model_lib.BertForPreTraining(CFG)
  ids, seg, mask = _inputs(2, 8)
  params = nn.unbox(pt.init(jax.random.key(1), ids, seg, mask, ids[:, :2]))["params"]
  formats.save_native(str(tmp_path), CFG, params)
  _, encoder = loader.read(str(tmp_path), target="encoder")
  head = heads.BertForSequenceClassification(CFG, num_labels=2)
  fresh = nn.unbox(head.init(jax.random.key(2), ids, seg, mask))["params"]
  assert jax.tree_util.tree_structure(fresh["bert"]) == jax.tree_util.tree_structure(encoder)
  jax.tree_util.tree_map(np.testing.assert_array_equal, encoder, jax.device_get(params["bert"]))


def test_losses_hand_computed():
  logits = jnp.log(jnp.array([[0.5, 0.5], [0.9, 0.1]]))
  classify = objectives.supervised(heads.classification_sums)
  batch = {"labels": jnp.array([0, 0]), "input_ids": jnp.zeros((2, 3), jnp.int32)}  # 2 rows
  loss, m = classify.batch_loss(logits, batch), heads.classification_sums(logits, batch)
  np.testing.assert_allclose(loss, -(np.log(0.5) + np.log(0.9)) / 2, rtol=1e-6)
  assert float(m["weight"]) == 2.0
  loss = classify.batch_loss(jnp.array([[1.0], [3.0]]), {**batch, "labels": jnp.array([2.0, 2.0])})
  np.testing.assert_allclose(loss, 1.0)
  start = jnp.log(jnp.array([[0.25, 0.75]]))
  end = jnp.log(jnp.array([[0.5, 0.5]]))
  loss = objectives.supervised(heads.span_sums).batch_loss(
      (start, end), {"start_positions": jnp.array([1]), "end_positions": jnp.array([0]),
                     "input_ids": jnp.zeros((1, 2), jnp.int32)})
  np.testing.assert_allclose(loss, -(np.log(0.75) + np.log(0.5)) / 2, rtol=1e-6)
  tok = jnp.log(jnp.array([[[0.2, 0.8], [0.6, 0.4]]]))
  batch = {"labels": jnp.array([[1, 1]]), "label_weights": jnp.array([[1.0, 0.0]])}
  loss = objectives.supervised(heads.token_sums, "label_weights").batch_loss(tok, batch)
  m = heads.token_sums(tok, batch)
  np.testing.assert_allclose(loss, -np.log(0.8), rtol=1e-6)
  assert float(m["correct_sum"]) == 1.0
