"""The configs: they load, carry the papers' recipes, and take (only known) overrides."""
from absl import flags
import pytest
from ml_collections import config_flags

from bert_jax import optim
from bert_jax import train
from tests import test_train_utils as tu

CONFIGS = ["default.py", "tiny_pretrain.py", "base_pretrain.py", "base_pretrain.py:phase2",
           "base_pretrain.py:lamb", "base_pretrain.py:lamb,phase2", "large_pretrain.py",
           "large_pretrain.py:phase2", "large_pretrain.py:lamb", "large_pretrain.py:lamb,phase2"]


def _load(spec: str, *overrides: str):
  argv = ["prog", f"--config={tu.REPO / 'configs' / spec}", *overrides]
  fv = flags.FlagValues()
  # sys_argv: override flags (--config.x.y) are derived from the command line.
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  fv(argv)
  return fv.config


@pytest.mark.parametrize("spec", CONFIGS)
def test_every_config_loads_and_builds_its_model(spec):
  config = _load(spec)
  assert config.task == "pretrain"
  cfg = train.bert_config(config, vocab_size=30522)
  preset = config.model.preset
  sizes = {"tiny": (2, 128), "base": (12, 768), "large": (24, 1024)}[preset]
  assert (cfg.num_layers, cfg.hidden_size) == sizes
  assert cfg.intermediate_size == 4 * cfg.hidden_size
  assert config.global_batch_size % config.grad_accum_steps == 0


@pytest.mark.parametrize("model", ["base", "large"])
def test_paper_recipe_two_phases(model):
  p1, p2 = _load(f"{model}_pretrain.py"), _load(f"{model}_pretrain.py:phase2")
  for c in (p1, p2):
    assert c.global_batch_size == 256
    assert c.opt.name == "adamw" and c.opt.learning_rate == 1e-4
    assert (c.opt.b1, c.opt.b2, c.opt.eps, c.opt.weight_decay) == (0.9, 0.999, 1e-6, 0.01)
    assert c.schedule.warmup_steps == 10_000 and c.schedule.decay_steps == 1_000_000
    assert c.model.max_position_embeddings == 512
  assert (p1.num_train_steps, p1.data.max_seq_length, p1.data.max_predictions_per_seq) == (
      900_000, 128, 20)
  assert (p2.num_train_steps, p2.data.max_seq_length, p2.data.max_predictions_per_seq) == (
      1_000_000, 512, 76)
  # Phase 2 continues phase 1's schedule: same lr at the switch.
  assert optim.host_learning_rate(p1, 900_000) == optim.host_learning_rate(p2, 900_000) > 0


def test_lamb_variant_is_the_large_batch_recipe():
  c = _load("large_pretrain.py:lamb")
  assert c.opt.name == "lamb" and c.global_batch_size == 32_768
  assert c.opt.learning_rate == 5e-3 and c.schedule.warmup_steps == 3_125
  assert c.schedule.decay_steps == 15_625 and c.num_train_steps == 14_062
  c2 = _load("large_pretrain.py:lamb,phase2")
  assert c2.num_train_steps == 15_625 and c2.data.max_seq_length == 512


def test_command_line_overrides_and_unknown_keys_fail():
  c = _load("tiny_pretrain.py", "--config.opt.learning_rate=0.5", "--config.mesh_shape.fsdp=2",
            "--config.model.num_layers=3")
  assert c.opt.learning_rate == 0.5 and c.mesh_shape.fsdp == 2
  assert train.bert_config(c, 100).num_layers == 3
  with pytest.raises(Exception, match="learning_rat"):
    _load("tiny_pretrain.py", "--config.opt.learning_rat=0.5")
  with pytest.raises(Exception):
    _load("base_pretrain.py:phase3")


def test_tiny_pretrain_schedule_follows_its_step_count():
  c = _load("tiny_pretrain.py", "--config.num_train_steps=500")
  assert optim.host_learning_rate(c, 500) == 0.0 < optim.host_learning_rate(c, 499)


def test_vocab_size_must_cover_the_vocabulary():
  c = tu.tiny_config()
  with pytest.raises(ValueError, match="smaller than the vocabulary"):
    train.bert_config(c, vocab_size=1000)
  c.model.vocab_size = None
  assert train.bert_config(c, vocab_size=1000).vocab_size == 1000
  with pytest.raises(ValueError, match="vocab_size is unset"):
    train.bert_config(c, vocab_size=None)
