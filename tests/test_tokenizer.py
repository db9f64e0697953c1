"""Tokenizer: token-for-token parity with transformers' BERT tokenizers, specials, SentencePiece."""
import os
import pathlib

import numpy as np
import pytest

from input_pipeline import corpus
from input_pipeline import testing
from input_pipeline import tokenizer as tokenizer_lib
from input_pipeline import vocab as vocab_lib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
GUTENBERG = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "gutenberg"

# Accents, punctuation, CJK, control and zero-width characters, full-width forms,
# an over-long word (> 100 characters -> [UNK]), contractions, dashes, numbers.
HARD_TEXT = [
    "Héllo, Wörld! Ça va? naïve café RÉSUMÉ Ångström",
    "日本語のテキストと中文字符, 한국어 text.",
    "tab\there\x00null\x07bell\u200bzero\u00a0nbsp\ufeffbom",
    "x" * 101 + " " + "y" * 100,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "Don't “quote” me — it's 3.14159… (really) [sic] {braces} <tags> #hash $5.00 100%",
    "ＦＵＬＬ ｗｉｄｔｈ ① ² ﬁ ligature ǅ Ǆ",
    "Mixed CASE WoRdS and UPPER lower 12345 a1b2c3",
    "emoji 😀👍🏽 and math ∑∫√ and arrows →←",
    "   leading and trailing whitespace   \n new line \r\n crlf",
]


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def vocab(request, tmp_path_factory):
  """A vocabulary trained here on the built-in corpus plus the hard text."""
  root = tmp_path_factory.mktemp("vocab")
  # The built-in corpus gives real English subwords; the hard text its odd characters.
  texts = list(corpus.iter_texts("default", max_chars=400_000)) + HARD_TEXT * 3
  (root / "train.txt").write_text("\n\n".join(texts), encoding="utf-8")
  path = vocab_lib.train_vocab(str(root / "train.txt"), str(root / "out"), vocab_size=3000,
                               lowercase=request.param, fmt="lines")
  return path, request.param


def _references(path, lowercase):
  from transformers import BertTokenizer  # pylint: disable=g-import-not-at-top
  from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
  return [BertTokenizer(vocab=path, do_lower_case=lowercase),
          BertTokenizerLegacy(path, do_lower_case=lowercase)]


def test_parity_with_transformers_on_hard_text(vocab):
  path, lowercase = vocab
  tok = tokenizer_lib.Tokenizer.from_path(path)
  assert tok.lowercase == lowercase
  ours = tok.encode_batch(HARD_TEXT)
  for ref in _references(path, lowercase):
    theirs = [ref.encode(t, add_special_tokens=False) for t in HARD_TEXT]
    for text, a, b in zip(HARD_TEXT, ours, theirs):
      assert a == b, (type(ref).__name__, text, tok.convert_ids_to_tokens(a),
                      ref.convert_ids_to_tokens(b))
  unk = tok.encode("x" * 101)
  assert unk == [tok.unk_id]
  assert tok.encode(HARD_TEXT[0]) == ours[0]


def test_pre_split_words_match_transformers_is_split_into_words(vocab):
  """WordPiece: CoNLL-style words give the ids of transformers' is_split_into_words=True
  (and of the running text), each word's pieces apart (issue 35 item 2)."""
  path, lowercase = vocab
  tok = tokenizer_lib.Tokenizer.from_path(path)
  ref = _references(path, lowercase)[0]
  for text in HARD_TEXT[:8]:
    words = text.split()
    pieces = tok.encode_words(words)
    flat = [i for p in pieces for i in p]
    assert flat == ref(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
    assert flat == tok.encode(" ".join(words))
    assert pieces == tok.encode_batch(words)


@pytest.mark.data
def test_parity_with_transformers_on_gutenberg(vocab):
  books = sorted(GUTENBERG.glob("pg*.txt"))[:6]
  if not books:
    pytest.skip(f"{GUTENBERG} not present (only on the project's machines)")
  path, lowercase = vocab
  paragraphs = list(corpus.iter_texts(",".join(map(str, books))))[::7][:1500]
  tok = tokenizer_lib.Tokenizer.from_path(path)
  ours = tok.encode_batch(paragraphs)
  for ref in _references(path, lowercase):
    theirs = [ref.encode(p, add_special_tokens=False) for p in paragraphs]
    mismatches = [p for p, a, b in zip(paragraphs, ours, theirs) if a != b]
    assert not mismatches, (type(ref).__name__, mismatches[:3])


def test_special_tokens_and_tables(tmp_path):
  path = testing.write_vocab(str(tmp_path / "vocab.txt"), ["play", "##ing", "the", "[unused0]"])
  tok = tokenizer_lib.Tokenizer.from_path(path)
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.vocab_size == 9 and tok.lowercase  # No upper-case entry: uncased.
  assert tok.convert_ids_to_tokens(tok.encode("Playing the PLAY")) == [
      "play", "##ing", "the", "play"]
  np.testing.assert_array_equal(tok.is_continuation, [0, 0, 0, 0, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(tok.is_special, [1, 1, 1, 1, 1, 0, 0, 0, 1])
  # Text spelling a special token is text, as in google-research/bert.
  assert tok.mask_id not in tok.encode("[MASK]")
  assert tok.decode(tok.encode("playing the")) == "playing the"


def test_vocab_without_special_tokens_is_an_error(tmp_path):
  path = testing.write_vocab(str(tmp_path / "vocab.txt"), ["[PAD]", "[UNK]", "a", "b"],
                             specials=False)
  with pytest.raises(ValueError, match=r"\[CLS\].*\[SEP\].*\[MASK\]"):
    tokenizer_lib.Tokenizer.from_path(path)
  with pytest.raises(FileNotFoundError, match="input_pipeline.vocab"):
    tokenizer_lib.Tokenizer.from_path(str(tmp_path / "missing"))


def test_sentencepiece(tmp_path):
  texts = list(corpus.iter_texts("default", max_chars=300_000))
  (tmp_path / "train.txt").write_text("\n\n".join(texts), encoding="utf-8")
  path = vocab_lib.train_vocab(str(tmp_path / "train.txt"), str(tmp_path / "spm"),
                               vocab_size=1000, kind="sentencepiece", lowercase=True)
  tok = tokenizer_lib.Tokenizer.from_path(str(tmp_path / "spm"))
  assert tok.kind == "sentencepiece" and path.endswith("spm.model")
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  ids = tok.encode("Returning the Values of functions")
  assert ids == tok.encode("returning the values of functions")  # Case folded.
  pieces = tok.convert_ids_to_tokens(ids)
  starts = [p.startswith("\u2581") for p in pieces]
  np.testing.assert_array_equal(tok.is_continuation[ids], np.logical_not(starts))
  assert not {tok.cls_id, tok.sep_id, tok.mask_id} & set(tok.encode("[CLS] [SEP] [MASK]"))
  assert tok.is_special[[0, 1, 2, 3, 4]].all() and tok.is_special.sum() == 5
  assert tok.encode_batch(["a b", "c"]) == [tok.encode("a b"), tok.encode("c")]
  words = "Returning the Values of functions , said he .".split()
  assert [i for p in tok.encode_words(words) for i in p] == tok.encode(" ".join(words))
