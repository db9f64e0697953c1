"""The inspect CLI and the input-pipeline benchmark's smoke run."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from input_pipeline import data_config
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
  cfg = data_config.default_data_config()
  cfg.prepared_dir, cfg.max_seq_length, cfg.max_predictions_per_seq = tagged["prepared"], 64, 10
  it = pretrain.PretrainIterator(cfg, batch_size=16, seed=0)
  np.testing.assert_array_equal(saved["input_ids"][:16], next(it)["input_ids"])


def test_inspect_with_config_file(tagged, tmp_path, capsys):
  config = tmp_path / "config.py"
  config.write_text(
      "import ml_collections\n"
      "from input_pipeline import data_config\n"
      "def get_config():\n"
      "  c = ml_collections.ConfigDict()\n"
      "  c.data = data_config.default_data_config()\n"
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


@pytest.mark.slow  # a benchmark's smoke (~17 s)
def test_benchmark_smoke():
  result = subprocess.run([sys.executable, "-m", "bench.peers.input_pipeline", "--smoke"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, result.stderr[-3000:]
  for name in ("| ours |", "pinned to 1 core", "google create_pretraining_data",
               "hf DataCollatorForLanguageModeling"):
    assert name in result.stdout


TEXT = ("The quick brown fox jumps over the lazy dog. Playing games is fun. The players "
        "played and the playful puppy was playing in the garden.\n\n"
        "Another document starts here. It talks about running and runners who run. "
        "Jumping jumpers jumped over the fences while the crowd was cheering.\n\n")


@pytest.fixture(scope="module")
def run_workdir(tmp_path_factory):
  """A workdir as configs/tiny_pretrain.py's job leaves it: vocab/ and prepared/ built by
  the job's own build step from a small corpus."""
  from input_pipeline import build  # pylint: disable=g-import-not-at-top  (imports JAX)
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("run")
  corpus_file = root / "corpus.txt"
  # BERT's format (a sentence a line, a blank line between documents): 80 documents.
  corpus_file.write_text("".join(TEXT.replace("games", f"games{i}") for i in range(40))
                         .replace(". ", ".\n"), encoding="utf-8")
  config = tu.tiny_config(**{"synthetic_data": False, "build.corpus": str(corpus_file),
                             "build.vocab_size": 150, "build.num_shards": 2})
  workdir = root / "workdir"
  build.build_data(config, str(workdir))
  return workdir


def test_inspect_shows_what_a_run_trains_on(run_workdir, tmp_path, capsys):
  """--config and --workdir of a run: its workdir-relative vocabulary and prepared corpus,
  its L, P, seed and global batch size, and exactly the batches its iterator yields."""
  from common import fileio  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import tiny_pretrain  # pylint: disable=g-import-not-at-top
  from input_pipeline import data_config  # pylint: disable=g-import-not-at-top
  out = tmp_path / "batches.npz"
  stats = inspect_lib.main(["inspect", "--config=configs/tiny_pretrain.py",
                            f"--workdir={run_workdir}", "--num_batches=1",
                            "--print_examples=1", f"--output={out}"])
  printed = capsys.readouterr().out
  config = tiny_pretrain.get_config()
  assert f"Prepared corpus {run_workdir}/prepared:" in printed, printed
  assert f"Vocabulary {run_workdir}/vocab/vocab.txt: " in printed, printed
  assert (f"L (max_seq_length) = {config.data.max_seq_length}, P (max_predictions_per_seq) "
          f"= {config.data.max_predictions_per_seq}") in printed
  assert f"seed {config.seed}, {config.global_batch_size} examples per batch" in printed
  assert stats["examples"] == config.global_batch_size
  data_cfg = data_config.resolve_paths(config.data, str(run_workdir))
  assert data_cfg.vocab_path == fileio.join(str(run_workdir), "vocab")
  it = pretrain.make_iterator(config, data_cfg, split="train",
                              batch_size=config.global_batch_size, vocab_size=150,
                              seed=config.seed)
  want, saved = next(it), np.load(out)
  for k in want:
    np.testing.assert_array_equal(saved[k], want[k])


def test_inspect_run_config_needs_its_workdir(run_workdir, tmp_path):
  from common import errors  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.UserError, match=r"data.prepared_dir='prepared'.*--workdir"):
    inspect_lib.main(["inspect", "--config=configs/tiny_pretrain.py"])
  with pytest.raises(errors.UserError, match=r"not a prepared corpus \(yet\).*start it"):
    inspect_lib.main(["inspect", "--config=configs/tiny_pretrain.py",
                      f"--workdir={tmp_path / 'fresh'}"])
  result = subprocess.run(
      [sys.executable, "-m", "input_pipeline.inspect", "--config=configs/tiny_pretrain.py"],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  assert "inspect.py: error: The config's data.prepared_dir='prepared'" in result.stderr


def test_inspect_bad_flags_are_one_line_errors(tmp_path):
  """Misspelt flags and config overrides, and a config file that does not load, are
  UserErrors (one line from the command) that name the flag."""
  from common import errors  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.UserError, match=r"--config.data.max_seq_lenght: the config has "
                     r"no field 'max_seq_lenght'. Did you mean \"max_seq_length\""):
    inspect_lib.main(["inspect", "--config=configs/tiny_pretrain.py",
                      "--config.data.max_seq_lenght=3", f"--workdir={tmp_path}"])
  with pytest.raises(errors.UserError, match=r"--config=configs/nope.py: cannot load"):
    inspect_lib.main(["inspect", "--config=configs/nope.py"])
  with pytest.raises(errors.UserError, match=r"Unknown command line flag 'prepared'"):
    inspect_lib.main(["inspect", "--prepared=x"])
  with pytest.raises(errors.UserError, match=r"Unexpected arguments \['extra'\]"):
    inspect_lib.main(["inspect", "--prepared_dir=x", "extra"])


@pytest.mark.slow  # a benchmark's smoke (~15 s)
def test_corpus_scale_bench_replicates_and_measures(tmp_path):
  """bench/data/corpus_scale.py's pieces on a tiny corpus: the replicated corpus holds every
  document N times in corpus order; a measurement child reads it; the first-format copy
  is refused by this checkout's loader (the bench reads it with an older checkout)."""
  from bench.data import corpus_scale  # pylint: disable=g-import-not-at-top
  tagged = testing.make_tagged_corpus(str(tmp_path / "c"), num_docs=6, num_shards=2)
  out = str(tmp_path / "x3")
  summary = corpus_scale.replicate(tagged["prepared"], out, 3)
  assert summary["documents"] == 18 and summary["tokens"] == 3 * tagged["summary"]["tokens"]
  base = corpus_scale._documents(tagged["prepared"], tagged["summary"])
  copies = corpus_scale._documents(out, summary)
  for g, (tokens, lengths) in enumerate(copies):
    np.testing.assert_array_equal(tokens, base[g % 6][0])
    np.testing.assert_array_equal(lengths, base[g % 6][1])
  result = corpus_scale.measure(str(REPO), out, tagged["vocab"], 0.2)
  assert result["rate"] > 0 and result["startup_s"] > 0 and result["peak_mb"] > 0
  corpus_scale.write_first_format(summary, out, str(tmp_path / "old"), 3)
  with pytest.raises(RuntimeError, match="first format"):
    corpus_scale.measure(str(REPO), str(tmp_path / "old"), tagged["vocab"], 0.2)
