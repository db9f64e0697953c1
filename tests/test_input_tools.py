"""The inspect CLI and the input-pipeline benchmark's smoke run."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from input_pipeline import inspect as inspect_lib
from input_pipeline import pretrain
from input_pipeline import testing
from input_pipeline import tokenizer as tokenizer_lib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
  return testing.make_tagged_corpus(str(tmp_path_factory.mktemp("tagged")), num_docs=10)


def test_inspect_prints_and_saves(tagged, tmp_path, capsys):
  out = tmp_path / "batches.npz"
  stats = inspect_lib.main(["inspect", f"--prepared_dir={tagged['prepared']}",
                            "--max_seq_length=64", "--max_predictions_per_seq=10",
                            "--num_batches=3", "--batch_size=16", f"--output={out}"])
  printed = capsys.readouterr().out
  assert "Example 0:" in printed and "→" in printed and "[CLS]" in printed
  assert "mask_rate" in printed and "not_next_fraction" in printed
  assert 0.1 < stats["mask_rate"] < 0.2 and stats["examples"] == 48
  saved = np.load(out)
  assert set(saved.files) == set(pretrain.FEATURES)
  assert saved["input_ids"].shape == (48, 64) and saved["masked_lm_weights"].shape == (48, 10)
  # The saved arrays are exactly the iterator's batches.
  cfg = pretrain.default_data_config()
  cfg.prepared_dir, cfg.max_seq_length, cfg.max_predictions_per_seq = tagged["prepared"], 64, 10
  it = pretrain.PretrainIterator(cfg, batch_size=16, seed=0)
  np.testing.assert_array_equal(saved["input_ids"][:16], next(it)["input_ids"])


def test_inspect_with_config_file(tagged, tmp_path, capsys):
  config = tmp_path / "config.py"
  config.write_text(
      "import ml_collections\n"
      "from input_pipeline import pretrain\n"
      "def get_config():\n"
      "  c = ml_collections.ConfigDict()\n"
      "  c.data = pretrain.default_data_config()\n"
      f"  c.data.prepared_dir = {tagged['prepared']!r}\n"
      "  c.data.max_seq_length = 32\n"
      "  c.data.max_predictions_per_seq = 5\n"
      "  return c\n")
  stats = inspect_lib.main(["inspect", f"--config={config}", "--num_batches=1",
                            "--batch_size=8", "--whole_word_masking", "--print_examples=1"])
  assert stats["examples"] == 8 and "Example 0" in capsys.readouterr().out


def test_format_example_marks_masks(tagged):
  tok = tokenizer_lib.Tokenizer.from_path(tagged["vocab"])
  ex = {"input_ids": np.array([2, tok.mask_id, 7, 3, 8, 3, 0]),
        "input_mask": np.array([1, 1, 1, 1, 1, 1, 0]),
        "segment_ids": np.array([0, 0, 0, 0, 1, 1, 0]),
        "masked_lm_positions": np.array([1, 0]), "masked_lm_ids": np.array([6, 0]),
        "masked_lm_weights": np.array([1.0, 0.0]), "next_sentence_labels": np.array(1)}
  text = inspect_lib.format_example(ex, tok)
  assert f"[[MASK]→{tok.tokens[6]}]" in text and "NotNext" in text
  assert "A: [CLS]" in text and f"B: {tok.tokens[8]} [SEP]" in text


def test_benchmark_smoke():
  result = subprocess.run([sys.executable, "-m", "bench.input_pipeline", "--smoke"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, result.stderr[-3000:]
  for name in ("| ours |", "pinned to 1 core", "google create_pretraining_data",
               "hf DataCollatorForLanguageModeling"):
    assert name in result.stdout
