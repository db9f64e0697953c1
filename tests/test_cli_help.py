"""`--help` and `-h` of every command-line entry point print usage and exit 0."""
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# Entry point -> flags its usage must mention.
ENTRY_POINTS = {
    "input_pipeline.vocab": ["--input", "--output", "--vocab_size", "--kind",
                             "--max_replaced_fraction"],
    "input_pipeline.prepare": ["--input", "--vocab", "--output_dir", "--num_shards",
                               "--max_replaced_fraction", "--text_field", "--max_bad_records"],
    "input_pipeline.prepare_hosts": ["--input", "--vocab", "--output_dir", "--num_hosts",
                                     "--host_index", "--merge_timeout", "--max_bad_records"],
    "input_pipeline.inspect": ["--config", "--workdir", "--prepared_dir", "--vocab",
                               "--num_batches"],
    "bert_jax.main": ["--config", "--workdir"],
    "bert_jax.predict": ["--checkpoint", "--vocab", "--mode"],
    "bert_jax.convert": ["--input", "--output", "--to"],
    "bert_jax.embed_eval": ["--checkpoint", "--sts_file", "--beir_dir"],
}


def test_every_entry_point_is_listed():
  """Every module with a `__main__` block in input_pipeline/ and bert_jax/ is tested."""
  found = {f"{p.parent.name}.{p.stem}" for d in ("input_pipeline", "bert_jax")
           for p in (REPO / d).glob("*.py") if "__main__" in p.read_text()}
  assert found == set(ENTRY_POINTS)


@pytest.mark.parametrize("option", ["--help", "-h"])
@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_help_prints_usage_and_exits_0(module, option):
  result = subprocess.run([sys.executable, "-m", module, option], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
  assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
  missing = [f for f in ENTRY_POINTS[module] if f not in result.stdout]
  assert not missing, (missing, result.stdout)
