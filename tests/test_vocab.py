"""Vocabulary training: WordPiece / SentencePiece layout, CLI, errors."""
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from input_pipeline import testing
from input_pipeline import tokenizer as tokenizer_lib
from input_pipeline import vocab as vocab_lib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

TEXT = """The quick brown fox jumps over the lazy dog. Playing games is fun.
The players played and the playful puppy was playing in the garden.

Another document starts here. It talks about Running and runners who run.
Jumping jumpers jumped over the fences while the crowd was cheering.
"""


@pytest.fixture
def corpus_file(tmp_path):
  path = tmp_path / "corpus.txt"
  path.write_text(TEXT * 20, encoding="utf-8")
  return str(path)


def test_wordpiece_layout(corpus_file, tmp_path):
  path = vocab_lib.train_vocab(corpus_file, str(tmp_path / "wp"), vocab_size=200)
  lines = open(path, encoding="utf-8").read().split("\n")
  assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert any(l.startswith("##") for l in lines)
  assert not any(c.isupper() for l in lines[5:] for c in l)  # Lower-cased.
  config = json.load(open(tmp_path / "wp" / tokenizer_lib.CONFIG_NAME))
  # Ours, plus the keys transformers reads (so AutoTokenizer agrees on the casing).
  assert config == {"kind": "wordpiece", "lowercase": True, "tokenizer_class": "BertTokenizer",
                    "do_lower_case": True, "strip_accents": None, "tokenize_chinese_chars": True}
  tok = tokenizer_lib.Tokenizer.from_path(str(tmp_path / "wp"))
  assert tok.pad_id == 0 and tok.vocab_size <= 200
  assert tok.unk_id not in tok.encode("the players were playing")


def test_cased_cli_and_sentencepiece(corpus_file, tmp_path):
  vocab_lib.main(["vocab", f"--input={corpus_file}", f"--output={tmp_path / 'cased'}",
                  "--vocab_size=300", "--nolowercase"])
  tok = tokenizer_lib.Tokenizer.from_path(str(tmp_path / "cased"))
  assert not tok.lowercase and any(c.isupper() for t in tok.tokens[5:] for c in t)
  assert tok.encode("The") != tok.encode("the")
  vocab_lib.main(["vocab", f"--input={corpus_file}", f"--output={tmp_path / 'sp'}",
                  "--vocab_size=120", "--kind=sentencepiece"])
  sp = tokenizer_lib.Tokenizer.from_path(str(tmp_path / "sp"))
  assert sp.kind == "sentencepiece"
  assert sp.convert_ids_to_tokens(range(5)) == list(tokenizer_lib.SPECIAL_TOKENS)


def test_errors(tmp_path):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n  \n", encoding="utf-8")
  with pytest.raises(ValueError, match="no text"):
    vocab_lib.train_vocab(str(empty), str(tmp_path / "out"), vocab_size=100)
  with pytest.raises(FileNotFoundError, match="matches no files"):
    vocab_lib.train_vocab(str(tmp_path / "nope*.txt"), str(tmp_path / "out"), vocab_size=100)
  with pytest.raises(ValueError, match="kind"):
    vocab_lib.train_vocab(str(empty), str(tmp_path / "out"), kind="unigram")
  with pytest.raises(ValueError, match="256 bytes and the 5 special tokens"):
    vocab_lib.train_vocab(str(empty), str(tmp_path / "out"), kind="bpe", vocab_size=261)


def test_missing_input_or_a_file_for_the_output_is_one_line(corpus_file, tmp_path):
  """The vocab command given a missing input, a directory for an input file or a file where
  its output directory goes: one line naming the path and what to do, exit 2, nothing
  written (issue 56 item 10)."""
  run = lambda *flags: testing.refusal(vocab_lib.main, ["vocab", *flags, "--vocab_size=120"])
  out = tmp_path / "v"
  line = run(f"--input={tmp_path / 'nope.txt'}", f"--output={out}")
  assert f"Input pattern '{tmp_path / 'nope.txt'}' matches no files" in line, line
  line = run(f"--input={tmp_path}", f"--output={out}")
  assert f"{tmp_path} is a directory" in line, line
  assert f"give the files in it, e.g. '{tmp_path}/*.txt'" in line, line
  line = run(f"--input={corpus_file}", f"--output={corpus_file}")
  assert f"The output directory {corpus_file} cannot be created: {corpus_file} is a file" in line
  assert not out.exists() and not pathlib.Path(vocab_lib.scratch_dir(corpus_file)).exists()


