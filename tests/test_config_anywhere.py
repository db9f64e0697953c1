"""The configs run from any working directory (issue: nothing silent, part 2, item 16).

Before, `python -m bert_jax.main --config=/path/to/repo/configs/tiny_pretrain.py` started
outside the repository failed with `ModuleNotFoundError: No module named 'configs'`: the
config files imported their siblings as `configs.X`, found only from the repository root.
They are now the installed package `bert_jax.configs` (`configs/` at the root is that
directory), and a user's config kept anywhere builds on them by that name."""
import os
import subprocess
import sys

from tests import test_train_utils as tu

USER_CONFIG = '''
from bert_jax.configs import tiny_pretrain


def get_config(arg=None):
  c = tiny_pretrain.get_config(arg)
  c.num_train_steps = 2  # the user's own change
  return c
'''


def _run_outside(args, cwd):
  env = tu.env(1)
  env["PYTHONPATH"] = ""  # only the installed package, as a user's shell has it
  return subprocess.run([sys.executable, "-m", "bert_jax.main"] + args, cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)


def test_configs_by_absolute_path_and_a_users_config_run_from_any_directory(tmp_path):
  elsewhere = tmp_path / "somewhere_else"
  elsewhere.mkdir()
  (elsewhere / "configs").mkdir()  # a user's own configs/ directory does not get in the way
  (elsewhere / "my_config.py").write_text(USER_CONFIG)
  tiny = [f"--config.{k}={v}" for k, v in tu.TINY.items() if k != "num_train_steps"]
  for config, steps in ((str(tu.REPO / "configs" / "tiny_pretrain.py"), ["--config.num_train_steps=1"]),
                        (str(elsewhere / "my_config.py"), [])):
    workdir = tmp_path / f"run_{len(steps)}"
    out = _run_outside([f"--config={config}", f"--workdir={workdir}"] + tiny + steps, elsewhere)
    assert out.returncode == 0, out.stderr[-3000:]
    assert tu.checkpoint_steps(workdir) == [1 if steps else 2]
  assert not os.listdir(elsewhere / "configs")
