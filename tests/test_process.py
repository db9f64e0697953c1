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


def test_the_pretraining_job_chooses_the_fused_attention_on_gpu_at_long_lengths():
  """registry.pretraining on GPU: bert_jax.flash (attention_impl="pallas") from
  bert_attention.GPU_FLASH_FROM tokens on for the families that run BERT's attention, where
  config.model.attention_impl is unset; the user's value (also "explicit") wins; CPU, TPU,
  shorter rows and ModernBERT keep their own."""
  from bert_jax import registry  # pylint: disable=g-import-not-at-top
  from bert_jax.models import bert_attention  # pylint: disable=g-import-not-at-top
  from tests.test_train_utils import tiny_config  # pylint: disable=g-import-not-at-top
  L = bert_attention.GPU_FLASH_FROM
  assert L == 256  # between L=128 (a tie) and L=512 (faster), bench/RESULTS.md 2026-12-04
  impl = lambda config, backend: registry.pretraining(config, 64, backend=backend)[0].config \
      .attention_impl
  for family in ("bert", "roberta", "electra"):
    config = tiny_config(model__family=family, data__max_seq_length=L,
                         model__max_position_embeddings=L + 2, model__dtype="bfloat16")
    config.model.preset = "tiny" if family == "bert" else "base"  # (the model is not built)
    if family == "electra":
      config.objective, config.data.nsp = "electra", False
    assert registry.gpu_defaults(config, backend="gpu") == {"attention_impl": "pallas"}, family
    assert impl(config, "gpu") == "pallas", family
    assert impl(config, "cpu") is None and impl(config, "tpu") is None, family
    config.model.attention_impl = "explicit"  # the user's choice: XLA's explicit attention
    assert registry.gpu_defaults(config, backend="gpu") == {}
    assert impl(config, "gpu") is None, family
    config.model.attention_impl = "cudnn"
    config.model.dtype = "bfloat16"
    assert impl(config, "gpu") == "cudnn", family
  short = tiny_config(data__max_seq_length=L - 1, model__dtype="bfloat16")
  assert registry.gpu_defaults(short, backend="gpu") == {} and impl(short, "gpu") is None
  # as measured only: bf16 with the hash dropout (the kernel draws no threefry masks)
  for field, value in (("dtype", "float32"), ("dropout_rng", "threefry")):
    other = tiny_config(data__max_seq_length=L, model__max_position_embeddings=L,
                        **{"model__dtype": "bfloat16", f"model__{field}": value})
    assert registry.gpu_defaults(other, backend="gpu") == {}, field
  modern = tiny_config(model__family="modernbert", model__preset="base",
                       data__max_seq_length=L)
  assert registry.gpu_defaults(modern, backend="gpu") == {}
