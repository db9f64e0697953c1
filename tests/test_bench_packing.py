"""bench/accel/packing.py in its --smoke setting (no timing asserted): both modes run from the
real pipeline and the table reports them."""
import pytest

from bench.accel import packing


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_packing_bench_smoke(capsys, tmp_path):
  rows = packing.main(["--smoke", "--no_record", f"--data_dir={tmp_path}"])
  out = capsys.readouterr().out
  assert [r["mode"] for r in rows] == ["unpacked", "packed"]
  unpacked, packed = rows
  assert packed["examples_per_step"] > unpacked["examples_per_step"] == 4
  assert packed["fill"] > unpacked["fill"]
  assert all(r["useful_tokens_per_s"] > 0 and r["steps"] == 2 for r in rows)
  assert "| packed |" in out and "Ceiling at equal step time" in out
