"""The configs run from any working directory (issue: nothing silent, part 2, item 16).

Before, `python -m bert_jax.main --config=/path/to/repo/configs/tiny_pretrain.py` started
outside the repository failed with `ModuleNotFoundError: No module named 'configs'`: the
config files imported their siblings as `configs.X`, found only from the repository root.
They are now the installed package `bert_jax.configs` (`configs/` at the root is that
directory), and a user's config kept anywhere builds on them by that name. Each test runs a
fresh interpreter in a directory outside the repository, without the repository on
PYTHONPATH (only the installed package, as a user's shell has it); the configs' loading one
also has a `configs/` package of the user's own there, which must not get in the way."""
import json
import os
import subprocess
import sys

from tests import test_train_utils as tu

USER_CONFIG = '''
from bert_jax.configs import tiny_pretrain


def get_config(arg=None):
  c = tiny_pretrain.get_config(arg)
  c.num_train_steps = 7  # the user's own changes
  c.opt.learning_rate = 3e-4
  return c
'''

# Loads each command line's --config as bert_jax.main defines its flag (config_flags, locked,
# overrides from the command line); prints what they hold and whether JAX or TF came along.
LOAD = r'''
import json, sys
from absl import flags
from ml_collections import config_flags
out = []
for argv in json.loads(sys.argv[1]):
  argv = ["prog", *argv]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  fv(argv)
  c = fv.config
  out.append([c.task, c.get("num_train_steps"), c.opt.learning_rate if "opt" in c else None])
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"jax", "jaxlib", "flax", "tensorflow"})
print(json.dumps({"configs": out, "heavy": heavy}))
'''


def _elsewhere(tmp_path, own_configs: bool):
  """A directory outside the repository holding the user's config (and their own `configs`
  package: the name is theirs to use)."""
  d = tmp_path / "somewhere_else"
  d.mkdir()
  (d / "my_config.py").write_text(USER_CONFIG)
  if own_configs:
    (d / "configs").mkdir()
    (d / "configs" / "__init__.py").write_text("")
    (d / "configs" / "default.py").write_text(
        "raise ImportError('the user\\'s own configs/default.py was imported')\n")
  return d


def _run_outside(args, cwd, timeout):
  env = tu.env(1)
  env.pop("PYTHONPATH")  # only the installed package, as a user's shell has it
  return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_every_config_and_a_users_config_load_by_absolute_path_from_any_directory(tmp_path):
  elsewhere = _elsewhere(tmp_path, own_configs=True)
  configs = tu.REPO / "configs"
  cases = [
      ([f"--config={configs / 'tiny_pretrain.py'}", "--config.num_train_steps=3"],
       ["pretrain", 3, 1e-3]),
      ([f"--config={configs / 'default.py'}"], ["pretrain", 900_000, 1e-4]),
      ([f"--config={configs / 'base_pretrain.py'}:phase2"], ["pretrain", 1_000_000, 1e-4]),
      ([f"--config={configs / 'large_pretrain.py'}:lamb"], ["pretrain", 14_062, 5e-3]),
      ([f"--config={configs / 'glue.py'}:sst2"], ["glue", None, None]),
      ([f"--config={configs / 'squad.py'}:v2"], ["squad", None, None]),
      ([f"--config={configs / 'conll.py'}"], ["conll", None, None]),
      ([f"--config={configs / 'swag.py'}"], ["swag", None, None]),
      ([f"--config={configs / 'classify_custom.py'}"], ["custom", None, None]),
      # By the package's own path (where a non-editable install keeps the configs).
      ([f"--config={tu.REPO / 'bert_jax' / 'configs' / 'tiny_pretrain.py'}"],
       ["pretrain", 900, 1e-3]),
      # The user's config, kept in the working directory, and overridden on top.
      ([f"--config={elsewhere / 'my_config.py'}"], ["pretrain", 7, 3e-4]),
      (["--config=my_config.py", "--config.num_train_steps=2"], ["pretrain", 2, 3e-4]),
  ]
  out = _run_outside(["-c", LOAD, json.dumps([argv for argv, _ in cases])], elsewhere, 60)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert len(result["configs"]) == len(cases)
  for (argv, want), got in zip(cases, result["configs"]):
    assert all(w is None or w == g for w, g in zip(want, got)), (argv, got)  # None: not checked
  assert result["heavy"] == []


def test_main_runs_the_repository_config_by_absolute_path_from_any_directory(tmp_path):
  elsewhere = _elsewhere(tmp_path, own_configs=False)
  workdir = tmp_path / "run"
  tiny = [f"--config.{k}={v}" for k, v in tu.TINY.items() if k != "num_train_steps"]
  out = _run_outside(["-m", "bert_jax.main", f"--config={tu.REPO / 'configs' / 'tiny_pretrain.py'}",
                      f"--workdir={workdir}", "--config.num_train_steps=1", *tiny], elsewhere, 300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert tu.checkpoint_steps(workdir) == [1]
  assert not (elsewhere / "checkpoints").exists()  # nothing written in the working directory
