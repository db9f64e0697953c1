"""The extra benchmarks run in their --smoke settings (no timing asserted).

Each checks the shape of what the benchmark prints. The Flax peer and the TPU
ahead-of-time compile need things outside this environment (a venv made by
bench/setup_flax_peer.sh; libtpu in /tmp/libtpu_site): without them the rows must
say so instead of failing.
"""
import os
import re

import pytest

from bench.accel import aot_tpu, compile_time, precision
from bench.peers import flax_peer, keras_peer


def _row(out: str, prefix: str) -> list[str]:
  lines = [l for l in out.splitlines() if l.startswith(prefix)]
  assert lines, f"no row starting {prefix!r} in:\n{out}"
  return [c.strip() for c in lines[-1].strip("|").split("|")]


@pytest.mark.slow  # a benchmark's smoke (~16 s)
def test_compile_time_smoke(capsys):
  rows = compile_time.main(["--smoke", "--no_record"])
  out = capsys.readouterr().out
  assert [(r["scan"], r["remat"]) for r in rows] == [(True, "none"), (False, "none")]
  for scan in ("True", "False"):
    cells = _row(out, f"| tiny | 32 | 2 | float32 | {scan} | none |")
    assert len(cells) == 11
    lower, comp, total = map(float, cells[6:9])
    assert comp > 0 and abs(lower + comp - total) < 0.15


@pytest.mark.slow  # a benchmark's smoke (~21 s)
def test_precision_smoke(capsys, tmp_path):
  res = precision.main(["--smoke", "--no_record", f"--data_dir={tmp_path}"])
  out = capsys.readouterr().out
  assert len(res["fp32"]) == len(res["bf16"]) == 20
  assert [l for l in out.splitlines() if re.match(r"\| \d+-\d+ \|", l)].__len__() == 4
  assert re.search(r"tolerance 2%: (PASS|FAIL)\.", out)
  assert res["ok"]  # tiny run, same data: bf16 must track fp32 closely


@pytest.mark.slow  # a benchmark's smoke (~35 s)
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



@pytest.mark.slow  # two processes, each compiling a model (~1 min)
def test_keras_peer_step_smoke(capsys):
  res = keras_peer.main(["step", "--smoke", "--no_record"])
  out = capsys.readouterr().out
  ours = _row(out, "| bert_jax |")
  assert float(ours[1]) > 0 and ours[7].endswith("(median 1.00x)")
  assert 0 < float(ours[3].rstrip("%")) <= 100  # MFU against a peak raised to any achieved rate
  assert float(ours[4]) > 0 and "init" in ours[5] and float(ours[6]) > 0
  keras = _row(out, "| KerasHub |")  # without bench/setup_keras_peer.sh's venv: said so
  assert keras[1].startswith("unavailable:") or (float(keras[1]) > 0 and float(keras[6]) > 0)
  assert res["flop"] > 0 and res["peak"] > 0


@pytest.mark.slow  # prepares books and runs each system's job (~1 min)
def test_keras_peer_real_smoke(capsys):
  if not os.path.isdir(keras_peer.GUTENBERG):
    pytest.skip("../shared/data/gutenberg absent (only on the project's machines)")
  keras_peer.main(["real", "--smoke", "--no_record", "--peers=keras,torch"])
  out = capsys.readouterr().out
  for impl in ("bert_jax", "bert_jax packing=True", "HF PyTorch"):
    cells = _row(out, f"| 32 | 2 | {impl} |")
    assert float(cells[3]) > 0 and 0 <= float(cells[6].rstrip("%")) < 100, cells
  assert _row(out, "| 32 | 2 | bert_jax |")[9] == "1.00x"
  keras = _row(out, "| 32 | 2 | KerasHub |")
  assert keras[3].startswith("unavailable:") or float(keras[3]) > 0

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


@pytest.mark.slow  # libtpu takes a lock: not beside test_aot_tpu_smoke on another worker
def test_aot_tpu_smoke_modern(capsys):
  libtpu_dir = os.environ.get("LIBTPU_DIR", aot_tpu.DEFAULT_LIBTPU)
  if not os.path.exists(os.path.join(libtpu_dir, "libtpu", "libtpu.so")):
    pytest.skip(f"libtpu not in {libtpu_dir} (the BERT smoke test covers the row saying so)")
  rows = aot_tpu.main(["--smoke", "--no_record", "--family=modernbert"])
  out = capsys.readouterr().out
  assert "error" not in rows[0], rows[0]
  cells = _row(out, "| v5e-4 |")
  assert cells[1:3] == ["4", "modernbert-tiny"] and cells[5] == "1,4,1"
  assert float(cells[9]) > 0 and float(cells[12]) > 0


def test_abstract_step_batch_is_the_packed_pipelines(tmp_path):
  """The batch a modern family's step is compiled for (packed rows, no NSP) has the keys,
  shapes and dtypes of the batches input_pipeline/pretrain.py makes for its config."""
  from input_pipeline import pretrain, testing  # pylint: disable=g-import-not-at-top
  config = compile_time.make_config("modernbert-tiny", 64, 4, "float32", vocab=None,
                                    family="modernbert")
  config.data.max_predictions_per_seq, config.data.max_examples_per_row = 10, 4
  _, (_, batch, _), *_ = compile_time.abstract_step(config)
  corpus = testing.make_tagged_corpus(str(tmp_path), num_docs=30, sentences_per_doc=(1, 4),
                                      sentence_words=(3, 12))
  config.data.prepared_dir, config.data.vocab_path = corpus["prepared"], corpus["vocab"]
  it = pretrain.PretrainIterator(config.data, batch_size=4, seed=0)
  try:
    real = next(it)
  finally:
    it.close()
  assert ({k: (v.shape, v.dtype) for k, v in batch.items()}
          == {k: (v.shape, v.dtype) for k, v in real.items()})
  assert batch["masked_lm_ids"].shape == (4, 14) and batch["example_weights"].shape == (4, 4)


@pytest.mark.slow
def test_predict_memory_smoke(capsys, monkeypatch):
  from bench.data import predict_memory  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr("sys.argv", ["predict_memory", "--smoke"])
  predict_memory.main()
  rows = [l for l in capsys.readouterr().out.splitlines() if "peak RSS" in l]
  assert len(rows) == 4 and all(float(r.split("peak RSS")[1].split("MB")[0].replace(",", "")) > 0
                                for r in rows), rows


def test_mfu_sweep_skips_cleanly_without_cola(capsys, tmp_path):
  from bench.accel import mfu_sweep  # pylint: disable=g-import-not-at-top
  mfu_sweep.main([f"--cola_dir={tmp_path / 'absent'}", f"--workdir={tmp_path / 'w'}", "--no_record"])
  assert "skipped:" in capsys.readouterr().out and not (tmp_path / "w").exists()