@pytest.mark.parametrize("lowercase", [True, False])
def test_byte_level_bpe_tokenizes_as_transformers(corpus_file, tmp_path, lowercase):
  """--kind=bpe: a tokenizer.json (BERT's five special tokens first, byte-level pieces, no
  [UNK] for any text) that our Tokenizer and AutoTokenizer.from_pretrained read as the same
  ids, single texts and pairs; cased or not."""
  from transformers import AutoTokenizer
  out = tmp_path / "bpe"
  vocab_lib.main(["vocab", f"--input={corpus_file}", f"--output={out}", "--vocab_size=400",
                  "--kind=bpe", f"--{'' if lowercase else 'no'}lowercase"])
  assert sorted(p.name for p in out.iterdir()) == sorted([tokenizer_lib.CONFIG_NAME,
                                                          tokenizer_lib.HF_TOKENIZER_FILE])
  tok = tokenizer_lib.Tokenizer.from_path(str(out))
  assert tok.kind == "hf" and 256 + 5 < tok.vocab_size <= 400  # bytes, specials, merges
  assert tok.convert_ids_to_tokens(range(5)) == list(tokenizer_lib.SPECIAL_TOKENS)
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert "\u0120the" in tok.tokens  # "Ġthe": a word-start piece
  texts = ["The players were playing in the garden.", "Zebras 🦓 über ĉiuj [MASK] jump."]
  hf = AutoTokenizer.from_pretrained(str(out))
  for text in texts:
    ids = tok.encode(text)
    assert tok.unk_id not in ids
    assert [tok.cls_id] + ids + [tok.sep_id] == hf(text)["input_ids"]
  pair = hf(*texts, return_token_type_ids=True)
  a, b = (tok.encode(t) for t in texts)
  assert pair["input_ids"] == [2] + a + [3] + b + [3]
  assert pair["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  assert (tok.encode("The") == tok.encode("the")) == lowercase
  assert tok.lowercase == lowercase  # as prepare's summary and inspect report it
  assert hf.mask_token == "[MASK]" and hf.pad_token_id == 0
  # A word's character offsets leave out the space before it (a span read from the offsets,
  # as SQuAD's answers are, starts at the word).
  text = texts[0]
  spans = [text[s:e] for s, e in hf(text, return_offsets_mapping=True)["offset_mapping"][1:-1]]
  assert "".join(spans).replace(" ", "") == text.replace(" ", "") and spans[1] == spans[1].strip()
  assert spans[1] and not any(s.startswith(" ") for s in spans), spans


def test_casing_defaults_to_the_kinds(corpus_file, tmp_path):
  """Without --lowercase/--nolowercase the CLI trains what the job's build trains: a cased
  byte-level BPE (as every published one), uncased WordPiece and SentencePiece."""
  cased = {}
  for kind in ("bpe", "wordpiece"):
    out = tmp_path / kind
    vocab_lib.main(["vocab", f"--input={corpus_file}", f"--output={out}", "--vocab_size=400",
                    f"--kind={kind}"])
    tok = tokenizer_lib.Tokenizer.from_path(str(out))
    cased[kind] = not tok.lowercase and tok.encode("The") != tok.encode("the")
  assert cased == {"bpe": True, "wordpiece": False}
  assert [vocab_lib.default_lowercase(k) for k in ("bpe", "wordpiece", "sentencepiece")] == [
      False, True, True]


def test_byte_level_bpe_is_deterministic_across_runs_and_threads(tmp_path):
  """The same corpus gives a byte-identical tokenizer.json with 1 or 2 Rust threads (ties
  between equally frequent merges included)."""
  corpus_file = _varied_corpus(tmp_path / "corpus.txt", megabytes=0.1)
  files = []
  for threads in ("1", "2"):
    out = tmp_path / f"bpe{threads}"
    result = _vocab_cli(f"--input={corpus_file}", f"--output={out}", "--vocab_size=700",
                        "--kind=bpe", RAYON_NUM_THREADS=threads)
    assert result.returncode == 0, result.stderr[-3000:]
    files.append((out / tokenizer_lib.HF_TOKENIZER_FILE).read_bytes())
  assert files[0] == files[1]
  assert len(json.loads(files[0])["model"]["vocab"]) == 700


REPO = pathlib.Path(__file__).resolve().parents[1]


def _varied_corpus(path, megabytes: float = 0.3) -> str:
  """Many distinct words with many equally frequent pairs (ties between merges)."""
  rng = random.Random(0)
  syllables = ["ka", "lo", "mi", "ne", "pu", "ra", "si", "to", "vu", "ze", "qu", "ix", "é"]
  words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
           for _ in range(3000)]
  lines = []
  while sum(map(len, lines)) < megabytes * 1e6:
    lines.append(" ".join(rng.choice(words) for _ in range(12)).capitalize() + ".")
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(path)


def _vocab_cli(*args, timeout=300, **env):
  return subprocess.run([sys.executable, "-m", "input_pipeline.vocab", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env))


def test_wordpiece_is_deterministic_across_runs_and_threads(tmp_path):
  """The same corpus and settings give a byte-identical vocab.txt, in two processes with
  different numbers of Rust threads (tokenizers numbered the "##" pieces in hash map
  order: another vocabulary every run)."""
  corpus_file = _varied_corpus(tmp_path / "corpus.txt")
  files = []
  for threads in ("1", "2"):
    out = tmp_path / f"vocab{threads}"
    result = _vocab_cli(f"--input={corpus_file}", f"--output={out}", "--vocab_size=600",
                        RAYON_NUM_THREADS=threads)
    assert result.returncode == 0, result.stderr[-3000:]
    files.append((out / "vocab.txt").read_bytes())
  assert files[0] == files[1]
  tokens = files[0].decode("utf-8").split("\n")
  assert len(tokens) - 1 == 600 and "##a" in tokens and "##x" in tokens
  # Nothing left behind: the scratch directory is gone.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "vocab1", "vocab2"]


