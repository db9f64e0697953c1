"""Helpers shared by the training tests (no tests here): shrunk real configs,
running the real entry point in a subprocess, reading summaries and checkpoints."""
from __future__ import annotations

import glob
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

from bert_jax.configs import tiny_pretrain  # pylint: disable=g-import-not-at-top,wrong-import-position

# Shrinks configs/tiny_pretrain.py to seconds-long runs (command-line form).
TINY = {
    "model.vocab_size": 128,
    "model.hidden_size": 64,
    "model.num_heads": 4,
    "model.max_position_embeddings": 32,
    "data.max_seq_length": 32,
    "data.max_predictions_per_seq": 5,
    "global_batch_size": 8,
    "num_train_steps": 6,
    "schedule.warmup_steps": 2,
    "checkpoint_every_steps": 3,
    "log_every_steps": 1,
    "eval_every_steps": 0,
    "eval_steps": 0,
    "eval_batch_size": 8,
    "synthetic_data": True,
    "build.corpus": "",
}


def tiny_config(**overrides):
  """configs/tiny_pretrain.py with TINY applied, then `overrides` (dotted keys with __)."""
  config = tiny_pretrain.get_config()
  for key, value in {**TINY, **{k.replace("__", "."): v for k, v in overrides.items()}}.items():
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def main_args(workdir, config="configs/tiny_pretrain.py", **overrides) -> list[str]:
  args = [sys.executable, "-m", "bert_jax.main", f"--config={config}", f"--workdir={workdir}"]
  for key, value in {**TINY, **{k.replace("__", "."): v for k, v in overrides.items()}}.items():
    if value is not None:  # None: keep the config file's value
      args.append(f"--config.{key}={value}")
  return args


# Subprocess runs share compiled programs through JAX's persistent cache: the repeated
# runs of the kill/resume and re-run tests then skip compilation.
JAX_CACHE = os.path.join(tempfile.gettempdir(), "bert_jax_test_compilation_cache")
# The tests compile hundreds of tiny programs and run each for milliseconds, so XLA:CPU's
# LLVM optimisation costs them more than it saves (tests/test_model.py: 185 -> 133 s with a
# cold cache). The same HLO programs, less optimised machine code: values within float
# rounding, every tolerance unchanged. conftest.py sets them for the test processes, `env` for
# the jobs they start.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
# XLA's defaults of those options, which the jobs compile with: a test of a property of the
# job's machine code (a bitwise equality) compiles with `.compile(compiler_options=...)`.
JOB_COMPILER_OPTIONS = {"xla_backend_optimization_level": 3,
                        "xla_llvm_disable_expensive_passes": False}


def use_compilation_cache() -> None:
  """The same for in-process runs (the tiny configs compile the same programs again)."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_compilation_cache_dir", JAX_CACHE)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def env(devices: int = 1, **extra) -> dict[str, str]:
  e = dict(os.environ)
  e["XLA_FLAGS"] = " ".join((f"--xla_force_host_platform_device_count={devices}",)
                           + TEST_XLA_FLAGS)
  e["TF_CPP_MIN_LOG_LEVEL"] = "3"
  e["JAX_COMPILATION_CACHE_DIR"] = JAX_CACHE
  e["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
  e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
  e.update(extra)
  return e


def run(args, *, devices: int = 1, timeout: float = 240, check: bool = True, **extra_env
        ) -> subprocess.CompletedProcess:
  proc = subprocess.run(args, cwd=REPO, env=env(devices, **extra_env), capture_output=True,
                        text=True, timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
  return proc


# What a GPU or TPU image may lack: the jobs run on prepared corpora without them.
NOT_ON_JOB_PATHS = ("tensorflow", "tensorflow_datasets", "clu")


def without_tensorflow(args: list[str]) -> list[str]:
  """`args` (python -m MODULE ...) run where importing TensorFlow, TFDS or clu fails."""
  assert args[:2] == [sys.executable, "-m"], args
  code = (f"import runpy, sys\nfor m in {NOT_ON_JOB_PATHS!r}: sys.modules[m] = None\n"
          f"sys.argv = {[args[2]] + args[3:]!r}\nrunpy.run_module({args[2]!r}, run_name='__main__')")
  return [sys.executable, "-c", code]


def run_python(code: str, *, devices: int = 8, timeout: float = 240) -> str:
  """Runs `code` in a fresh interpreter with `devices` fake CPU devices; returns stdout."""
  return run([sys.executable, "-c", code], devices=devices, timeout=timeout).stdout


def wait_for(predicate, timeout: float, what: str, proc=None) -> None:
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    if proc is not None and proc.poll() is not None:
      raise AssertionError(f"process ended ({proc.returncode}) before {what}")
    time.sleep(0.05)
  raise AssertionError(f"timed out waiting for {what}")


def checkpoint_steps(workdir) -> list[int]:
  d = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def load_checkpoint(workdir, step: int | None = None) -> dict:
  """{'step', 'params', 'opt_state'} of a checkpoint as numpy arrays (no target needed)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step = step if step is not None else checkpoint_steps(workdir)[-1]
  path = pathlib.Path(workdir) / "checkpoints" / str(step) / "state"
  with ocp.PyTreeCheckpointer() as ckptr:
    meta = ckptr.metadata(path).item_metadata.tree
    import jax  # pylint: disable=g-import-not-at-top
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
    return ckptr.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))


def flat(tree) -> dict[str, np.ndarray]:
  import jax  # pylint: disable=g-import-not-at-top
  return {jax.tree_util.keystr(p): np.asarray(x)
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def read_scalars(workdir, tag: str) -> dict[int, float]:
  """step -> value of a TensorBoard scalar written by the run."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = {}
  for path in sorted(glob.glob(os.path.join(workdir, "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        if v.tag == tag:
          out[event.step] = (float(tf.make_ndarray(v.tensor)) if v.HasField("tensor")
                             else v.simple_value)
  return out


def pretraining_trainer(config, vocab_size: int | None = None, devices=None, workdir=None):
  """trainer.build of the pre-training model and objective `config` names (the registry)."""
  from bert_jax import registry  # pylint: disable=g-import-not-at-top
  from bert_jax import trainer  # pylint: disable=g-import-not-at-top
  model, objective, sample = registry.pretraining(config, vocab_size)
  return trainer.build(config, model, objective, sample, workdir, devices=devices)
