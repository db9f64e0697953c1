"""ELECTRA's replaced-token detection (`--config.objective=electra`: electra.ElectraPretraining
and objectives.electra): the generator reads the discriminator's embeddings, the
discriminator sees the generator's samples and learns which tokens they replaced, no gradient
flows through the sampling, the loss is the paper's, the FLOPs are counted, and the main job
pre-trains, resumes, fine-tunes from and exports the result."""
from __future__ import annotations

import signal
import subprocess

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import flops as flops_lib, loader, objectives, registry, train
from bert_jax.models import electra
from common import errors
from tests import test_train_utils as tu
from tests.test_checkpoint import prepared  # noqa: F401  (module fixture)
from tests.test_train import _batches

tu.use_compilation_cache()

V, L, P = 40, 12, 4
CFG = electra.ElectraConfig.from_preset(
    "electra-small", vocab_size=V, embedding_size=16, hidden_size=32, num_heads=4,
    intermediate_size=64, num_layers=2, max_position_embeddings=L, hidden_dropout_rate=0.0,
    attention_dropout_rate=0.0)


def _batch(seed=0, rows=3):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, V, size=(rows, L)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 8:] = 0
  ids[1, 8:] = 0
  pos = np.array([[1, 3, 5, 0], [2, 6, 0, 0], [4, 7, 9, 10]], np.int32)[:rows]
  weights = (pos > 0).astype(np.float32)
  targets = np.where(weights > 0, ids[np.arange(rows)[:, None], pos], 0).astype(np.int32)
  ids[np.arange(rows)[:, None], pos] = np.where(weights > 0, 3, ids[np.arange(rows)[:, None], pos])
  return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask,
          "masked_lm_positions": pos, "masked_lm_ids": targets, "masked_lm_weights": weights,
          "next_sentence_labels": np.zeros((rows,), np.int32)}


def _init(module, batch):
  inputs = [batch[k] for k in objectives.electra().inputs]
  return nn.unbox(module.init({"params": jax.random.key(0), "sample": jax.random.key(1)},
                              *inputs)["params"])


def _apply(module, params, batch, seed=2):
  inputs = [batch[k] for k in objectives.electra().inputs]
  return module.apply({"params": params}, *inputs, rngs={"sample": jax.random.key(seed)})


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_generator_shares_the_discriminators_embeddings():
  """The generator has no embedding tables of its own (its output attends the
  discriminator's word embeddings); the discriminator's tree is ElectraDiscriminator's, so
  fine-tuning and export read it as they read a published discriminator."""
  module = electra.ElectraPretraining(CFG)
  params = _init(module, _batch())
  assert set(params) == {"bert", "discriminator_dense", "discriminator_prediction", "generator"}
  assert "embeddings" not in params["generator"]["bert"]
  disc = nn.unbox(electra.ElectraDiscriminator(CFG).init(
      jax.random.key(0), _batch()["input_ids"], _batch()["segment_ids"], _batch()["input_mask"]))
  shapes = lambda t: jax.tree.map(np.shape, t)
  assert shapes({k: v for k, v in params.items() if k != "generator"}) == shapes(disc["params"])
  gen = module.generator_config
  assert (gen.hidden_size, gen.num_heads, gen.intermediate_size, gen.embedding_dim,
          gen.num_layers) == (8, 1, 16, 16, 2)
  # The paper's generator sizes: 1/3 of electra-base is the published electra-base-generator.
  base = electra.generator_of(electra.ElectraConfig.from_preset("electra-base"), 1 / 3)
  want = electra.ElectraConfig.from_preset("electra-base-generator")
  assert (base.hidden_size, base.num_heads, base.intermediate_size, base.embedding_dim) == (
      want.hidden_size, want.num_heads, want.intermediate_size, want.embedding_dim)
  with pytest.raises(errors.ConfigError, match="generator_size"):
    electra.generator_of(CFG, 0.0)


