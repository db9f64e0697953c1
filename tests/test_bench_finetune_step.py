"""bench/peers/finetune_step.py: its batch accounting (fast) and, under -m slow, the whole bench in
its --smoke settings (both jobs and transformers run; no timing asserted)."""
import pathlib

import pytest

from bench.peers import finetune_step
from bench import harness


def _vocab(tmp_path: pathlib.Path, cola: str) -> str:
  words = sorted({w.strip(".") for l in open(f"{cola}/in_domain_train.tsv") for w in l.split("\t")[-1].split()})
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + words) + "\n")
  return str(tmp_path / "vocab.txt")


def test_examples_counted_over_the_timed_steps(tmp_path):
  cola = finetune_step._smoke_cola(tmp_path)
  feats = finetune_step._features(_vocab(tmp_path, cola), cola, 16)
  assert len(feats["input_ids"]) == 200
  assert finetune_step.examples_in_steps(feats, 8, 16, 2, 6, packed=False) == 4 * 8
  packed = finetune_step.examples_in_steps(feats, 8, 16, 2, 6, packed=True)
  assert 4 * 8 < packed <= 4 * 8 * 8  # several short examples a row, at most 8


def test_machine_names_the_cpu():
  assert "cores" in harness.machine() or harness.machine() == "lscpu unavailable"


@pytest.mark.slow
def test_finetune_step_smoke():
  out = finetune_step.main(["--smoke", "--no_record"])
  rows = {r["impl"]: r for r in out["rows"]}
  keras = "KerasHub (BertTextClassifier)"  # with bench/setup_keras_peer.sh's venv only
  assert [k for k in rows if k != keras] == ["bert_jax", "transformers (PyTorch)",
                                             "bert_jax packing=True"]
  assert all(r["s_per_step"] > 0 and r["examples_per_s"] > 0 for r in rows.values())
  if keras in rows:
    assert rows[keras]["vs_keras"] == [1.0] and rows["bert_jax"]["vs_keras"][0] > 0
  assert rows["transformers (PyTorch)"]["ratio"] == 1.0
  assert "| bert_jax packing=True |" in out["table"]


@pytest.mark.slow
def test_finetune_step_smoke_packing_each_batch_of_examples():
  """--packed_batch=examples: the job packs each batch of --batch examples (the same
  examples a step as unpacked: examples/s is batch / s/step), as it does with packing unset
  (--packed_batch=default); --torch_padding=longest feeds
  transformers each batch cut to its longest example."""
  out = finetune_step.main(["--smoke", "--no_record", "--no_keras",
                            "--packed_batch=examples,default", "--torch_padding=longest"])
  rows = {r["impl"]: r for r in out["rows"]}
  assert list(rows) == ["bert_jax", "transformers (PyTorch)",
                        "bert_jax packing=True packed_batch=examples",
                        "bert_jax, the job's default (packing unset)"]
  for name in list(rows)[2:]:  # the job's default packs so too: the same examples a step
    packed = rows[name]
    assert packed["examples_per_s"] == pytest.approx(4 / packed["s_per_step"], rel=1e-6)
  assert "transformers' batches cut to their longest example" in out["table"]


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["roberta-base", "deberta-v3-base"])
def test_finetune_step_smoke_on_the_family_shapes(shape):
  """--shape=roberta-base / deberta-v3-base: the fine-tuning job on a checkpoint of that
  family against transformers' ...ForSequenceClassification (AutoModel on the export)."""
  out = finetune_step.main(["--smoke", "--no_record", f"--shape={shape}", "--no_packed"])
  rows = {r["impl"]: r for r in out["rows"]}
  assert list(rows) == ["bert_jax", "transformers (PyTorch)"]
  assert all(r["s_per_step"] > 0 for r in rows.values())
  assert f"{shape} shape" in out["table"]
