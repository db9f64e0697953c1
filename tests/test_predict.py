"""Inference: fill-mask and feature extraction from a saved checkpoint."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import convert, predict
from bert_jax import model as model_lib
from tests.test_task_data import make_vocab


def _checkpoint(tmp_path):
  tok = make_vocab(tmp_path, ["the cat sat on the mat . a dog ran"])
  cfg = model_lib.BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_layers=3, num_heads=2,
                             intermediate_size=32, max_position_embeddings=32)
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, ids, ids, ids))["params"]
  convert.save_native(str(tmp_path / "ckpt"), cfg, params)
  return tok, cfg, params


def test_fill_mask_ranks_by_model_probability(tmp_path, capsys):
  tok, cfg, params = _checkpoint(tmp_path)
  res = predict.fill_mask(cfg, params, tok, ["the cat [MASK] on the [MASK] ."], top_k=3)
  assert len(res) == 1 and len(res[0]) == 2 and len(res[0][0]) == 3
  ids = predict.encode_with_masks(tok, "the cat [MASK] on the [MASK] .", 32)
  assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "the", "cat", "[MASK]", "on", "the", "[MASK]", ".", "[SEP]"]
  out = model_lib.BertForPreTraining(cfg).apply(
      {"params": params}, jnp.array([ids]), jnp.zeros((1, 9), jnp.int32), jnp.ones((1, 9), jnp.int32),
      jnp.array([[3, 6]]))
  probs = np.asarray(jax.nn.softmax(out["mlm_logits"][0, 0]))
  assert res[0][0][0][0] == tok.convert_ids_to_tokens([int(np.argmax(probs))])[0]
  np.testing.assert_allclose(res[0][0][0][1], probs.max(), rtol=1e-5)
  predict.main([f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}",
                "--text=a dog [MASK] .", "--top_k=2"])
  assert "[MASK] #1:" in capsys.readouterr().out


def test_features_match_the_encoder_outputs(tmp_path):
  tok, cfg, params = _checkpoint(tmp_path)
  texts = ["the cat sat", "a dog ran on the mat"]
  feats, mask = predict.extract_features(cfg, params, tok, texts, layers=[-1, 0], max_len=12)
  assert feats.shape == (2, 12, 2, 16)
  ids = np.zeros((2, 12), np.int32)
  for i, t in enumerate(texts):
    row = [tok.cls_id] + tok.encode(t) + [tok.sep_id]
    ids[i, :len(row)] = row
  seq, pooled = model_lib.BertModel(cfg).apply({"params": params["bert"]}, jnp.asarray(ids),
                                               jnp.zeros_like(ids), jnp.asarray(mask))
  np.testing.assert_allclose(feats[:, :, 0], seq, atol=1e-5)
  pooled_feats, _ = predict.extract_features(cfg, params, tok, texts, max_len=12, pooled=True)
  np.testing.assert_allclose(pooled_feats, pooled, atol=1e-5)
  out = tmp_path / "f.npy"
  predict.main([f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}", "--mode=features",
                "--text=the cat", "--layers=-1,-2", f"--output={out}", "--max_seq_length=8"])
  assert np.load(out).shape == (1, 8, 2, 16)