def test_discriminator_reads_the_samples_and_labels_what_changed():
  """A generator that always samples token 7: the discriminator's input is the original text
  with 7 at every masked position, and a token is labelled replaced exactly where 7 differs
  from the original (a masked token that was 7 counts as original)."""
  module = electra.ElectraPretraining(CFG)
  batch = _batch()
  batch["masked_lm_ids"][0, 1] = 7  # this masked token's original is 7: not replaced
  params = _init(module, batch)
  params["generator"]["output_bias"] = jnp.zeros((V,)).at[7].set(1e4)
  out = _apply(module, params, batch)
  rows = np.arange(3)[:, None]
  pos, w = batch["masked_lm_positions"], batch["masked_lm_weights"] > 0
  original = batch["input_ids"].copy()
  original[rows, pos] = np.where(w, batch["masked_lm_ids"], original[rows, pos])
  replaced = batch["input_ids"].copy()
  replaced[rows, pos] = np.where(w, 7, replaced[rows, pos])
  np.testing.assert_array_equal(np.asarray(out["disc_labels"]), (replaced != original))
  assert np.asarray(out["disc_labels"]).sum() == w.sum() - 1
  want = electra.ElectraDiscriminator(CFG).apply(
      {"params": {k: v for k, v in params.items() if k != "generator"}}, replaced,
      batch["segment_ids"], batch["input_mask"])
  np.testing.assert_allclose(np.asarray(out["disc_logits"]), np.asarray(want), atol=1e-6)
  assert out["mlm_logits"].shape == (3, P, V)


def test_loss_and_its_gradients():
  """loss = the generator's masked-LM mean + 50 x the discriminator's mean sigmoid
  cross-entropy over real tokens; the discriminator's loss sends no gradient into the
  generator (sampling is not differentiated), both losses reach the shared embeddings."""
  module, batch = electra.ElectraPretraining(CFG), _batch()
  params = _init(module, batch)
  objective = objectives.electra(50.0)
  out = _apply(module, params, batch)
  logits = np.asarray(out["mlm_logits"], np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  w = batch["masked_lm_weights"]
  nll = -np.take_along_axis(logp, batch["masked_lm_ids"][..., None], -1)[..., 0]
  z, y = np.asarray(out["disc_logits"], np.float64), np.asarray(out["disc_labels"])
  m = batch["input_mask"]
  bce = np.log1p(np.exp(z)) - y * z
  want = (nll * w).sum() / w.sum() + 50 * (bce * m).sum() / m.sum()
  np.testing.assert_allclose(float(objective.batch_loss(out, batch)), want, rtol=1e-5)

  def part(p, which):
    sums = objectives.electra_sums(_apply(module, p, batch), batch)
    return sums["disc_loss_sum"] if which == "disc" else sums["mlm_loss_sum"]

  g_disc, g_gen = jax.jit(lambda p: (jax.grad(part)(p, "disc"), jax.grad(part)(p, "gen")))(params)
  assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(g_disc["generator"]))
  assert float(jnp.abs(g_disc["discriminator_prediction"]["kernel"]).max()) > 0
  for g in (g_disc, g_gen):
    assert float(jnp.abs(g["bert"]["embeddings"]["word_embeddings"]["embedding"]).max()) > 0
  assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(
      g_gen["discriminator_prediction"]))


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_the_discriminator_learns_what_context_gives_away():
  """Rows of one repeated token, 5 of 32 masked: a replacement differs from its neighbours, so
  a working discriminator ends far above the prior (1 - replaced, ~0.85; the toy generator
  rarely samples the right token at first), while the generator learns to copy."""
  config = _config(**{"model.vocab_size": 64, "global_batch_size": 16, "num_train_steps": 400,
                      "schedule.warmup_steps": 10, "opt.learning_rate": 1e-3,
                      "electra.generator_size": 1.0})
  trainer = tu.pretraining_trainer(config, devices=jax.devices()[:1])
  rng = np.random.default_rng(0)
  rows, length, preds = 16, 32, 5

  def batch():
    ids = np.repeat(rng.integers(5, 60, size=(rows, 1)), length, 1).astype(np.int32)
    pos = np.stack([rng.choice(np.arange(1, length), preds, replace=False)
                    for _ in range(rows)]).astype(np.int32)
    targets = ids[np.arange(rows)[:, None], pos]
    ids[np.arange(rows)[:, None], pos] = 4
    return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": np.ones_like(ids),
            "masked_lm_positions": pos, "masked_lm_ids": targets,
            "masked_lm_weights": np.ones((rows, preds), np.float32),
            "next_sentence_labels": np.zeros(rows, np.int32)}

  last = []
  with trainer.activate():
    state = trainer.init()
    for step in range(240):
      state, sums = trainer.train_step(state, trainer.to_global(batch()),
                                       jax.random.fold_in(trainer.train_rng, step))
      if step >= 200:
        last.append(jax.device_get(sums))
  total = lambda k: sum(float(s[k]) for s in last)
  prior = 1 - total("replaced_sum") / total("disc_weight")
  assert total("disc_correct_sum") / total("disc_weight") > prior + 0.08
  assert total("mlm_correct_sum") / total("mlm_weight") > 0.2


