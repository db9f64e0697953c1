"""Feature-based fine-tuning (the paper's Table 7, issue 36 item 1): a frozen encoder whose
layers are combined as config.features says and read by a BiLSTM before the classifier."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import finetune, finetuned, formats, heads, loader, optim, predict
from bert_jax.models import modern
from bert_jax.models import bert as model_lib
from bert_jax.configs import conll
from common import errors
from tests.test_task_data import make_vocab

SENT = ("EU NNP B-NP I-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP I-MISC\ncall NN I-NP O\n\n"
        "Peter NNP B-NP I-PER\n\n")


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("four")
  tok = make_vocab(tmp, ["EU rejects German call Peter the cat sat on a mat"])
  cfg = model_lib.BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_layers=4, num_heads=2,
                             intermediate_size=32, max_position_embeddings=32)
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, ids, ids, ids))["params"]
  formats.save_native(str(tmp / "ckpt"), cfg, params)
  return str(tmp / "ckpt"), str(tmp / "vocab.txt"), cfg, params


def _config(four_layers, tmp_path, **fields):
  (tmp_path / "train.txt").write_text("-DOCSTART- -X- -X- O\n\n" + SENT * 8)
  (tmp_path / "valid.txt").write_text(SENT)
  c = conll.get_config("features")
  c.init_checkpoint, c.vocab_path = four_layers[0], four_layers[1]
  c.data_dir, c.max_seq_length = str(tmp_path), 16
  c.num_epochs, c.global_batch_size, c.eval_batch_size, c.log_every_steps = 3, 8, 8, 1000
  c.bilstm_units = 8
  c.opt.learning_rate = 1e-2
  for k, v in fields.items():
    c[k] = v
  return c


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
@pytest.mark.parametrize("features", ["concat_last4", pytest.param("sum_all", marks=pytest.mark.slow)])
def test_a_frozen_encoder_is_bit_identical_after_training(four_layers, tmp_path, features, capsys):
  c = _config(four_layers, tmp_path, features=features)
  best = finetune.finetune(c, str(tmp_path / "work"))
  assert {"precision", "recall", "f1"} <= set(best)
  predict.main([f"--checkpoint={tmp_path / 'work'}", f"--vocab={four_layers[1]}", "--mode=tag",
                "--text=EU rejects German call"])  # predict rebuilds the feature-based head
  tagged = capsys.readouterr().out.strip().splitlines()[-1].split()
  assert [t.split("/")[0] for t in tagged] == ["EU", "rejects", "German", "call"]
  _, trained = loader.read(str(tmp_path / "work"), "encoder")
  _, before = loader.read(four_layers[0], "encoder")
  before = {k: before[k] for k in trained}  # (the head reads no pooler: it has none)
  same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), trained, before)
  assert all(jax.tree.leaves(same)), same
  # The optimizer holds state for the head only: none for the encoder's parameters.
  params = {"bert": before, "classifier": {"kernel": jnp.zeros((16, 3))}}
  state = optim.make_optimizer(c, total_steps=10).init(params)
  sized = [x.size for x in jax.tree.leaves(state) if getattr(x, "ndim", 0) > 0]
  assert sum(sized) == 2 * 16 * 3  # Adam's two moments of the classifier kernel alone


def test_each_feature_choice_and_the_learned_weights():
  rng = np.random.default_rng(0)
  hidden = [jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32) for _ in range(5)]  # emb + 4
  shapes = {}
  for features in heads.FEATURES:
    module = heads.LayerFeatures(features)
    states = heads.select_states(features, hidden)
    variables = module.init(jax.random.key(0), states)
    out = module.apply(variables, states)
    shapes[features] = out.shape
    if features in ("sum_last4", "sum_all"):
      states = hidden[-4:] if features == "sum_last4" else hidden[1:]
      weights = variables["params"]["layer_weights"]
      assert weights.shape == (len(states),)
      np.testing.assert_allclose(out, sum(states) / len(states), rtol=1e-6)  # equal at start
      w = jnp.arange(len(states), dtype=jnp.float32)
      out = module.apply({"params": {"layer_weights": w}}, heads.select_states(features, hidden))
      np.testing.assert_allclose(out, sum(p * s for p, s in zip(jax.nn.softmax(w), states)),
                                 rtol=1e-5)
  for features, want in (("embeddings", hidden[0]), ("second_to_last", hidden[-2]),
                         ("last", hidden[-1])):
    np.testing.assert_array_equal(
        heads.LayerFeatures(features).apply({}, heads.select_states(features, hidden)), want)
  np.testing.assert_array_equal(
      heads.LayerFeatures("concat_last4").apply({}, heads.select_states("concat_last4", hidden)),
      jnp.concatenate(hidden[-4:], -1))
  assert shapes == {"last": (2, 5, 8), "embeddings": (2, 5, 8), "second_to_last": (2, 5, 8),
                    "sum_last4": (2, 5, 8), "concat_last4": (2, 5, 32), "sum_all": (2, 5, 8)}


def test_hidden_states_are_the_models_and_predicts_features(four_layers):
  _, vocab, cfg, params = four_layers
  tok = predict.Tokenizer.from_path(vocab)
  feats, mask = predict.extract_features(cfg, params, tok, ["EU rejects German call", "Peter"],
                                         layers=(-1, -2, -3, -4), max_len=16)
  rows = [[tok.cls_id] + tok.encode(t) + [tok.sep_id] for t in ["EU rejects German call", "Peter"]]
  ids = np.zeros((2, 16), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
  model = model_lib.BertModel(cfg)
  hidden = model.apply({"params": params["bert"]}, jnp.asarray(ids), jnp.zeros_like(ids),
                       jnp.asarray(mask), method=model_lib.BertModel.hidden_states)
  assert len(hidden) == cfg.num_layers + 1
  seq, _ = model.apply({"params": params["bert"]}, jnp.asarray(ids), jnp.zeros_like(ids),
                       jnp.asarray(mask))
  np.testing.assert_array_equal(hidden[-1], seq)
  for j, layer in enumerate((-1, -2, -3, -4)):
    np.testing.assert_allclose(feats[:, :, j], hidden[layer], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fields,message", [
    ({"features": "middle"}, "--config.features='middle': choose one of last, embeddings"),
    ({"bilstm_layers": 0}, "--config.bilstm_layers=0"),
])
def test_bad_feature_fields_are_one_line_before_any_work(four_layers, tmp_path, fields, message):
  c = _config(four_layers, tmp_path, **fields)
  with pytest.raises(errors.ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
    finetune.finetune(c, str(tmp_path / "work"))
  assert not (tmp_path / "work" / "checkpoints").exists()


def test_too_few_layers_or_packing_are_one_line(four_layers, tmp_path):
  two = heads.BertForTokenClassification(four_layers[2].replace(num_layers=2), num_labels=3,
                                         how=heads.FeatureBased("concat_last4", freeze=True))
  ids = jnp.ones((1, 4), jnp.int32)
  with pytest.raises(errors.ConfigError, match="reads 4 encoder layers; this checkpoint has 2"):
    two.init(jax.random.key(0), ids, ids, ids)
  from bert_jax.configs import glue  # pylint: disable=g-import-not-at-top
  c = glue.get_config("cola")
  c.init_checkpoint, c.vocab_path, c.freeze_encoder, c.packing = (
      four_layers[0], four_layers[1], True, True)
  with pytest.raises(errors.ConfigError, match="--config.packing with --config.features"):
    finetune.check_config(c)


MODERN = modern.ModernConfig(vocab_size=40, hidden_size=16, num_layers=4, num_heads=2,
                             intermediate_size=32, local_window=4, global_every=2,
                             max_position_embeddings=32)
HOWS = [heads.FeatureBased("sum_all", freeze=True, bilstm_units=4, bilstm_layers=2),
        heads.FeatureBased("last", freeze=True),
        heads.FeatureBased("concat_last4", bilstm_units=4)]


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
@pytest.mark.parametrize("family", ["bert", "modern"])
@pytest.mark.parametrize("head", ["classify", "qa", "tag", "choice"])
def test_every_head_is_feature_based_and_a_frozen_encoder_gets_no_gradient(four_layers, family,
                                                                           head):
  """Each task's head takes heads.FeatureBased (issue 36: every task of the suite): its
  output shape is the plain head's, and when frozen no gradient reaches the encoder while the
  new layers (layer weights, BiLSTMs, classifier) learn."""
  cfg = four_layers[2] if family == "bert" else MODERN
  make = {"classify": lambda how: heads.BertForSequenceClassification(cfg, num_labels=3, how=how),
          "qa": lambda how: heads.BertForQuestionAnswering(cfg, how=how),
          "tag": lambda how: heads.BertForTokenClassification(cfg, num_labels=3, how=how),
          "choice": lambda how: heads.BertForMultipleChoice(cfg, how=how)}[head]
  shape = (2, 3, 8) if head == "choice" else (2, 8)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(5, 16, shape), jnp.int32)
  mask = jnp.asarray(np.arange(8) < np.where(np.arange(shape[-2]) % 2, 5, 8)[..., None], jnp.int32)
  if head == "choice":
    mask = jnp.broadcast_to(mask[None, :3], shape)
  plain = make(heads.FeatureBased())
  want = jax.tree.map(jnp.shape, plain.apply(plain.init(jax.random.key(0), ids, ids * 0, mask),
                                            ids, ids * 0, mask))
  for how in HOWS:
    model = make(how)
    params = nn.unbox(model.init(jax.random.key(1), ids, ids * 0, mask))["params"]
    assert jax.tree.map(jnp.shape, model.apply({"params": params}, ids, ids * 0, mask)) == want
    loss = lambda p: sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(  # pylint: disable=cell-var-from-loop
        model.apply({"params": p}, ids, ids * 0, mask)))  # pylint: disable=cell-var-from-loop
    grads = jax.grad(loss)(params)
    encoder = [float(jnp.abs(g).max()) for g in jax.tree.leaves(grads["bert"])]
    head_grads = {k: max(float(jnp.abs(g).max()) for g in jax.tree.leaves(v))
                  for k, v in grads.items() if k != "bert"}
    assert max(encoder) == (0.0 if how.freeze else max(encoder)) and (
        how.freeze or max(encoder) > 0), how
    assert all(g > 0 for g in head_grads.values()), (how, head_grads)
    assert ("features" in params) == (how.features in ("sum_all", "sum_last4")) or (
        "features" not in params)
    assert sum(k.startswith("bilstm") for k in params) == (how.bilstm_layers if how.bilstm_units
                                                           else 0)


def _cola_config(four_layers, tmp_path):
  """CoLA (tests/suite_data.py) feature-based on the four-layer checkpoint: the last four
  layers' weighted sum, frozen, a BiLSTM of 8."""
  from bert_jax.configs import glue  # pylint: disable=g-import-not-at-top
  from tests import suite_data  # pylint: disable=g-import-not-at-top
  suite_data.make_glue(tmp_path / "glue")
  c = glue.get_config("cola")
  c.init_checkpoint, c.vocab_path = four_layers[0], four_layers[1]
  c.data_dir, c.max_seq_length = str(tmp_path / "glue" / "CoLA"), 16
  c.features, c.freeze_encoder, c.bilstm_units = "sum_last4", True, 8
  c.num_epochs, c.global_batch_size, c.eval_batch_size, c.log_every_steps = 2, 8, 8, 1000
  return c


