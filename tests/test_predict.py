"""Inference: fill-mask and feature extraction from a saved checkpoint."""
import json
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert, predict
from bert_jax import model as model_lib
from tests import test_train_utils as tu
from tests.test_task_data import make_vocab


def _checkpoint(tmp_path, num_layers=3):
  tok = make_vocab(tmp_path, ["the cat sat on the mat . a dog ran"])
  cfg = model_lib.BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_layers=num_layers, num_heads=2,
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


def test_features_of_a_layer_the_model_does_not_have_is_a_clear_error(tmp_path, capsys):
  """The README's --layers=-1,-2,-3,-4 on a 2-layer model: one line naming the layer and the depth."""
  _checkpoint(tmp_path, num_layers=2)
  with pytest.raises(SystemExit) as e:
    predict.main([f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}", "--mode=features",
                  "--text=the cat", "--layers=-1,-2,-3,-4", f"--output={tmp_path / 'f.npy'}"])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "--layers=-1,-2,-3,-4: layer -3 is out of range: the model has 2 layers" in err, err
  assert "Traceback" not in err and not (tmp_path / "f.npy").exists()
  with pytest.raises(SystemExit):
    predict.main([f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}", "--mode=features",
                  "--text=the cat", "--layers=last"])
  assert "--layers=last: expected comma-separated integers" in capsys.readouterr().err


ORBAX_NOISE = ("_CHECKPOINT_METADATA", "Metadata file does not exist", "read_only=True",
               "Given directory is read only")


@pytest.fixture(scope="module")
def pretraining_workdir(tmp_path_factory):
  """A 2-layer pre-training workdir of ours (Orbax checkpoints), with a vocabulary of its size."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  tmp = tmp_path_factory.mktemp("pretrain_run")
  tu.use_compilation_cache()
  train.train_and_evaluate(tu.tiny_config(num_train_steps=1, checkpoint_every_steps=1), str(tmp / "run"))
  words = [f"w{i}" for i in range(tu.TINY["model.vocab_size"] - 5)]
  (tmp / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
  return str(tmp / "run"), str(tmp / "vocab.txt")


def test_predict_from_our_workdir_prints_no_orbax_warnings(pretraining_workdir):
  run, vocab = pretraining_workdir
  proc = tu.run([sys.executable, "-m", "bert_jax.predict", f"--checkpoint={run}", f"--vocab={vocab}",
                 "--text=w1 [MASK] w3"], timeout=120)
  assert "[MASK] #1:" in proc.stdout
  noise = [line for line in proc.stderr.splitlines() if any(n in line for n in ORBAX_NOISE)]
  assert not noise, proc.stderr


def test_finetuning_from_our_workdir_logs_no_orbax_warnings(tmp_path, pretraining_workdir, caplog):
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from configs import classify_custom  # pylint: disable=g-import-not-at-top
  run, vocab = pretraining_workdir
  rows = [{"text": f"w{i % 7} w{i % 3}", "label": str(i % 2)} for i in range(16)]
  (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  c = classify_custom.get_config()
  c.init_checkpoint, c.vocab_path = run, vocab
  c.train_file = c.eval_file = str(tmp_path / "train.jsonl")
  c.max_seq_length, c.global_batch_size, c.eval_batch_size, c.num_epochs = 16, 8, 8, 1
  with caplog.at_level("INFO"):
    finetune.finetune(c, str(tmp_path / "work"))
  assert (tmp_path / "work" / "metrics.json").exists()
  noise = [r.getMessage() for r in caplog.records if any(n in r.getMessage() for n in ORBAX_NOISE)]
  assert not noise, noise