def test_sentencepiece_is_deterministic(tmp_path):
  """The model bytes do not depend on where it is written (its trainer_spec recorded the
  scratch paths) or on the machine's cores."""
  corpus_file = _varied_corpus(tmp_path / "corpus.txt", megabytes=0.1)
  models = [(pathlib.Path(vocab_lib.train_vocab(
      corpus_file, str(tmp_path / name), vocab_size=300, kind="sentencepiece"))).read_bytes()
            for name in ("a", "b")]
  assert models[0] == models[1]


def test_killed_training_leaves_no_text_outside_the_output(tmp_path):
  """SIGKILL during training leaves the copy of the training text beside the output, not
  in the system's temporary directory; the next run removes it."""
  corpus_file = _varied_corpus(tmp_path / "corpus.txt", megabytes=0.5)
  system_tmp = tmp_path / "system_tmp"
  system_tmp.mkdir()
  out = tmp_path / "out" / "vocab"
  args = [sys.executable, "-m", "input_pipeline.vocab", f"--input={corpus_file}",
          f"--output={out}", "--vocab_size=3000"]
  proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TMPDIR=str(system_tmp)))
  try:
    deadline = time.time() + 120
    while not list(tmp_path.rglob("texts.txt")):
      assert proc.poll() is None and time.time() < deadline, "no training text written"
      time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert not list(system_tmp.rglob("texts.txt"))
  scratch = pathlib.Path(vocab_lib.scratch_dir(str(out)))
  assert scratch.parent == out.parent and (scratch / "texts.txt").exists()
  vocab_lib.train_vocab(corpus_file, str(out), vocab_size=300, max_chars=20_000)
  assert not scratch.exists() and (out / "vocab.txt").exists()
  assert sorted(p.name for p in out.parent.iterdir()) == ["vocab"]


def test_binary_corpus_file_is_refused_by_the_cli(corpus_file, tmp_path):
  """A binary file among the corpus files: one line naming it, exit status 2, nothing
  written; the replaced-byte count of an accepted corpus is in the log."""
  binary = tmp_path / "ls.bin"
  binary.write_bytes(random.Random(1).randbytes(60_000))
  result = _vocab_cli(f"--input={corpus_file},{binary}", f"--output={tmp_path / 'v'}",
                      "--vocab_size=200")
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert str(binary) in errors[0] and "not valid UTF-8" in errors[0]
  assert "--max_replaced_fraction" in errors[0]
  assert not (tmp_path / "v").exists() and not (tmp_path / "v.scratch").exists()
  result = _vocab_cli(f"--input={corpus_file},{binary}", f"--output={tmp_path / 'v'}",
                      "--vocab_size=200", "--max_replaced_fraction=0.9")
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r"[\d,]+ bytes not valid UTF-8 \(\d+\.\d+%\) replaced", result.stderr)


def test_wordpiece_unplanned_pieces_are_pinned_too(tmp_path, monkeypatch):
  """Should a character continue words that the module thought could not (Unicode
  tables differ between Python and Rust), its "##" piece is pinned on a second pass: the
  result is still the same every time, alphabet and "##" pieces before the merges."""
  corpus_file = _varied_corpus(tmp_path / "corpus.txt", megabytes=0.05)
  monkeypatch.setattr(vocab_lib, "_can_continue", lambda char: False)
  runs = [pathlib.Path(vocab_lib.train_vocab(corpus_file, str(tmp_path / name),
                                             vocab_size=300)).read_text(encoding="utf-8")
          for name in ("a", "b", "c")]
  assert runs[0] == runs[1] == runs[2]
  tokens = runs[0].split("\n")[:-1]
  single = [i for i, t in enumerate(tokens)
            if len(t) == 1 or (t.startswith("##") and len(t) == 3)]
  assert single == list(range(5, 5 + len(single)))  # Right after the special tokens.
  assert "##a" in tokens and len(tokens) == 300


@pytest.mark.parametrize("kind,size", [("wordpiece", 5), ("sentencepiece", 5), ("bpe", 5),
                                       ("bpe", 200)])
def test_a_vocabulary_size_too_small_is_one_line(corpus_file, tmp_path, kind, size):
  """--vocab_size that leaves no room beyond the special tokens (or, for byte-level BPE, the
  256 bytes): one line naming the smallest size that works, exit 2 (a ValueError traceback
  before)."""
  line = testing.refusal(vocab_lib.main, ["vocab", f"--input={corpus_file}",
                                          f"--output={tmp_path / 'v'}", f"--kind={kind}",
                                          f"--vocab_size={size}"])
  assert f"--vocab_size={size}" in line and "at least" in line, line
  assert not (tmp_path / "v").exists()
