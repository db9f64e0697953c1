"""The extra benchmarks run in their --smoke settings (no timing asserted).

Each checks the shape of what the benchmark prints. The Flax peer and the TPU
ahead-of-time compile need things outside this environment (a venv made by
bench/setup_flax_peer.sh; libtpu in /tmp/libtpu_site): without them the rows must
say so instead of failing.
"""
import re

import pytest

from bench import aot_tpu, compile_time, flax_peer, precision


def _row(out: str, prefix: str) -> list[str]:
  lines = [l for l in out.splitlines() if l.startswith(prefix)]
  assert lines, f"no row starting {prefix!r} in:\n{out}"
  return [c.strip() for c in lines[-1].strip("|").split("|")]


def test_compile_time_smoke(capsys):
  rows = compile_time.main(["--smoke", "--no_record"])
  out = capsys.readouterr().out
  assert [(r["scan"], r["remat"]) for r in rows] == [(True, "none"), (False, "none")]
  for scan in ("True", "False"):
    cells = _row(out, f"| tiny | 32 | 2 | float32 | {scan} | none |")
    assert len(cells) == 11
    lower, comp, total = map(float, cells[6:9])
    assert comp > 0 and abs(lower + comp - total) < 0.15


def test_precision_smoke(capsys, tmp_path):
  res = precision.main(["--smoke", "--no_record", f"--data_dir={tmp_path}"])
  out = capsys.readouterr().out
  assert len(res["fp32"]) == len(res["bf16"]) == 20
  assert [l for l in out.splitlines() if re.match(r"\| \d+-\d+ \|", l)].__len__() == 4
  assert re.search(r"tolerance 2%: (PASS|FAIL)\.", out)
  assert res["ok"]  # tiny run, same data: bf16 must track fp32 closely


def test_flax_peer_smoke(capsys):
  rows = flax_peer.main(["--smoke", "--no_record"])
  out = capsys.readouterr().out
  assert [r["impl"].split(" ")[0] for r in rows] == [
      "bert_jax", "transformers-torch", "transformers-flax"]
  ours = _row(out, "| bert_jax |")
  assert float(ours[1]) > 0 and ours[5] == "1.00"
  assert float(_row(out, "| transformers-torch")[1]) > 0
  flax = _row(out, "| transformers-flax")
  assert flax[1].startswith("unavailable:") or float(flax[1]) > 0


def test_aot_tpu_smoke(capsys):
  rows = aot_tpu.main(["--smoke", "--no_record"])
  out = capsys.readouterr().out
  assert len(rows) == 1
  cells = _row(out, "| v5e-4 |")
  if "error" in rows[0]:
    assert cells[9].startswith("failed:")
  else:
    assert rows[0]["devices"] == 4 and cells[5] == "1,4,1"
    assert float(cells[9]) > 0 and float(cells[12]) > 0


@pytest.mark.slow
def test_predict_memory_smoke(capsys, monkeypatch):
  from bench import predict_memory  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr("sys.argv", ["predict_memory", "--smoke"])
  predict_memory.main()
  rows = [l for l in capsys.readouterr().out.splitlines() if "peak RSS" in l]
  assert len(rows) == 4 and all(float(r.split("peak RSS")[1].split("MB")[0].replace(",", "")) > 0
                                for r in rows), rows
