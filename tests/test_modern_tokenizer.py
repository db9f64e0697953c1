"""The modern encoders' own tokenizers (a HuggingFace tokenizer.json: byte-level BPE with
ModernBERT's or EuroBERT's special tokens) read by input_pipeline.tokenizer: ids identical
to `transformers.AutoTokenizer.from_pretrained(dir)` for single texts, pairs and written
mask tokens, on the built-in texts and (when ../shared/data is present) the CoLA sentences."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from input_pipeline import builtin_corpus
from input_pipeline import features
from input_pipeline import tagging
from input_pipeline import tokenizer as tokenizer_lib
from tests.test_hf_tokenizer import SENTENCES, _real_text

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

# name -> (cls, sep, pad, unk, mask, tokenizer_config extras)
STYLES = {
    "modernbert": ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]", {}),
    "eurobert": ("<|begin_of_text|>", "<|end_of_text|>", "<|end_of_text|>", None, "<|mask|>",
                 {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
}


def _texts() -> list[str]:
  texts = [t for _, t in builtin_corpus.builtin_texts()[:40]]
  return [" ".join(t.split()[:60]) for t in texts if t.strip()]


def make_bpe_dir(root, style: str = "modernbert", vocab_size: int = 600) -> str:
  """A tokenizer directory as the Hub ships a ModernBERT / EuroBERT one: tokenizer.json
  (byte-level BPE, the special tokens added, a cls-A-sep(-B-sep) template) and
  tokenizer_config.json naming the special tokens."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # pylint: disable=g-import-not-at-top
  cls, sep, pad, unk, mask, extra = STYLES[style]
  specials = list(dict.fromkeys(t for t in (cls, sep, pad, unk, mask) if t))
  tok = Tokenizer(models.BPE(unk_token=unk))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_texts() + SENTENCES, trainer)
  tok.add_special_tokens([AddedToken(t, special=True, lstrip=t == mask, normalized=False)
                          for t in specials])
  ids = {t: tok.token_to_id(t) for t in specials}
  tok.post_processor = processors.TemplateProcessing(
      single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
      special_tokens=[(cls, ids[cls]), (sep, ids[sep])])
  d = root / f"{style}-tokenizer"
  d.mkdir()
  tok.save(str(d / "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": cls, "sep_token": sep,
            "pad_token": pad, "mask_token": mask, "model_max_length": 8192, **extra}
  if unk:
    config["unk_token"] = unk
  (d / "tokenizer_config.json").write_text(json.dumps(config))
  return str(d)


@pytest.mark.parametrize("style", sorted(STYLES))
def test_ids_identical_to_autotokenizer(tmp_path, style):
  d = make_bpe_dir(tmp_path, style)
  ours = tokenizer_lib.Tokenizer.from_path(d)
  ref = transformers.AutoTokenizer.from_pretrained(d)
  assert ours.kind == "hf"
  assert (ours.cls_id, ours.sep_id, ours.mask_id) == (
      ref.cls_token_id if ref.cls_token_id is not None else ref.bos_token_id,
      ref.sep_token_id if ref.sep_token_id is not None else ref.eos_token_id,
      ref.mask_token_id)
  texts = _texts() + SENTENCES + _real_text()[:2000]
  for text, ids in zip(texts, ours.encode_batch(texts)):
    assert features.encode_pair(ours, ids)[0] == ref(text)["input_ids"], text
  for a, b in zip(texts[::2], texts[1::2]):
    pair = features.encode_pair(ours, ours.encode(a), ours.encode(b))[0]
    assert pair == ref(a, b)["input_ids"], (a, b)
  masked = f"Paris is the {ours.mask_text} of France."
  assert features.encode_pair(ours, ours.encode(masked))[0] == ref(masked)["input_ids"]
  assert ours.mask_id in ours.encode(masked)
  assert ours.is_special[[ours.cls_id, ours.sep_id, ours.mask_id, ours.pad_id]].all()
  assert ours.decode(ours.encode(texts[0])) == ref.decode(ref(texts[0], add_special_tokens=False)["input_ids"])


def test_a_template_other_than_berts_is_refused(tmp_path):
  from tokenizers import Tokenizer, processors  # pylint: disable=g-import-not-at-top
  d = make_bpe_dir(tmp_path)
  tok = Tokenizer.from_file(f"{d}/tokenizer.json")
  cls = tok.token_to_id("[CLS]")
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A", pair="[CLS] $A [CLS] $B", special_tokens=[("[CLS]", cls)])
  tok.save(f"{d}/tokenizer.json")
  with pytest.raises(tokenizer_lib.VocabularyError, match="cls A sep B sep"):
    tokenizer_lib.Tokenizer.from_path(d)


def test_byte_level_continuations_and_specials(tmp_path):
  ours = tokenizer_lib.Tokenizer.from_path(make_bpe_dir(tmp_path))
  ids = ours.encode("internationalization of everything")
  pieces = ours.convert_ids_to_tokens(ids)
  starts = [not c for c in ours.is_continuation[ids]]
  # Byte-level BPE marks a word start with "Ġ" (a text's first word has none: the table is
  # per token, so whole-word masking sees it as continuing the text before it).
  assert starts == [p.startswith("\u0120") for p in pieces] and sum(starts) == 2, pieces


CONLL_WORDS = [["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
               ["Peter", "Blackburn"], ["BRUSSELS", "1996-08-22"],
               ["The", "European", "Commission", "said", "on", "Thursday", "it", "disagreed",
                "with", "German", "advice", "to", "consumers", "to", "shun", "British", "lamb",
                "until", "scientists", "determine", "whether", "mad", "cow", "disease", "can",
                "be", "transmitted", "to", "sheep", "."]]


def _with_prefix_space(d: str) -> str:
  """The same tokenizer with ByteLevel(add_prefix_space=True), as RoBERTa-style files set it."""
  data = json.loads((pathlib.Path(d) / "tokenizer.json").read_text())
  data["pre_tokenizer"]["add_prefix_space"] = True
  (pathlib.Path(d) / "tokenizer.json").write_text(json.dumps(data))
  return d


@pytest.mark.parametrize("style,prefix_space", [("modernbert", False), ("eurobert", False),
                                                ("modernbert", True)])
def test_pre_split_words_are_tokenized_as_in_running_text(tmp_path, style, prefix_space):
  """CoNLL words fed to a byte-level BPE model keep their leading space (issue 35 item 2):
  `encode_conll`'s ids are transformers' ids of the sentence as running text, and
  transformers' own `is_split_into_words=True` ids of the words as they stand in that text
  (each word after the first with its space; with a prefix-space tokenizer, every word)."""
  d = make_bpe_dir(tmp_path, style)
  if prefix_space:
    _with_prefix_space(d)
  ours = tokenizer_lib.Tokenizer.from_path(d)
  ref = transformers.AutoTokenizer.from_pretrained(d)
  sentences = [(words, ["O"] * len(words)) for words in CONLL_WORDS]
  feats = tagging.encode_conll(sentences, ours, 256, ["O"])
  for row, (words, _) in enumerate(sentences):
    n = int(feats["input_mask"][row].sum())
    got = feats["input_ids"][row, :n].tolist()
    assert got == ref(" ".join(words))["input_ids"], words
    spaced = [w if i == 0 else " " + w for i, w in enumerate(words)]
    assert got == ref(spaced, is_split_into_words=True)["input_ids"], words
    # The label of each word sits on its first token, as in transformers' word_ids().
    word_ids = ref(spaced, is_split_into_words=True).word_ids()
    firsts = [i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)]
    assert np.flatnonzero(feats["label_weights"][row]).tolist() == firsts
    assert feats["word_index"][row, firsts].tolist() == list(range(len(words)))
  if not prefix_space:  # what the defect fed: bare words lose the space they have in text
    bare = ref(CONLL_WORDS[0], is_split_into_words=True)["input_ids"]
    assert feats["input_ids"][0, :len(bare)].tolist() != bare
