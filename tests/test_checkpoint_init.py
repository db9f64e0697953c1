"""Starting a run from other checkpoints: a HuggingFace BERT (via bert_jax.convert), one
of our own workdirs, and phase 2 continuing phase 1 in the same workdir."""
import logging

import numpy as np
import pytest

from bert_jax import formats, loader
from bert_jax import registry
from bert_jax import train
from tests import test_train_utils as tu

tu.use_compilation_cache()

# One step with learning rate 0 (warmup starts at 0) leaves the initial params untouched.
FROZEN = dict(num_train_steps=1, schedule__warmup_steps=5, eval_steps=0)


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
  """A randomly initialised HuggingFace BertForPreTraining shaped like tu.tiny_config()."""
  transformers = pytest.importorskip("transformers")
  cfg = registry.model_config(tu.tiny_config())
  hf = transformers.BertConfig(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
      max_position_embeddings=cfg.max_position_embeddings, hidden_act="gelu_new")
  path = tmp_path_factory.mktemp("hf")
  transformers.BertForPreTraining(hf).save_pretrained(path)
  return str(path)


def test_init_from_huggingface_checkpoint(tmp_path, hf_checkpoint):
  config = tu.tiny_config(init_checkpoint=hf_checkpoint, **FROZEN)
  state = train.train_and_evaluate(config, str(tmp_path))
  _, expected = loader.read(hf_checkpoint)
  got, want = tu.flat(state.params), tu.flat(expected)
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_init_checkpoint_of_another_shape_is_a_clear_error(tmp_path, hf_checkpoint):
  config = tu.tiny_config(init_checkpoint=hf_checkpoint, model__num_layers=3, **FROZEN)
  with pytest.raises(ValueError, match="num_layers: checkpoint 2 vs config 3"):
    train.train_and_evaluate(config, str(tmp_path))
  config = tu.tiny_config(init_checkpoint=hf_checkpoint, model__hidden_act="gelu", **FROZEN)
  with pytest.raises(ValueError, match="hidden_act"):
    train.train_and_evaluate(config, str(tmp_path / "b"))


def test_init_from_one_of_our_workdirs(tmp_path):
  first = tmp_path / "first"
  train.train_and_evaluate(tu.tiny_config(num_train_steps=3), str(first))
  config = tu.tiny_config(init_checkpoint=str(first), seed=7, **FROZEN)
  state = train.train_and_evaluate(config, str(tmp_path / "second"))
  want = tu.flat(tu.load_checkpoint(first, 3)["params"])
  got = tu.flat(state.params)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  assert int(state.step) == 1  # params only: a fresh optimizer and schedule
  wrong = tu.tiny_config(init_checkpoint=str(first), model__hidden_size=32, **FROZEN)
  with pytest.raises(ValueError, match="does not fit"):
    train.train_and_evaluate(wrong, str(tmp_path / "third"))


def test_damaged_init_checkpoint_of_ours_is_refused(tmp_path):
  """Pre-training initialised from a workdir of ours whose checkpoint no longer matches
  its checksums is an error naming the damage, not a silent start from damaged weights."""
  from tests import test_checkpoint  # pylint: disable=g-import-not-at-top
  first = tmp_path / "first"
  train.train_and_evaluate(tu.tiny_config(num_train_steps=3), str(first))
  test_checkpoint._overwrite_middle(  # pylint: disable=protected-access
      test_checkpoint._largest_data_file(first / "checkpoints" / "3"), 0x7F)  # pylint: disable=protected-access
  config = tu.tiny_config(init_checkpoint=str(first), **FROZEN)
  with pytest.raises(formats.CorruptCheckpointFileError, match="3 is damaged .*checksum differs"):
    train.train_and_evaluate(config, str(tmp_path / "second"))


@pytest.mark.slow
def test_phase2_continues_phase1_in_the_same_workdir(tmp_path, caplog):
  """Longer sequences from phase 1's last checkpoint, on the same schedule."""
  # Positions for phase 2's length from the start, as in the paper (512 in both phases).
  phase1 = tu.tiny_config(num_train_steps=4, checkpoint_every_steps=4,
                          schedule__decay_steps=8, model__max_position_embeddings=64)
  train.train_and_evaluate(phase1, str(tmp_path))
  phase2 = tu.tiny_config(num_train_steps=6, checkpoint_every_steps=2, schedule__decay_steps=8,
                          model__max_position_embeddings=64, data__max_seq_length=64,
                          data__max_predictions_per_seq=10)
  caplog.set_level(logging.INFO)
  state = train.train_and_evaluate(phase2, str(tmp_path))
  assert "data config changed since step 4" in caplog.text
  assert int(state.step) == 6 and tu.checkpoint_steps(tmp_path)[-2:] == [4, 6]


@pytest.mark.slow
def test_init_from_our_workdir_with_nsp_switched(tmp_path, caplog):
  """An MLM+NSP run of ours starts an MLM-only run (NSP head and pooler left out, said
  once), and an MLM-only run starts an MLM+NSP one (NSP head and pooler fresh, said once)."""
  caplog.set_level(logging.WARNING)
  with_nsp, without = tmp_path / "with_nsp", tmp_path / "without"
  train.train_and_evaluate(tu.tiny_config(num_train_steps=2), str(with_nsp))
  state = train.train_and_evaluate(
      tu.tiny_config(init_checkpoint=str(with_nsp), data__nsp=False, **FROZEN), str(without))
  want = tu.flat(tu.load_checkpoint(with_nsp, 2)["params"])
  got = tu.flat(state.params)
  assert set(got) == {k for k in want if "seq_relationship" not in k and "pooler" not in k}
  for k in got:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  assert caplog.text.count("that this model does not use") == 1
  assert "left out: NSP head, pooler" in caplog.text
  state = train.train_and_evaluate(
      tu.tiny_config(init_checkpoint=str(without), **FROZEN), str(tmp_path / "again"))
  assert "seq_relationship" in state.params
  assert caplog.text.count("no NSP head and no pooler: they start from a fresh") == 1
