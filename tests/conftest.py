"""Shared pytest set-up: markers, quiet TF, XLA flags for fast compiles, and the shared data
location."""
import os
import pathlib

import pytest

from bert_jax import process
from tests.test_train_utils import TEST_XLA_FLAGS

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Before any test starts a JAX backend; a flag the caller's XLA_FLAGS names keeps its value.
process.job_xla_flags(flags=TEST_XLA_FLAGS)

# ../shared beside the repository: present on the project's machines, absent in
# a user's fresh clone (tests that need it skip).
SHARED_DIR = pathlib.Path(__file__).resolve().parents[2] / "shared"


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: slower checks (run by .ci/run, not by default)")
  config.addinivalue_line("markers", "data: needs ../shared/data (skipped when absent)")


@pytest.fixture
def shared_data_dir() -> pathlib.Path:
  path = SHARED_DIR / "data"
  if not path.is_dir():
    pytest.skip(f"{path} not present (only on the project's machines)")
  return path