def test_a_sentence_task_fine_tunes_frozen_and_predict_rebuilds_its_head(four_layers, tmp_path,
                                                                         capsys):
  """GLUE (CoLA) feature-based end to end: the encoder bit-identical after training, the
  weighted sum and BiLSTM trained, predict --mode=classify reading best/'s head."""
  c = _cola_config(four_layers, tmp_path)
  c.opt.learning_rate = 1e-2
  best = finetune.finetune(c, str(tmp_path / "work"))
  assert "matthews_corrcoef" in best or "accuracy" in best
  _, trained = loader.read(str(tmp_path / "work"), "encoder")
  _, before = loader.read(four_layers[0], "encoder")
  same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), trained,
                      {k: before[k] for k in trained})
  assert all(jax.tree.leaves(same)), same
  cfg, params, saved, labels = finetuned.load(str(tmp_path / "work"))
  assert saved["features"] == "sum_last4" and "bilstm_0" in params
  assert not np.array_equal(params["features"]["layer_weights"], np.zeros(4))  # it learned
  predict.main([f"--checkpoint={tmp_path / 'work'}", f"--vocab={four_layers[1]}",
                "--mode=classify", "--text=the cat sat on a mat"])
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["prediction"] in labels


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
@pytest.mark.parametrize("task", ["conll", "cola"])
def test_cached_features_train_the_head_as_the_frozen_encoder_does(four_layers, tmp_path,
                                                                   monkeypatch, task):
  """config.cache_features: the frozen encoder run once per training example; with dropout
  off the head trains to what running the encoder every step gives, and the train step reads
  the cache (the encoder is not in it)."""
  if task == "conll":
    c = _config(four_layers, tmp_path)
  else:
    c = _cola_config(four_layers, tmp_path)
  c.model.hidden_dropout_rate = c.model.attention_dropout_rate = 0.0
  read = {}
  features = heads._features  # pylint: disable=protected-access

  def spy(bert, how, *args):
    read[args[-1] is not None] = True
    return features(bert, how, *args)

  monkeypatch.setattr(heads, "_features", spy)
  results = {}
  for cache in (False, True):
    c.cache_features = cache
    read.clear()
    results[cache] = finetune.finetune(c, str(tmp_path / f"work_{cache}"))
    assert read.get(True, False) == cache  # the cached run's train step read the cache
  assert results[True] == pytest.approx(results[False], abs=1e-6)
  _, want = loader.read(str(tmp_path / "work_False" / "best"), "all")
  _, got = loader.read(str(tmp_path / "work_True" / "best"), "all")
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(want)[0], jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))


