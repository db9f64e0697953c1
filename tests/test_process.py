"""bert_jax.process: the XLA flags a job sets (GPU defaults) before any backend starts."""
from __future__ import annotations

import os
import subprocess
import sys

from bert_jax import process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_job_xla_flags_adds_the_gpu_defaults_and_keeps_the_users():
  env = {}
  assert process.job_xla_flags(env) == " ".join(process.GPU_XLA_FLAGS)
  assert "--xla_gpu_enable_triton_gemm=false" in env["XLA_FLAGS"].split()
  assert process.job_xla_flags(env) == " ".join(process.GPU_XLA_FLAGS)  # idempotent

  env = {"XLA_FLAGS": "--xla_dump_to=/tmp/d  --xla_gpu_enable_triton_gemm=true"}
  flags = process.job_xla_flags(env).split()
  assert "--xla_gpu_enable_triton_gemm=true" in flags  # the user's value wins
  assert "--xla_gpu_enable_triton_gemm=false" not in flags
  assert "--xla_dump_to=/tmp/d" in flags

  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  assert process.job_xla_flags(env).split() == [
      "--xla_force_host_platform_device_count=2", *process.GPU_XLA_FLAGS]


def test_setup_sets_the_flags_before_the_backend_starts():
  """A job's process (bert_jax.main calls process.setup first) has its flags in XLA_FLAGS
  before its backend starts: XLA applies them (a CPU flag in their place shows it: the
  backend starts with 3 devices)."""
  code = ("import os; from bert_jax import process; assert len(process.GPU_XLA_FLAGS) >= 1;"
          "process.GPU_XLA_FLAGS = ('--xla_force_host_platform_device_count=3',);"
          "process.setup(); import jax; assert jax.device_count() == 3, jax.devices();"
          "print(os.environ['XLA_FLAGS'])")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120, check=True).stdout
  assert out.split() == ["--xla_force_host_platform_device_count=3"]
