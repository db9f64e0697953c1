"""The main job's build step (input_pipeline/build.py): vocabulary and prepared corpus in
the workdir, what it logs, bad corpora, and determinism of the README's main job."""
import logging as py_logging
import os
import random
import re

import numpy as np
import pytest

from common import errors
from input_pipeline import build
from input_pipeline import inspect as inspect_lib
from input_pipeline import testing
from input_pipeline import text
from tests import test_train_utils as tu

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# BERT's format (a sentence a line, a blank line after each document): TEXT * 30 prepares
# into 60 documents, enough to hold some out (a text of one document is refused).
TEXT = ("The quick brown fox jumps over the lazy dog.\nPlaying games is fun.\n"
        "The players played and the playful puppy was playing in the garden.\n\n"
        "Another document starts here.\nIt talks about running and runners who run.\n"
        "Jumping jumpers jumped over the fences while the crowd was cheering.\n\n")


def _config(corpus: str, **overrides):
  return tu.tiny_config(**{"synthetic_data": False, "build.corpus": corpus,
                           "build.vocab_size": 120, "build.num_shards": 2,
                           "model.vocab_size": None, **overrides})


def test_build_logs_the_final_vocabulary_path(tmp_path, caplog):
  """The vocabulary is trained into a staging directory; the log names the final path
  only, and the workdir keeps nothing else (no staging, no scratch)."""
  corpus_file = tmp_path / "corpus.txt"
  corpus_file.write_text(TEXT * 30, encoding="utf-8")
  workdir = tmp_path / "run"
  with caplog.at_level(py_logging.INFO):
    data_cfg, vocab_size = build.build_data(_config(str(corpus_file)), str(workdir))
  logged = [r.getMessage() for r in caplog.records]
  assert not [m for m in logged if ".tmp" in m or ".scratch" in m], logged
  assert f"Vocabulary ready: {workdir}/vocab." in logged, logged
  assert data_cfg.vocab_path == f"{workdir}/vocab" and vocab_size <= 120
  assert sorted(p.name for p in workdir.iterdir()) == ["prepared", "vocab"]


def test_build_trains_the_kind_the_family_asks_unless_the_config_names_one(tmp_path):
  """build.vocab_kind "" trains the `vocab_kind` the job passes (its family's: byte-level BPE
  for RoBERTa) and the corpus is prepared with it; a kind named in the config wins."""
  from input_pipeline import tokenizer as tokenizer_lib
  corpus_file = tmp_path / "corpus.txt"
  corpus_file.write_text(TEXT * 30, encoding="utf-8")
  config = _config(str(corpus_file), build__vocab_size=300)
  assert config.build.vocab_kind == ""
  data_cfg, vocab_size = build.build_data(config, str(tmp_path / "bpe"), vocab_kind="bpe")
  assert sorted(p.name for p in (tmp_path / "bpe" / "vocab").iterdir()) == ["COMPLETE",
      "tokenizer.json", "tokenizer_config.json"]
  tok = tokenizer_lib.Tokenizer.from_path(data_cfg.vocab_path)
  assert tok.kind == "hf" and tok.vocab_size == vocab_size and "\u0120the" in tok.tokens
  assert (tmp_path / "bpe" / "prepared" / "summary.json").is_file()
  config.build.vocab_kind = "wordpiece"
  data_cfg, _ = build.build_data(config, str(tmp_path / "wp"), vocab_kind="bpe")
  assert (tmp_path / "wp" / "vocab" / "vocab.txt").is_file()


def test_build_refuses_a_binary_corpus_file(tmp_path, caplog):
  """A binary file in build.corpus fails the build with a UserError naming the file and
  the config field that raises the limit; with the limit raised it is accepted and its
  replaced bytes are in the log."""
  good = tmp_path / "good.txt"
  good.write_text(TEXT * 30, encoding="utf-8")
  binary = tmp_path / "ls"
  binary.write_bytes(random.Random(0).randbytes(20_000))
  corpus = f"{good},{binary}"
  with pytest.raises(errors.UserError) as e:
    build.build_data(_config(corpus), str(tmp_path / "run"))
  assert isinstance(e.value, text.TooManyReplacedBytesError)
  assert str(binary) in str(e.value)
  assert "--config.build.max_replaced_fraction" in str(e.value)
  caplog.clear()
  with caplog.at_level(py_logging.INFO):
    build.build_data(_config(corpus, build__max_replaced_fraction=0.9), str(tmp_path / "run2"))
  logged = "\n".join(r.getMessage() for r in caplog.records)
  found = re.search(r"Prepared corpus .*; ([\d,]+) of its [\d,]+ input bytes were not valid "
                    r"UTF-8", logged)
  assert found and int(found.group(1).replace(",", "")) > 5000, logged


