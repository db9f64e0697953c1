"""The main job's answers to bad command lines and configs: one line each (`main.py:
error: ...`, exit 2), naming the flag or field and what to do; nothing left behind; and
no start-up noise (the missing-TPU note of every CPU run)."""
import pytest

from tests import test_train_utils as tu


def _error_lines(stderr: str) -> list[str]:
  return [l for l in stderr.splitlines() if "error" in l.lower() and "round-off" not in l]


def _one_line_error(out) -> str:
  assert out.returncode == 2, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  (line,) = _error_lines(out.stderr)
  assert line.startswith("main.py: error: "), line
  return line


def test_misspelt_config_override_is_one_line_with_the_suggestion(tmp_path):
  out = tu.run(tu.main_args(tmp_path) + ["--config.opt.learnin_rate=1"], check=False)
  line = _one_line_error(out)
  assert "--config.opt.learnin_rate: the config has no field 'learnin_rate'" in line
  assert 'Did you mean "learning_rate"' in line


def test_missing_config_file_is_one_line(tmp_path):
  out = tu.run([tu.sys.executable, "-m", "bert_jax.main", "--config=configs/nope.py",
                f"--workdir={tmp_path}"], check=False)
  line = _one_line_error(out)
  assert "--config=configs/nope.py: cannot load the config file" in line
  assert "No such file or directory" in line


@pytest.mark.parametrize("value", ["0", "-8", "6"])
def test_bad_global_batch_size_names_the_field_and_leaves_nothing(tmp_path, value):
  workdir = tmp_path / "w"
  out = tu.run(tu.main_args(workdir, global_batch_size=value), check=False, devices=4)
  line = _one_line_error(out)
  assert f"--config.global_batch_size={value}: it must be a positive multiple of 4" in line
  assert not (workdir / "checkpoints").exists()


def test_indivisible_eval_batch_size_is_named_as_such(tmp_path):
  out = tu.run(tu.main_args(tmp_path, eval_steps=2, eval_batch_size=3), check=False, devices=2)
  line = _one_line_error(out)
  assert "--config.eval_batch_size=3: it must be a positive multiple of 2" in line


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_no_missing_backend_notes_at_start(tmp_path):
  out = tu.run(tu.main_args(tmp_path, num_train_steps=1))
  assert "Unable to initialize backend" not in out.stderr
  assert "libtpu" not in out.stderr
