"""Vocabulary training: WordPiece / SentencePiece layout, CLI, errors."""
import json
import os

import pytest

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
    vocab_lib.train_vocab(str(empty), str(tmp_path / "out"), kind="bpe")
