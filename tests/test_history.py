"""The suite over pre-training runs' saved steps (bert_jax/history.py; the paper's Figure 2,
issue 36 item 4): a whole suite per (run, step), then the metric against the step."""
import json

import pytest

from bert_jax import history, main, train
from bert_jax.configs import suite as suite_config
from common import errors
from tests import suite_data
from tests import test_train_utils as tu


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
  """A tiny pre-training run with steps 2 and 4 saved and evaluated, and the GLUE files."""
  root = tmp_path_factory.mktemp("history")
  suite_data.make_glue(root / "data")
  _, vocab = suite_data.make_checkpoint(root / "vocab")
  size = sum(1 for _ in open(vocab, encoding="utf-8"))
  config = tu.tiny_config(**{"synthetic_data": True, "model.vocab_size": size,
                             "num_train_steps": 4, "checkpoint_every_steps": 2,
                             "keep_checkpoints": 5, "eval_steps": 1, "eval_every_steps": 2})
  train.train_and_evaluate(config, str(root / "mlm"))
  return root, vocab


def _config(root, vocab, **overrides):
  c = suite_config.get_config("cola")
  c.init_checkpoint, c.vocab_path, c.data_dir = str(root / "mlm"), vocab, str(root / "data")
  c.protocol = "grid"
  c.grid.learning_rate, c.grid.global_batch_size, c.grid.num_epochs = (1e-3,), (8,), (1,)
  c.seeds, c.eval_batch_size, c.max_seq_length, c.log_every_steps = 1, 8, 32, 0
  c.submission = False
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_the_suite_from_every_saved_step(pretrained_run, tmp_path):
  root, vocab = pretrained_run
  out = tmp_path / "fig2"
  report = main.run(_config(root, vocab, checkpoint_steps="all"), str(out))
  steps = report["runs"]["mlm"]["steps"]
  assert sorted(steps, key=int) == ["2", "4"]
  evals = json.loads((root / "mlm" / "metrics.json").read_text())["eval"]
  for step, s in steps.items():
    assert s["mlm_perplexity"] == evals[step]["mlm_perplexity"]
    sub = json.loads((out / "history" / "mlm" / f"step{step}" / "report.json").read_text())
    assert sub["init_checkpoint"] == str(root / "mlm" / "checkpoints" / step)
    assert s["tasks"]["cola"] == sub["tasks"]["cola"]["dev"]["mcc"]
  assert json.loads((out / "history.json").read_text()) == json.loads(json.dumps(report))
  md = (out / "history.md").read_text()
  assert "| step | ppl | cola mcc |" in md and md.count("\n| 2 |") == 1 and "\n| 4 |" in md
  assert (out / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # A rerun finds every suite finished: the same history, nothing trained again.
  assert main.run(_config(root, vocab, checkpoint_steps="all"), str(out)) == report


def test_steps_that_do_not_exist_and_runs_that_are_not_ours_are_one_line(pretrained_run, tmp_path):
  root, vocab = pretrained_run
  with pytest.raises(errors.ConfigError, match=r"has no saved step 3; it saved 2, 4\."):
    history.run_history(_config(root, vocab, checkpoint_steps="2,3"), str(tmp_path / "w"))
  with pytest.raises(errors.ConfigError, match=r"'all' or steps such as"):
    history.run_history(_config(root, vocab, checkpoint_steps="last"), str(tmp_path / "w"))
  c = _config(root, vocab, checkpoint_steps="all")
  c.init_checkpoint = str(root / "vocab" / "ckpt")  # an export: no saved steps
  with pytest.raises(errors.ConfigError, match="is not a pre-training workdir of ours"):
    history.run_history(c, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()  # refused before any work