def _job_refusal(config, workdir) -> str:
  """The one line the pre-training job prints when its data step refuses `config`."""
  return testing.refusal(lambda argv: build.build_data(config, str(workdir)), ["main.py"])


def test_missing_corpus_or_prepared_dir_is_one_line(tmp_path):
  """The job given a build.corpus that is missing or a directory, or a data.prepared_dir
  that is missing or a file: one line naming the path and what to do, exit 2 (issue 56
  item 10)."""
  missing = tmp_path / "nope.txt"
  line = _job_refusal(_config(str(missing)), tmp_path / "run")
  assert f"Input pattern '{missing}' matches no files" in line, line
  assert "give 'default' for the built-in corpus" in line, line
  line = _job_refusal(_config(str(tmp_path)), tmp_path / "run2")
  assert f"{tmp_path} is a directory" in line, line
  vocab = testing.write_vocab(str(tmp_path / "vocab.txt"), ["a", "b"])
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  for prepared, why in ((tmp_path / "none", "it does not exist"),
                        (a_file, "it is a file, not a directory"),
                        (tmp_path, "it has no summary.json")):
    config = _config("", data__prepared_dir=str(prepared), data__vocab_path=vocab)
    line = _job_refusal(config, tmp_path / "run3")
    assert f"{prepared} is not a (completely) prepared corpus: {why}" in line, line
    assert f"--output_dir={prepared}" in line, line


def test_a_corpus_of_one_document_is_one_line_before_the_model(tmp_path):
  """A corpus that prepares into one document cannot give held-out and training documents:
  the job says so in one line (exit 2) at its data step, before the model is built, and so
  does inspect on the prepared directory (issue 56 item 10)."""
  one = tmp_path / "one.txt"
  one.write_text(TEXT.split("\n\n")[0] * 30, encoding="utf-8")
  line = _job_refusal(_config(str(one)), tmp_path / "run")
  prepared = tmp_path / "run" / "prepared"
  assert f"The prepared corpus {prepared} has 1 document: too few to hold out 2 for " in line
  assert "a blank line ends a document" in line, line
  assert f"--config.build.corpus={one}: delete {prepared} for the job to prepare it" in line
  line = testing.refusal(inspect_lib.main, ["inspect", f"--prepared_dir={prepared}"])
  assert "has 1 document: too few" in line, line


@pytest.mark.slow
def test_readme_main_job_twice_gives_identical_checkpoints(tmp_path):
  """Two fresh runs of the README's main command (shrunk, but building its vocabulary and
  prepared corpus from the built-in corpus, with different numbers of tokenizer threads)
  end with bit-identical vocabularies and checkpoints (every array)."""
  runs = []
  for threads in ("1", "2"):
    workdir = tmp_path / f"run{threads}"
    args = tu.main_args(workdir, **{"synthetic_data": False, "build.corpus": None,
                                    "model.vocab_size": None, "build.vocab_size": 1024})
    tu.run(args, timeout=900, RAYON_NUM_THREADS=threads)
    runs.append(workdir)
  vocabs = [(w / "vocab" / "vocab.txt").read_bytes() for w in runs]
  assert vocabs[0] == vocabs[1]
  steps = [tu.checkpoint_steps(w) for w in runs]
  assert steps[0] == steps[1] and steps[0][-1] == tu.TINY["num_train_steps"]
  first, second = (tu.flat(tu.load_checkpoint(w)) for w in runs)
  assert first.keys() == second.keys() and len(first) > 20
  differ = [k for k in first if not np.array_equal(first[k], second[k])]
  assert not differ, f"{len(differ)} of {len(first)} arrays differ: {differ[:5]}"