def test_caching_without_a_frozen_encoder_is_one_line(four_layers, tmp_path):
  c = _config(four_layers, tmp_path, freeze_encoder=False, cache_features=True)
  with pytest.raises(errors.ConfigError, match="--config.cache_features .* needs "
                                               "--config.freeze_encoder=True"):
    finetune.check_config(c)


@pytest.mark.parametrize("task", ["cola", "squad1", "conll", "swag"])
def test_the_suite_hands_the_feature_based_fields_to_every_task(task):
  from bert_jax import suite  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import suite as suite_config  # pylint: disable=g-import-not-at-top
  config = suite_config.get_config(task)
  config.data_dir, config.features, config.freeze_encoder = "/data", "sum_all", True
  config.bilstm_units, config.cache_features = 16, True
  c = suite.run_config(config, suite.Run(task, "s", (), 0, "d"))
  assert heads.FeatureBased.of(c) == heads.FeatureBased("sum_all", True, 16, 1)
  assert c.cache_features


def test_freezing_pre_training_is_one_line_exit_2(tmp_path):
  """Pre-training's heads need the encoder's gradients: its configs have no freeze_encoder,
  and asking for it is one line naming the field, before any work."""
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  out = tu.run(tu.main_args(tmp_path / "w", freeze_encoder=True), check=False)
  assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
  assert [l for l in out.stderr.splitlines() if "error" in l] == [
      "main.py: error: --config.freeze_encoder: the config has no field 'freeze_encoder'."]
  assert not (tmp_path / "w").exists()
