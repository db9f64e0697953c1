"""What a process sets up once before any job (bert_jax.main calls `setup`): the XLA flags
a job runs with on GPU (`job_xla_flags`), and the XLA compilation cache of the job's workdir
(`job_compilation_cache`, which bert_jax.main.run turns on for every job)."""
from __future__ import annotations

import ctypes
import os
from typing import Any, MutableMapping, Sequence

from absl import logging
import jax
import ml_collections

from bert_jax import metrics
from common import fileio


# XLA flags every job sets unless XLA_FLAGS sets them itself. GPU-only options (other
# backends parse and ignore them), each measured on an H200 (bench/RESULTS.md, 2026-11-27,
# third loan):
# - cuBLAS for every matmul instead of XLA's Triton GEMM fusions: BERT-base's pre-training
#   step at L=128, batch 256 ran 51.0 instead of 52.3 ms and compiled in 54.6 instead of
#   59.5 s (1.21x transformers + torch.compile instead of 1.18x, the same call).
GPU_XLA_FLAGS = ("--xla_gpu_enable_triton_gemm=false",)


def job_xla_flags(environ: MutableMapping[str, str] | None = None,
                  flags: Sequence[str] | None = None) -> str:
  """Adds `flags` (None: the job's, GPU_XLA_FLAGS) to XLA_FLAGS (os.environ by default),
  each unless XLA_FLAGS already names that flag (the user's value wins); returns the new
  value. XLA reads the variable when the first backend starts, so this runs before anything
  asks JAX for a device (setup does it first; tests/conftest.py with the tests' flags)."""
  environ = os.environ if environ is None else environ
  current = environ.get("XLA_FLAGS", "").split()
  named = {flag.split("=", 1)[0] for flag in current}
  added = [flag for flag in (GPU_XLA_FLAGS if flags is None else flags)
           if flag.split("=", 1)[0] not in named]
  if added:
    environ["XLA_FLAGS"] = " ".join(current + added)
  return environ.get("XLA_FLAGS", "")


def setup(distributed: dict[str, Any] | None = None) -> None:
  """The job's XLA flags (job_xla_flags); quiet library logs; JAX's distributed runtime when
  `distributed` holds jax.distributed.initialize's arguments (several hosts); XLA:CPU executing on the calling
  thread, so that its step memory is reused (reuse_host_memory); the devices logged."""
  job_xla_flags()
  metrics.quiet_library_logs()
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  if distributed is not None:
    jax.distributed.initialize(**distributed)
  logging.info("JAX process %d/%d, local devices: %s", jax.process_index(),
               jax.process_count(), jax.local_devices())
  logging.info("%d devices in total (%s).", jax.device_count(), jax.devices()[0].device_kind)
  reuse_host_memory()


def reuse_host_memory() -> bool:
  """On the CPU backend: glibc keeps freed memory for reuse (no mmap for large blocks, no
  trimming); returns whether it applied.

  XLA:CPU allocates all temporaries of a step as one block per execution (590 MB for
  all-MiniLM-L6 fine-tuning at batch 32 x 64). glibc serves a block that large with a
  fresh mmap and unmaps it on free, so every step page-faulted all of it again (~140k
  minor faults a step); from the heap it is reused, and that step got 15% faster. Only
  allocations of glibc's main arena follow these settings, i.e. those of the main thread:
  bert_jax.main therefore turns off jax_cpu_enable_async_dispatch (XLA:CPU then executes
  on the calling thread); with async dispatch on this does nothing. Process-wide: the
  process keeps its peak host memory.
  """
  if jax.default_backend() != "cpu" or jax.config.read("jax_cpu_enable_async_dispatch"):
    return False
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:  # not glibc
    return False
  m_trim_threshold, m_mmap_max = -1, -4  # malloc.h
  return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2 ** 31 - 1))


_CACHE_SET = [None]  # the directory compilation_cache last set (not a user's)


def compilation_cache(config: ml_collections.ConfigDict, workdir: str, *,
                      min_compile_secs: float | None = None,
                      users_first: bool = True) -> str | None:
  """Turns on XLA's persistent compilation cache for this job (job_compilation_cache);
  returns its directory.

  config.compilation_cache_dir "" = WORKDIR/xla_cache (any path layer's, gs:// included), unless
  JAX's cache is already set by the user (JAX_COMPILATION_CACHE_DIR, jax.config): then that
  one; "none" = off. A resumed or repeated run of the same shapes (after a preemption, the
  next phase's restart, a sweep) then loads its programs instead of compiling them (BERT-base
  on CPU: the init and the train step, ~15 s). `min_compile_secs`: only programs that took
  longer are kept (None: JAX's default). `users_first=False`: "" is WORKDIR/xla_cache even
  where the user set JAX's cache (the suite: its reruns compile nothing)."""
  where = config.get("compilation_cache_dir", "")
  if where == "none":
    return None
  current = jax.config.jax_compilation_cache_dir
  if not where and users_first and current and current != _CACHE_SET[0]:
    return current
  where = str(fileio.path(where or fileio.join(workdir, "xla_cache")))
  if current != where:
    jax.config.update("jax_compilation_cache_dir", where)
    _CACHE_SET[0] = where
    try:  # the cache object keeps the first directory it was used with
      from jax._src import compilation_cache as cache_lib  # pylint: disable=g-import-not-at-top
      cache_lib.reset_cache()
    except (ImportError, AttributeError):
      pass
  if min_compile_secs is not None:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_secs)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return where


def job_compilation_cache(config: ml_collections.ConfigDict, workdir: str) -> str | None:
  """The compilation cache of the job config.task names, turned on (main.run calls it once,
  before the job): `compilation_cache`'s, and for the suite (its runs and its history over
  saved steps) every program kept in WORKDIR/xla_cache even where the user set JAX's cache,
  so that a rerun, or another suite on the same model, compiles nothing."""
  if config.get("task") == "suite":
    return compilation_cache(config, workdir, min_compile_secs=0.0, users_first=False)
  return compilation_cache(config, workdir)
