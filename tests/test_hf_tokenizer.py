"""Vocabularies as HuggingFace ships them: bert_jax tokenizes exactly as
`transformers.AutoTokenizer.from_pretrained(dir)` on real text (issue 11)."""
import json
import logging
import os
import pathlib
import shutil

import pytest

from input_pipeline import corpus
from input_pipeline import tokenizer as tokenizer_lib
from input_pipeline import vocab as vocab_lib
from tests.test_tokenizer import HARD_TEXT

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"

# Capitals, accents, CJK: what an uncased vocabulary read as cased gets wrong.
SENTENCES = [
    "The Quick Brown Fox jumps over the lazy dog in Paris, France.",
    "Émile Zola wrote Germinal; Ångström measured light. Café au lait, naïve résumé.",
    "東京は日本の首都です。北京是中国的首都。 Mixed 中文 and English.",
    "NASA and the U.S.A. signed it on Monday, 3 March 1969 (UTC).",
    "Über straße façade coöperate ÉCOLE Ñandú Œuvre",
    "ℝ is the set of real numbers and ℂ the complex ones.",
]


def _real_text() -> list[str]:
  """CoLA sentences and Gutenberg paragraphs when ../shared/data is present."""
  texts = []
  for name in ("in_domain_train.tsv", "in_domain_dev.tsv", "out_of_domain_dev.tsv"):
    path = DATA / "cola" / "raw" / name
    if path.exists():
      texts += [line.split("\t")[3] for line in path.read_text(encoding="utf-8").splitlines()
                if line.count("\t") >= 3]
  for book in sorted((DATA / "gutenberg").glob("pg*.txt"))[:3]:
    body = book.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    texts += [" ".join(p.split()) for p in body.split("\n\n")[200:1200] if p.strip()]
  return texts


def _hf_dir(root, name: str, vocab_file: str, tokenizer_config: dict | None,
            extra_tokens=()) -> str:
  """A model directory as the Hub ships one: config.json, vocab.txt, tokenizer_config.json."""
  d = root / name
  d.mkdir()
  tokens = pathlib.Path(vocab_file).read_text(encoding="utf-8").splitlines()
  tokens += [t for t in extra_tokens if t not in tokens]  # each token once, as in a real vocab
  (d / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
  (d / "config.json").write_text(json.dumps({
      "architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": len(tokens),
      "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
      "intermediate_size": 64}))
  if tokenizer_config is not None:
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "model_max_length": 512, **tokenizer_config}))
  return str(d)


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
  """An uncased and a cased WordPiece vocabulary trained here (built-in corpus + odd text)."""
  root = tmp_path_factory.mktemp("hf_vocabs")
  texts = list(corpus.iter_texts("default", max_chars=300_000)) + (HARD_TEXT + SENTENCES) * 3
  (root / "train.txt").write_text("\n\n".join(texts), encoding="utf-8")
  out = {}
  for name, lowercase in (("uncased", True), ("cased", False)):
    path = vocab_lib.train_vocab(str(root / "train.txt"), str(root / name), vocab_size=2000,
                                 lowercase=lowercase, fmt="lines")
    out[name] = tokenizer_lib.resolve_vocab_path(path)[1]
  out["root"] = root
  return out


def _assert_same_ids(tok, reference, texts):
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  if isinstance(reference, str):
    reference = AutoTokenizer.from_pretrained(reference)
  ours = tok.encode_batch(texts)
  theirs = [e for e in reference(texts, add_special_tokens=False)["input_ids"]]
  differ = [(t, tok.convert_ids_to_tokens(a), reference.convert_ids_to_tokens(b))
            for t, a, b in zip(texts, ours, theirs) if a != b]
  assert not differ, f"{len(differ)} of {len(texts)} texts differ, e.g. {differ[:3]}"


@pytest.mark.parametrize("kind", ["uncased", "cased"])
def test_hf_directory_tokenizes_as_transformers(vocabs, tmp_path, kind):
  """An uncased vocab holding "ℝ" (upper-case to str.isupper) with do_lower_case=true is
  uncased; a cased one with do_lower_case=false is cased; dir and file give one result."""
  lowercase = kind == "uncased"
  # ℝ/ℂ: letters str.isupper() calls upper-case; the uncased vocab has only lower-case words.
  d = _hf_dir(tmp_path, kind, vocabs[kind], {"do_lower_case": lowercase},
              extra_tokens=("ℝ", "ℂ") if lowercase else ())
  texts = SENTENCES + HARD_TEXT + _real_text()
  tok = tokenizer_lib.Tokenizer.from_path(d)
  assert tok.lowercase is lowercase
  _assert_same_ids(tok, d, texts)
  by_file = tokenizer_lib.Tokenizer.from_path(os.path.join(d, "vocab.txt"))
  assert by_file.path == tok.path and by_file.sha256 == tok.sha256
  assert by_file.encode_batch(texts) == tok.encode_batch(texts)


