"""The BERT paper's ablation models (Table 5), added through the registry and the task
records: a left-to-right LM pre-trained by the main job (`--config.objective=ltr`) and
fine-tuned like any encoder (left-only at fine-tuning too), and a BiLSTM on the encoder as a
fine-tuning head option."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import heads, loader, objectives, registry, train
from bert_jax.models import bert as model_lib
from common import errors
from tests import test_train_utils as tu
from tests.test_finetune import _common, pretrained  # noqa: F401  (module fixture)
from tests.test_task_data import CONTEXT, _squad_file

tu.use_compilation_cache()

CFG = model_lib.BertConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4,
                           intermediate_size=64, max_position_embeddings=16,
                           hidden_dropout_rate=0.0, attention_dropout_rate=0.0)


def _batch(seed=0, rows=3, length=12):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 50, size=(rows, length)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 9:] = 0
  ids[1, 9:] = 0
  return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask}


def test_causal_encoder_sees_only_the_left():
  """Changing token t changes no output before t (and does change t's)."""
  module = model_lib.BertModel(CFG.replace(causal=True), add_pooler=False)
  b = _batch()
  params = module.init(jax.random.key(0), b["input_ids"])["params"]
  run = lambda ids: np.asarray(module.apply({"params": params}, ids, b["segment_ids"],
                                            b["input_mask"])[0])
  changed = b["input_ids"].copy()
  changed[:, 6] = 7
  before, after = run(b["input_ids"]), run(changed)
  np.testing.assert_array_equal(before[:, :6], after[:, :6])
  assert np.abs(before[:, 6] - after[:, 6]).max() > 1e-4
  # A bidirectional encoder would see it everywhere.
  both = model_lib.BertModel(CFG, add_pooler=False)
  run2 = lambda ids: np.asarray(both.apply({"params": params}, ids, b["segment_ids"],
                                           b["input_mask"])[0])
  assert np.abs(run2(b["input_ids"])[:, :6] - run2(changed)[:, :6]).max() > 1e-4


def test_causal_pooler_reads_the_last_real_token():
  """[CLS] sees only itself under a left-only mask: the pooled output is the last real
  token's (the one that sees the whole input), also in the pooled-only path."""
  cfg = CFG.replace(causal=True)
  b = _batch()
  full = model_lib.BertModel(cfg)
  params = nn.unbox(full.init(jax.random.key(1), b["input_ids"]))["params"]
  seq, pooled = full.apply({"params": params}, b["input_ids"], b["segment_ids"], b["input_mask"])
  last = b["input_mask"].sum(-1) - 1
  want = np.tanh(np.asarray(seq)[np.arange(3), last] @ np.asarray(params["pooler"]["kernel"])
                 + np.asarray(params["pooler"]["bias"]))
  np.testing.assert_allclose(np.asarray(pooled), want, atol=1e-5)
  _, only = model_lib.BertModel(cfg, pooled_only=True).apply(
      {"params": params}, b["input_ids"], b["segment_ids"], b["input_mask"])
  np.testing.assert_allclose(np.asarray(only), np.asarray(pooled), atol=1e-5)


def test_ltr_loss_is_next_token_cross_entropy_on_the_restored_text():
  """The pipeline's masked batch is read back to its text (masked positions hold their
  original ids again), and every real token predicts the next one."""
  objective = objectives.ltr()
  b = _batch()
  original = b["input_ids"].copy()
  masked = dict(b, input_ids=original.copy(),
                masked_lm_positions=np.array([[2, 5, 0], [3, 0, 0], [1, 4, 7]], np.int32),
                masked_lm_ids=np.array([[original[0, 2], original[0, 5], 0],
                                        [original[1, 3], 0, 0],
                                        [original[2, 1], original[2, 4], original[2, 7]]],
                                       np.int32),
                masked_lm_weights=np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], np.float32),
                next_sentence_labels=np.zeros(3, np.int32))
  for r, positions in ((0, (2, 5)), (1, (3,)), (2, (1, 4, 7))):
    masked["input_ids"][r, list(positions)] = 3  # [MASK]
  np.testing.assert_array_equal(objectives.restore_text(masked)["input_ids"], original)
  logits = np.random.default_rng(0).normal(size=(3, 12, 50)).astype(np.float32)
  sums = objective.sums({"mlm_logits": jnp.asarray(logits)}, masked)
  logp = jax.nn.log_softmax(logits, -1)
  nll, weight = 0.0, 0
  for r in range(3):
    n = int(b["input_mask"][r].sum())
    for t in range(n - 1):
      nll -= float(logp[r, t, original[r, t + 1]])
      weight += 1
  assert float(sums["lm_weight"]) == weight == 11 + 8 + 11
  np.testing.assert_allclose(float(sums["lm_loss_sum"]), nll, rtol=1e-5)
  np.testing.assert_allclose(float(objective.batch_loss({"mlm_logits": jnp.asarray(logits)},
                                                        masked)), nll / weight, rtol=1e-5)


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_ltr_pretrains_through_the_main_job_and_resumes(tmp_path):
  """--config.objective=ltr: the registry's left-to-right model, learning; its checkpoint
  records causal=True, so fine-tuning and predict build the left-only encoder."""
  with pytest.raises(errors.ConfigError, match="objective=ltr.*data.nsp=False"):
    registry.pretraining(tu.tiny_config(objective="ltr"))
  config = tu.tiny_config(objective="ltr", data__nsp=False, num_train_steps=6,
                          opt__learning_rate=1e-2, model__hidden_dropout_rate=0.0,
                          model__attention_dropout_rate=0.0)
  state = train.train_and_evaluate(config, str(tmp_path))
  losses = tu.read_scalars(tmp_path, "train/loss")
  assert sorted(losses) == [1, 2, 3, 4, 5, 6] and losses[6] < losses[1]
  cfg, params = loader.read(str(tmp_path), "encoder")
  assert cfg.causal and "pooler" not in params
  assert int(state.step) == 6
  # Stopped at step 3 and rerun: the same weights, bit for bit.
  config.max_steps_per_run = 3
  train.train_and_evaluate(config, str(tmp_path / "twice"))
  again = train.train_and_evaluate(config, str(tmp_path / "twice"))
  assert int(again.step) == 6
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bilstm_head_reads_the_encoder_through_a_bidirectional_lstm():
  module = heads.BertForQuestionAnswering(CFG, bilstm_units=8)
  b = _batch()
  params = nn.unbox(module.init(jax.random.key(0), b["input_ids"], b["segment_ids"],
                               b["input_mask"]))["params"]
  assert {"bert", "bilstm", "classifier"} <= set(params)
  assert params["classifier"]["kernel"].shape == (16, 2)  # both directions
  start, end = module.apply({"params": params}, b["input_ids"], b["segment_ids"], b["input_mask"])
  assert start.shape == end.shape == (3, 12)
  # The backward direction reads the right context: a later token changes earlier logits.
  changed = b["input_ids"].copy()
  changed[:, 7] = 9
  s2, _ = module.apply({"params": params}, changed, b["segment_ids"], b["input_mask"])
  assert np.abs(np.asarray(s2)[:, :7] - np.asarray(start)[:, :7]).max() > 1e-5
  plain = heads.BertForQuestionAnswering(CFG)
  assert "bilstm" not in plain.init(jax.random.key(0), b["input_ids"], b["segment_ids"],
                                    b["input_mask"])["params"]


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_squad_with_bilstm_fine_tunes_saves_and_predicts(tmp_path, pretrained, capsys):  # noqa: F811
  """config.bilstm_units: the head option through the whole job (sharded training, best/,
  predict --mode=qa, which builds the head from the task record and the saved config)."""
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import squad  # pylint: disable=g-import-not-at-top
  c = squad.get_config("v1")
  c.train_file = c.eval_file = _squad_file(tmp_path, version_2=False)
  c.max_seq_length, c.doc_stride, c.max_query_length = 48, 16, 12
  c.bilstm_units = 8
  best = _common(c, pretrained, tmp_path / "work")
  assert 0.0 <= best["f1"] <= 100.0
  _, params = loader.read(str(tmp_path / "work" / "best"), "all")
  assert "bilstm" in params and params["classifier"]["kernel"].shape == (16, 2)
  predict.main([f"--checkpoint={tmp_path / 'work'}", f"--vocab={pretrained[1]}", "--mode=qa",
                "--question=Who was their leader?", "--context=" + CONTEXT])
  out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert isinstance(out["answer"], str)
