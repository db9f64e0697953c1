"""notebooks/quickstart.ipynb, executed with nbclient on CPU with the smallest settings:
pre-training on the built-in corpus, the loss plot, fill-mask, fine-tuning and classify."""
import json
import os
import re
import sys

import pytest

from tests import test_train_utils as tu

nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat (test extra)")
nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient (test extra)")
pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel (test extra)")
pytest.importorskip("matplotlib", reason="the notebook plots with matplotlib (test extra)")

NOTEBOOK = tu.REPO / "notebooks" / "quickstart.ipynb"
STEPS, EPOCHS = 40, 3
# Smallest settings (the notebook reads them from the environment): a few dozen steps on
# the real built-in corpus, a small vocabulary trained on part of it, a small evaluation.
SMALL = {
    "BERT_JAX_NOTEBOOK_STEPS": str(STEPS),
    "BERT_JAX_NOTEBOOK_VOCAB_SIZE": "1024",
    "BERT_JAX_NOTEBOOK_EPOCHS": str(EPOCHS),
    "BERT_JAX_NOTEBOOK_FLAGS": " ".join([
        "--config.build.max_chars=400000", "--config.build.num_shards=2",
        "--config.global_batch_size=32", "--config.schedule.warmup_steps=5",
        "--config.checkpoint_every_steps=20", "--config.log_every_steps=5",
        "--config.eval_every_steps=20", "--config.eval_steps=2", "--config.eval_batch_size=32"]),
}


def _kernelspec(tmp_path) -> None:
  """A python3 kernelspec running this interpreter (found first through JUPYTER_PATH)."""
  spec = tmp_path / "jupyter" / "kernels" / "python3"
  spec.mkdir(parents=True)
  (spec / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "Python 3 (bert_jax tests)", "language": "python"}))


def _text(cell) -> str:
  return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_committed_notebook_has_no_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]


@pytest.mark.slow  # the whole notebook, a tiny pre-training and fine-tuning (~65 s); CI runs the slow tier too
def test_quickstart_notebook_runs(tmp_path, monkeypatch):
  workdir = tmp_path / "bert_tiny"
  test_env = {k: v for k, v in tu.env(devices=1).items() if os.environ.get(k) != v}
  for key, value in {**SMALL, **test_env,
                     "BERT_JAX_NOTEBOOK_WORKDIR": str(workdir),
                     "JUPYTER_PATH": str(tmp_path / "jupyter"),
                     "MPLBACKEND": "module://matplotlib_inline.backend_inline"}.items():
    monkeypatch.setenv(key, value)
  _kernelspec(tmp_path)
  run_dir = tmp_path / "cwd"  # the kernel's working directory: not the repository
  run_dir.mkdir()
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(run_dir)}}).execute()
  nbformat.write(nb, tmp_path / "executed.ipynb")  # to look at when an assertion fails

  cells = {tag: c for c in nb.cells for tag in c.metadata.get("tags", [])}
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "error" or o.get("name") == "stderr" and "Traceback" in o.text]
  assert not errors, errors
  # Run from the checkout: nothing cloned or installed; the kernel is this interpreter.
  install = _text(cells["install"])
  assert "already importable: nothing to install" in install, install
  assert f"bert_jax from {tu.REPO}" in install and sys.executable in install, install
  assert "backend: cpu" in _text(cells["devices"]) and "compute dtype: float32" in _text(cells["devices"])

  pretrain = _text(cells["pretrain"])
  assert "Training a 1024-entry wordpiece vocabulary" in pretrain, pretrain
  assert f"step {STEPS}/{STEPS}" in pretrain and f"eval at step {STEPS}" in pretrain, pretrain
  assert (workdir / "vocab" / "vocab.txt").is_file()
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["20", "40"]

  # The plot: shown inline and saved; the curves come from the run's TensorBoard files.
  assert any("image/png" in o.get("data", {}) for o in cells["plot"].outputs)
  png = workdir / "loss_curves.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
  losses = tu.read_scalars(workdir, "train/loss")
  assert sorted(losses) == list(range(5, STEPS + 1, 5))
  final = re.search(r"final train loss ([\d.]+) at step (\d+) \(first logged: ([\d.]+)\)",
                    _text(cells["plot"]))
  assert final and int(final[2]) == STEPS, _text(cells["plot"])
  assert float(final[1]) == pytest.approx(losses[STEPS], abs=1e-3)
  assert float(final[1]) < float(final[3])  # it learned something in 40 steps
  assert "held-out MLM accuracy" in _text(cells["plot"])

  # Fill-mask: each sentence, then 5 candidates with probabilities for its [MASK].
  fill = _text(cells["fill-mask"])
  rows = [l for l in fill.splitlines() if l.startswith("  [MASK] ->")]
  assert len(rows) == 3, fill
  for row in rows:
    probs = [float(p) for p in re.findall(r"\((\d\.\d\d)\)", row)]
    assert len(probs) == 5 and probs == sorted(probs, reverse=True), row

  # Fine-tuning: dev accuracy per epoch in metrics.json, printed; classify new text.
  metrics = json.loads((workdir / "classify" / "metrics.json").read_text())
  assert metrics["main_metric"] == "accuracy" and len(metrics["epochs"]) == EPOCHS
  assert 0.0 <= metrics["best"]["accuracy"] <= 1.0
  assert f"best dev accuracy: {metrics['best']['accuracy']:.3f}" in _text(cells["dev-metrics"])
  assert (workdir / "classify" / "predictions.tsv").is_file()
  predictions = [l.split()[0] for l in _text(cells["classify"]).splitlines()]
  assert len(predictions) == 4 and set(predictions) <= {"positive", "negative"}, predictions