def _config(**overrides):
  return tu.tiny_config(**{"objective": "electra", "model.family": "electra",
                           "model.preset": "electra-small", "model.num_layers": 2,
                           "model.intermediate_size": 128, "model.embedding_size": 32,
                           "data.nsp": False, **overrides})


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_analytic_flops_match_xla_cost_analysis():
  config = _config(**{"model.vocab_size": 2048, "model.hidden_size": 256,
                      "model.intermediate_size": 1024, "model.embedding_size": 128,
                      "model.max_position_embeddings": 128, "data.max_seq_length": 128,
                      "data.max_predictions_per_seq": 20})
  trainer = tu.pretraining_trainer(config, devices=jax.devices()[:1])
  with trainer.activate():
    state = trainer.init()
    batch = trainer.to_global(_batches(config, 1)[0])
    compiled = trainer.train_step.lower(state, batch, jax.random.key(0)).compile()
  xla = flops_lib.xla_flops(compiled)
  analytic = trainer.objective.flops(trainer.model, {k: v.shape for k, v in batch.items()})
  assert 0.9 < analytic / xla < 1.1, (analytic, xla)


def test_objective_needs_the_electra_family_and_no_nsp():
  for overrides, match in (({"model.family": "bert", "model.preset": "tiny"}, "family=electra"),
                           ({"data.nsp": True}, "data.nsp=False"),
                           ({"electra.generator_size": 1.5}, "generator_size")):
    with pytest.raises(errors.ConfigError, match=match):
      registry.pretraining(_config(**overrides), 128)


