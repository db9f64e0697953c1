"""The README's main job (configs/tiny_pretrain.py) through the real entry point:
builds its vocabulary and data in the workdir, trains, evaluates, reports progress,
and re-running reuses everything (a no-op, or a continuation when steps grow)."""
import json
import sys

import pytest

from tests import test_train_utils as tu

# The real job on the real built-in corpus, just shorter and smaller.
SHORT = {
    "model.vocab_size": None, "synthetic_data": False, "build.corpus": "default",
    "build.vocab_size": 512, "build.max_chars": 400_000, "build.num_shards": 2,
    "model.max_position_embeddings": 64, "data.max_seq_length": 64,
    "data.max_predictions_per_seq": 10, "global_batch_size": 16, "num_train_steps": 20,
    "checkpoint_every_steps": 10, "log_every_steps": 5, "eval_every_steps": 10,
    "eval_steps": 2, "eval_batch_size": 16,
}


def _args(workdir, **overrides):
  return tu.main_args(workdir, **{**SHORT, **overrides})


def test_tiny_pretrain_short_run_then_rerun_reuses_everything(tmp_path):
  # The first run (vocabulary, prepared corpus, training, eval, TensorBoard) and the
  # fill-mask after it import no TensorFlow, TFDS or clu (a GPU image has none of them).
  out = tu.run(tu.without_tensorflow(_args(tmp_path)))
  log = out.stderr
  assert "Training a 512-entry wordpiece vocabulary on 'default'" in log
  assert "Preparing corpus 'default'" in log
  assert (tmp_path / "vocab" / "vocab.txt").is_file()
  assert (tmp_path / "prepared" / "summary.json").is_file()
  assert tu.checkpoint_steps(tmp_path) == [10, 20]
  # Console progress: step, loss, accuracies, lr, grad norm, throughput, MFU, ETA.
  line = next(l for l in log.splitlines() if "step 20/20" in l)
  for field in ("loss", "mlm_acc", "nsp_acc", "lr", "grad_norm", "tok/s", "MFU", "ETA"):
    assert field in line, line
  assert "eval at step 20" in log
  # TensorBoard summaries, train and held-out eval.
  assert sorted(tu.read_scalars(tmp_path, "train/loss")) == [5, 10, 15, 20]
  assert sorted(tu.read_scalars(tmp_path, "eval/mlm_accuracy")) == [10, 20]
  assert 0 <= tu.read_scalars(tmp_path, "eval/nsp_accuracy")[20] <= 1
  config = json.loads((tmp_path / "checkpoints" / "20" / "config" / "metadata").read_text())
  assert config["data"]["max_seq_length"] == 64
  fill = tu.run(tu.without_tensorflow([
      sys.executable, "-m", "bert_jax.predict", f"--checkpoint={tmp_path}",
      f"--vocab={tmp_path / 'vocab'}", "--mode=fill_mask", "--text=the [MASK] of the book ."]))
  assert "#1:" in fill.stdout + fill.stderr, fill.stdout + fill.stderr

  again = tu.run(_args(tmp_path)).stderr
  assert "vocabulary on" not in again and "Preparing corpus" not in again
  assert "Resumed from" in again and "already reached step 20" in again
  assert tu.checkpoint_steps(tmp_path) == [10, 20]

  more = tu.run(_args(tmp_path, num_train_steps=25, checkpoint_every_steps=5)).stderr
  assert f"Resumed from {tmp_path / 'checkpoints'}/20" in more
  assert "step 25/25" in more
  assert tu.checkpoint_steps(tmp_path)[-1] == 25


def test_unknown_config_key_fails_clearly(tmp_path):
  out = tu.run(tu.main_args(tmp_path) + ["--config.opt.learnig_rate=1"], check=False)
  assert out.returncode != 0
  assert "learnig_rate" in out.stderr


@pytest.mark.slow
def test_tiny_pretrain_full_run_learns(tmp_path):
  """The README command as is: held-out MLM and NSP accuracy clearly above chance."""
  out = tu.run([tu.sys.executable, "-m", "bert_jax.main", "--config=configs/tiny_pretrain.py",
                f"--workdir={tmp_path}"], timeout=900)
  final = max(tu.read_scalars(tmp_path, "eval/mlm_accuracy"))
  mlm = tu.read_scalars(tmp_path, "eval/mlm_accuracy")[final]
  nsp = tu.read_scalars(tmp_path, "eval/nsp_accuracy")[final]
  assert mlm > 0.08, out.stderr[-3000:]  # chance: 1 / 4096
  assert nsp > 0.54, out.stderr[-3000:]


@pytest.mark.parametrize("config_name", ["tiny_pretrain", "glue"])
def test_a_workdir_that_is_the_init_checkpoint_is_refused(tmp_path, config_name):
  """Before: a job whose workdir was its init_checkpoint (a HuggingFace directory, or a
  pre-training run fine-tuned in place) wrote its checkpoints into that directory, so the next
  job that read it as init_checkpoint got those checkpoints instead of the weights it named.
  Now one line, exit 2, before anything is written."""
  from bert_jax import main  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import glue, tiny_pretrain  # pylint: disable=g-import-not-at-top
  from common import errors  # pylint: disable=g-import-not-at-top
  hub = tmp_path / "hub"
  hub.mkdir()
  (hub / "config.json").write_text("{}")
  config = tiny_pretrain.get_config() if config_name == "tiny_pretrain" else glue.get_config("cola")
  for init, workdir in ((str(hub), str(hub)), (str(hub) + "/", str(hub)),
                        (str(tmp_path / "." / "hub"), str(hub) + "/")):
    config.init_checkpoint = init
    with pytest.raises(errors.ConfigError, match="is the workdir") as e:
      main.run(config, workdir)
    assert "\n" not in str(e.value)
  assert sorted(p.name for p in hub.iterdir()) == ["config.json"]
