"""The train-step benchmark runs on a tiny setting (no timing asserted)."""
import pytest

from bench.peers import train_step


@pytest.mark.slow
def test_train_step_benchmark_smoke(capsys):
  train_step.main(["--smoke", "--no_record"])
  out = capsys.readouterr().out
  assert "| tiny | 32 | float32 | bert_jax |" in out
  assert "transformers-torch" in out
