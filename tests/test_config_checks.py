"""Config values that cannot work are refused before any work, naming the field (issue:
nothing silent, part 2, items 1, 4, 11, 12 and 17): before, a negative learning rate or
clipping norm trained by gradient ascent, masked_lm_prob=0 pre-trained without MLM, a
cadence of 0 divided by zero after the first step, too-short sequences crashed in the data
pipeline, num_train_steps=0 claimed a checkpoint it never wrote, and --workdir="" filled
the current directory."""
import numpy as np
import pytest

from bert_jax import finetune, train
from bert_jax import workdir_lock
from common import errors
from tests import test_main_errors
from tests import test_train_utils as tu

PRETRAINING = [
    ({"opt__learning_rate": -1e-3}, "--config.opt.learning_rate=-0.001: the learning rate must be a positive number"),
    ({"opt__learning_rate": 0.0}, "--config.opt.learning_rate=0.0"),
    ({"opt__grad_clip_norm": -1.0}, "--config.opt.grad_clip_norm=-1.0: the gradient clipping norm"),
    ({"opt__weight_decay": -0.01}, "--config.opt.weight_decay=-0.01"),
    ({"opt__b2": 1.0}, "--config.opt.b2=1.0: Adam's decay rates must be in [0, 1)"),
    ({"checkpoint_every_steps": -1}, "--config.checkpoint_every_steps=-1: steps between checkpoints: 0 = off"),
    ({"log_every_steps": -5}, "--config.log_every_steps=-5"),
    ({"keep_checkpoints": 0}, "--config.keep_checkpoints=0: at least the newest"),
    ({"num_train_steps": 0}, "--config.num_train_steps=0: it must be at least 1"),
    ({"data__masked_lm_prob": 0.0}, "--config.data.masked_lm_prob=0.0: the share of tokens masked"),
    ({"data__masked_lm_prob": -0.1}, "--config.data.masked_lm_prob=-0.1"),
    ({"data__max_seq_length": 3}, "--config.data.max_seq_length=3: a sequence of 5 tokens at least"),
    ({"data__max_seq_length": 3, "data__nsp": False}, "--config.data.max_seq_length=3: a sequence of 4"),
    ({"data__max_predictions_per_seq": 0}, "--config.data.max_predictions_per_seq=0"),
    ({"schedule__warmup_steps": -2}, "--config.schedule.warmup_steps=-2"),
    ({"eval_at_start": True, "eval_steps": 0}, "--config.eval_at_start=True needs held-out "
     "batches: set --config.eval_steps"),
    ({"build__vocab_kind": "unigram"}, "--config.build.vocab_kind='unigram': choose one of "
     "wordpiece, sentencepiece, bpe, or '' for the model family's (wordpiece)"),
]


@pytest.mark.parametrize("overrides,message", PRETRAINING)
def test_pretraining_values_that_cannot_work_are_named_before_any_work(tmp_path, overrides, message):
  config = tu.tiny_config(**overrides)
  with pytest.raises(errors.ConfigError) as e:
    train.train_and_evaluate(config, str(tmp_path / "w"))
  assert str(e.value).startswith(message), str(e.value)
  assert not (tmp_path / "w" / "checkpoints").exists()


@pytest.mark.parametrize("field,value,message", [
    ("max_seq_length", 2, "config.max_seq_length=2: at least 5 tokens"),
    ("opt.learning_rate", -1e-3, "--config.opt.learning_rate=-0.001"),
    ("log_every_steps", -1, "--config.log_every_steps=-1"),
])
def test_finetuning_values_that_cannot_work_are_named(tmp_path, field, value, message):
  from bert_jax.configs import classify_custom  # pylint: disable=g-import-not-at-top
  c = classify_custom.get_config()
  c.init_checkpoint, c.vocab_path = "x", "y"
  node, *_ = [c.opt] if field.startswith("opt.") else [c]
  node[field.split(".")[-1]] = value
  with pytest.raises(errors.ConfigError, match=message.replace(".", r"\.").replace("[", r"\[")):
    finetune.finetune(c, str(tmp_path / "w"))


def test_empty_workdir_is_refused_everywhere(tmp_path, monkeypatch):
  """--workdir="" (an unset variable) used to put the run in the current directory."""
  monkeypatch.chdir(tmp_path)
  for workdir in ("", "  "):
    with pytest.raises(errors.UserError, match="--workdir is empty"):
      with workdir_lock.hold(workdir):
        pass
  assert list(tmp_path.iterdir()) == []
  out = tu.run(tu.main_args(""), check=False)
  line = test_main_errors._one_line_error(out)  # pylint: disable=protected-access
  assert "--workdir is empty (e.g. --workdir=$WORKDIR with WORKDIR unset)" in line


def test_cadences_of_zero_are_off(tmp_path):
  """checkpoint_every_steps=0 / log_every_steps=0: no periodic checkpoints or progress
  lines (before: ZeroDivisionError after the first step); the run still saves at its end."""
  config = tu.tiny_config(num_train_steps=4, checkpoint_every_steps=0, log_every_steps=0)
  train.train_and_evaluate(config, str(tmp_path))
  assert tu.checkpoint_steps(tmp_path) == [4]
  assert sorted(tu.read_scalars(tmp_path, "train/loss")) == [4]


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_the_shortest_allowed_pretraining_sequences_train(tmp_path):
  """The minimum lengths are enough: real NSP pairs / segments at L=5 and L=4 train."""
  words = "the cat sat on a mat . dogs ran far away and then came back home".split()
  rng = np.random.default_rng(0)
  docs = ["\n".join(" ".join(rng.choice(words, 6)) + " ." for _ in range(4)) for _ in range(40)]
  (tmp_path / "corpus.txt").write_text("\n\n".join(docs) + "\n")
  for nsp, length in ((True, 5), (False, 4)):
    config = tu.tiny_config(num_train_steps=2, data__max_seq_length=length, data__nsp=nsp,
                            data__max_predictions_per_seq=1, synthetic_data=False,
                            build__corpus=str(tmp_path / "corpus.txt"), build__vocab_size=120,
                            build__num_shards=1, data__eval_fraction=0.1,
                            data__vocab_path="vocab", data__prepared_dir="prepared")
    train.train_and_evaluate(config, str(tmp_path / f"nsp{nsp}"))
    assert tu.checkpoint_steps(tmp_path / f"nsp{nsp}") == [2]