@pytest.mark.parametrize("settings", [
    {"do_lower_case": True, "strip_accents": False},
    {"do_lower_case": False, "strip_accents": True},
    {"do_lower_case": False, "tokenize_chinese_chars": False},
], ids=["uncased_keep_accents", "cased_strip_accents", "no_cjk_split"])
def test_hf_normalization_settings_are_honoured(vocabs, tmp_path, settings):
  d = _hf_dir(tmp_path, "model", vocabs["uncased" if settings["do_lower_case"] else "cased"],
              settings)
  tok = tokenizer_lib.Tokenizer.from_path(d)
  _assert_same_ids(tok, d, SENTENCES + HARD_TEXT)


def test_bare_vocab_casing_rule(vocabs, tmp_path, caplog):
  """No tokenizer_config.json: an uncased vocabulary with a few letters like "ℝ" reads as
  uncased, a cased one as cased; the decision is logged once, with its reason."""
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  caplog.set_level(logging.INFO)
  uncased = _hf_dir(tmp_path, "uncased", vocabs["uncased"], None, extra_tokens=("ℝ", "ℂ", "Ω"))
  cased = _hf_dir(tmp_path, "cased", vocabs["cased"], None)
  tok = tokenizer_lib.Tokenizer.from_path(uncased)
  assert tok.lowercase is True
  _assert_same_ids(tok, uncased, SENTENCES + HARD_TEXT)  # transformers' default: lower-case
  tokenizer_lib.Tokenizer.from_path(uncased)
  logged = [r.getMessage() for r in caplog.records if "uncased (lower-case)" in r.getMessage()
            and uncased in r.getMessage()]
  assert len(logged) == 1 and "upper-case letters" in logged[0], logged
  tok = tokenizer_lib.Tokenizer.from_path(cased)
  assert tok.lowercase is False
  _assert_same_ids(tok, AutoTokenizer.from_pretrained(cased, do_lower_case=False),
                   SENTENCES + HARD_TEXT)


def test_explicit_lowercase_overrides_the_directory(vocabs, tmp_path):
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  d = _hf_dir(tmp_path, "uncased", vocabs["uncased"], {"do_lower_case": True})
  tok = tokenizer_lib.Tokenizer.from_path(d, lowercase=False)
  assert tok.lowercase is False
  _assert_same_ids(tok, AutoTokenizer.from_pretrained(d, do_lower_case=False), SENTENCES)


def test_tokenizer_json_normalizer_is_read(vocabs, tmp_path):
  """A directory whose only casing information is tokenizer.json follows its
  BertNormalizer, as the `tokenizers` library does with that file."""
  from tokenizers import Tokenizer as RustTokenizer  # pylint: disable=g-import-not-at-top
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  d = _hf_dir(tmp_path, "cased", vocabs["cased"], {"do_lower_case": False, "strip_accents": True})
  AutoTokenizer.from_pretrained(d).save_pretrained(d)
  os.remove(os.path.join(d, "tokenizer_config.json"))
  tok = tokenizer_lib.Tokenizer.from_path(d)
  assert tok.lowercase is False and tok.normalization.strip_accents is True
  reference = RustTokenizer.from_file(os.path.join(d, "tokenizer.json"))
  texts = SENTENCES + HARD_TEXT
  assert tok.encode_batch(texts) == [
      e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]


def test_our_vocabulary_directory_loads_in_transformers(vocabs, tmp_path):
  """A cased vocabulary written by input_pipeline.vocab says do_lower_case=false, so
  AutoTokenizer reads it as bert_jax does (it lower-cases when the key is missing)."""
  d = tmp_path / "ours"
  shutil.copytree(os.path.dirname(vocabs["cased"]), d)
  (d / "config.json").write_text(json.dumps({"model_type": "bert"}))
  tok = tokenizer_lib.Tokenizer.from_path(str(d))
  assert tok.lowercase is False
  _assert_same_ids(tok, str(d), SENTENCES + HARD_TEXT)


def test_do_basic_tokenize_false_is_refused(vocabs, tmp_path):
  d = _hf_dir(tmp_path, "m", vocabs["uncased"], {"do_lower_case": True, "do_basic_tokenize": False})
  with pytest.raises(ValueError, match="do_basic_tokenize"):
    tokenizer_lib.Tokenizer.from_path(d)