@pytest.mark.slow
def test_pretrains_resumes_and_fine_tunes_from_the_discriminator(tmp_path):
  """The main job (synthetic batches) trains both networks, a rerun resumes it, evaluation
  reports the discriminator's metrics, and fine-tuning's reader takes the discriminator."""
  config = _config(num_train_steps=4, checkpoint_every_steps=2, eval_steps=2,
                   eval_every_steps=4)
  train.train_and_evaluate(config, str(tmp_path))
  first = tu.flat(tu.load_checkpoint(tmp_path, 4)["params"])
  assert any(k.startswith("['generator']") for k in first)
  config.num_train_steps = 6
  state = train.train_and_evaluate(config, str(tmp_path))
  assert int(state.step) == 6
  scalars = tu.read_scalars(tmp_path, "eval/disc_accuracy")
  assert set(scalars) == {4, 6} and all(0 <= v <= 1 for v in scalars.values())
  assert set(tu.read_scalars(tmp_path, "train/loss")) == set(range(1, 7))
  cfg, encoder = loader.read(str(tmp_path), target="encoder")
  assert cfg.family == "electra" and cfg.embedding_dim == 32
  last = tu.flat(tu.load_checkpoint(tmp_path, 6)["params"])
  got = tu.flat({"bert": encoder})
  assert got.keys() == {k for k in last if k.startswith("['bert']")}
  for k in got:
    np.testing.assert_array_equal(got[k], last[k], err_msg=k)
  assert any(not np.array_equal(first[k], last[k]) for k in first if k.startswith("['generator']"))


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_export_writes_the_discriminator_and_its_generator(tmp_path):
  """convert --to=huggingface of an ELECTRA run: the discriminator (ElectraForPreTraining) and
  beside it generator/ (ElectraForMaskedLM, the shared embeddings in), each loaded by
  transformers with every key and giving our logits."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from bert_jax import convert  # pylint: disable=g-import-not-at-top
  from bert_jax.models import bert as model_lib  # pylint: disable=g-import-not-at-top
  config = _config(num_train_steps=2, checkpoint_every_steps=2, **{"model.hidden_act": "gelu"})
  train.train_and_evaluate(config, str(tmp_path / "run"))
  vocab = tmp_path / "vocab" / "vocab.txt"
  vocab.parent.mkdir()
  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  vocab.write_text("\n".join(specials + [f"w{i}" for i in range(128 - len(specials))]) + "\n")
  out = tmp_path / "hf"
  convert.main([f"--input={tmp_path / 'run'}", f"--output={out}", "--to=huggingface",
                f"--vocab={vocab}"])
  cfg, params = loader.read(str(tmp_path / "run"))
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 128, size=(2, 32)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 20:] = 0
  disc_params = {k: v for k, v in params.items() if k != "generator"}
  ours = np.asarray(electra.ElectraDiscriminator(cfg).apply({"params": disc_params}, ids,
                                                            np.zeros_like(ids), mask))
  gen_cfg = electra.generator_of(cfg, 0.25)
  gen_params = {**params["generator"], "bert": {**params["generator"]["bert"],
                                                "embeddings": params["bert"]["embeddings"]}}
  every = np.broadcast_to(np.arange(32, dtype=np.int32), ids.shape)
  ours_gen = np.asarray(model_lib.BertForPreTraining(gen_cfg, nsp=False).apply(
      {"params": gen_params}, ids, np.zeros_like(ids), mask, every)["mlm_logits"])
  real = mask.astype(bool)
  for directory, cls, want in ((out, "ElectraForPreTraining", ours),
                               (out / "generator", "ElectraForMaskedLM", ours_gen)):
    hf, info = getattr(transformers, cls).from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], (cls, info)
    with torch.no_grad():
      got = hf.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                      attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    assert np.abs(got[real] - want[real]).max() <= 1e-4, cls
    assert (directory / "vocab.txt").exists()


@pytest.mark.slow
def test_kill_then_rerun_is_bit_identical(tmp_path, prepared):  # noqa: F811
  """ELECTRA on the built-in corpus (packed rows): a run killed -9 while its second
  checkpoint is written, then rerun, ends with the straight run's weights, generator included
  (the samples come from the step's own random stream)."""
  args = lambda workdir: tu.main_args(workdir, **{
      **prepared, "objective": "electra", "model.family": "electra",
      "model.preset": "electra-small", "model.num_layers": 2, "model.intermediate_size": 128,
      "model.embedding_size": 32, "data.nsp": False, "data.packing": True,
      "num_train_steps": 6, "checkpoint_every_steps": 2, "keep_checkpoints": 20,
      "eval_steps": 0})
  straight, broken = tmp_path / "straight", tmp_path / "broken"
  tu.run(args(straight))
  proc = subprocess.Popen(args(broken), cwd=tu.REPO, env=tu.env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  ckpt_dir = broken / "checkpoints"
  try:
    tu.wait_for(lambda: ckpt_dir.is_dir() and any(p.name.startswith("4")
                                                  for p in ckpt_dir.iterdir()), 180, "4", proc)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert 6 not in tu.checkpoint_steps(broken)
  tu.run(args(broken))
  a, b = tu.flat(tu.load_checkpoint(straight, 6)), tu.flat(tu.load_checkpoint(broken, 6))
  assert a.keys() == b.keys() and any("generator" in k for k in a)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
