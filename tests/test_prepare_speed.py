"""The fast prepare path gives byte for byte what the straightforward one gave.

References kept here, as they were before the speed-up: the regex sentence splitter with its
character loop for abbreviations, the tokenizer's Rust `encode_batch` per sentence and the
per-sentence flattening of `tokenize_documents`, and the round-robin layout of the arrays
written with np.save. The fast code is compared against them on small corpora (lines and
paragraphs formats, Gutenberg markers, unicode, empty documents, abbreviations) and on
random text made of the characters where a shortcut could go wrong.
"""
import itertools
import json
import os
import random
import re

import numpy as np
import pytest

from input_pipeline import corpus
from input_pipeline import prepare
from input_pipeline import sentences
from input_pipeline import store
from input_pipeline import testing
from input_pipeline import tokenizer as tokenizer_lib

# ---------------------------------------------------------------- reference: old splitter

_OLD_BOUNDARY = re.compile(r"[.!?…]+[\"'”’)\]]*\s+(?=[\"'“‘(\[]*[^\W_a-z])")
_OLD_INITIAL = re.compile(r"[^\W\d_]")
_OLD_DOTTED = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")


def _old_is_abbreviation(text, stop, next_char):
  start = stop
  while start > 0 and not text[start - 1].isspace() and text[start - 1] not in "(\"'“‘[":
    start -= 1
  word = text[start:stop]
  if not word:
    return False
  word = word.lower()
  return (word in sentences.ABBREVIATIONS or (
      word in sentences.NUMBER_ABBREVIATIONS and next_char.isdigit())
          or bool(_OLD_INITIAL.fullmatch(word)) or bool(_OLD_DOTTED.fullmatch(word)))


def old_split_sentences(paragraph):
  out, start = [], 0
  for match in _OLD_BOUNDARY.finditer(paragraph):
    punct = match.group(0).rstrip()
    if punct[0] == "." and len(punct.rstrip("\"'”’)]")) == 1 and _old_is_abbreviation(
        paragraph, match.start(), paragraph[match.end()]):
      continue
    sentence = paragraph[start:match.end()].strip()
    if sentence:
      out.append(sentence)
    start = match.end()
  rest = paragraph[start:].strip()
  if rest:
    out.append(rest)
  return out


def old_document_sentences(doc):
  if not doc["split"]:
    return list(doc["texts"])
  return [s for paragraph in doc["texts"] for s in old_split_sentences(paragraph)]


# ------------------------------------------------------- reference: old tokenize + layout


def old_tokenize_documents(docs, tok):
  per_doc = [old_document_sentences(d) for d in docs]
  flat = [s for sents in per_doc for s in sents]
  ids = tok.encode_batch(flat) if flat else []
  kept, doc_sentences, empty, pos = [], [], 0, 0
  for sents in per_doc:
    doc = [s for s in ids[pos:pos + len(sents)] if s]
    pos += len(sents)
    if not doc:
      empty += 1
      continue
    kept.extend(doc)
    doc_sentences.append(len(doc))
  lengths = np.array([len(s) for s in kept], np.int64)
  tokens = np.fromiter((t for s in kept for t in s), np.int64, int(lengths.sum()))
  return {"tokens": tokens, "sentence_lengths": lengths,
          "document_sentences": np.array(doc_sentences, np.int64),
          "sentences": len(kept), "tokens_count": len(tokens),
          "unk_tokens": int(np.count_nonzero(tokens == tok.unk_id)), "empty_documents": empty}


def golden_prepare(spec, vocab, out_dir, num_shards, fmt="auto"):
  """The prepared arrays (np.save) and counts, from the references: document g of the
  corpus (empty ones dropped) goes to shard g % num_shards, shards stored in order."""
  tok = tokenizer_lib.Tokenizer.from_path(vocab)
  docs = list(corpus.iter_documents(spec, fmt=fmt))
  res = old_tokenize_documents(docs, tok)
  starts = np.concatenate([[0], np.cumsum(res["sentence_lengths"])])
  doc_starts = np.concatenate([[0], np.cumsum(res["document_sentences"])])
  documents = [(res["tokens"][starts[doc_starts[g]]:starts[doc_starts[g + 1]]],
                res["sentence_lengths"][doc_starts[g]:doc_starts[g + 1]])
               for g in range(len(res["document_sentences"]))]
  order = [g for s in range(num_shards) for g in range(s, len(documents), num_shards)]
  tokens = np.concatenate([documents[g][0] for g in order]).astype(
      store.token_dtype(tok.vocab_size))
  lengths = np.concatenate([documents[g][1] for g in order])
  per_doc = np.array([len(documents[g][1]) for g in order], np.int64)
  os.makedirs(out_dir, exist_ok=True)
  np.save(os.path.join(out_dir, store.TOKENS), tokens)
  np.save(os.path.join(out_dir, store.SENTENCES), np.concatenate([[0], np.cumsum(lengths)]))
  np.save(os.path.join(out_dir, store.DOCUMENTS), np.concatenate([[0], np.cumsum(per_doc)]))
  counts = {k: res[k] for k in ("sentences", "unk_tokens", "empty_documents")}
  counts.update(documents=len(documents), tokens=res["tokens_count"],
                shard_documents=[len(range(s, len(documents), num_shards))
                                 for s in range(num_shards)])
  return counts


# ------------------------------------------------------------------------- test corpora

WORDS = ("the a an of and to in mr mrs dr st no vol fig it was he she said said: yes "
         "e.g i.e u.s etc j r tolkien smith brown london caf cafe naive ##e ##s ##ed ##ing "
         "##ly 3 14 42 2024 ##0 ##1 chapter one two book end start rain ##ed home "
         "walk ##er über gar ##con dans le ça σ ς οδος 中 文 日 ##本").split()
CHARS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
             ".,;:!?'\"()[]{}-_/\\*&%$#@^~`|<>+=…“”‘’—–«»¡¿éèçñüßøİıΣσςäö中文日本")


def _vocab(path, lowercase=True):
  words = [w for w in dict.fromkeys(WORDS + CHARS + ["##" + c for c in CHARS if c.isalnum()])]
  if lowercase:
    words = [w for w in dict.fromkeys(w.lower() for w in words)]
  vocab = testing.write_vocab(path, words)
  tokenizer_lib.write_tokenizer_config(os.path.dirname(vocab), "wordpiece", lowercase)
  return vocab


PARAGRAPHS = [
    "Mr. Smith went to London. He said: \"Yes!\" She left... Then it rained.",
    "See e.g. the U.S. Army. J. R. R. Tolkien wrote it. No. 5 is here. No. It is not.",
    "Vol. 2 and fig. 3. Dr. Brown (St. Louis) arrived. ‘Quoted.’ “Again.” (Bracket.) [End.]",
    "It costs 3.14 dollars. Wait!? What?! Done… Next one. İstanbul. Σ. ΟΔΟΣ ΟΔΟΣ. Über alles.",
    "Tabs\there.\tAnd nbsp\u00a0here. Ideographic\u3000space. Control\x1cchar. Zero\u200bwidth.",
    "Accents: café naïve garçon. Combining: cafe\u0301 e\u0301\u0323 \u0f73x. CJK: 中文日本 ok.",
    "Replaced \ufffd byte. NUL \x00 char. Emoji 😀 here. A" + "b" * 120 + " long word.",
    "[MASK] is written. ##ing alone. a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z. "
    "Next sentence. " + "x" * 60 + "a.b. Then.",
    "Double  spaces  here.  And   triple. Trailing space. ",
    "Runs: Mr.. Smith. J... Next. Dr.! Who. e.g.? Yes. etc. Done. vol.. 3. No.\" 4.",
]


def _write_corpora(root):
  """Text files in every format prepare reads, with the cases above."""
  root.mkdir(parents=True, exist_ok=True)
  gutenberg = ("Produced by nobody\r\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\r\n\r\n"
               + "\r\n".join(p[i:i + 50] for p in PARAGRAPHS for i in range(0, len(p), 50))
               + "\r\n\r\n" + "\r\n\r\n".join(PARAGRAPHS) +
               "\r\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\r\nlicense text.\r\n")
  (root / "a_book.txt").write_bytes(gutenberg.encode("utf-8"))
  lines = "\n".join(s for p in PARAGRAPHS for s in old_split_sentences(p))
  (root / "b_lines.txt").write_text(
      lines + "\n\n\ufffd.\n\n" + "\n\n".join(PARAGRAPHS) + "\n\n\x00\n\n" + lines + ".\n",
      encoding="utf-8")  # Documents with no tokens ("\ufffd.", NUL) in the middle.
  (root / "c_paragraphs.txt").write_text("\n\n".join(PARAGRAPHS * 3), encoding="utf-8")
  (root / "d_empty.txt").write_text("\ufffd\n\x00\n", encoding="utf-8")  # No tokens at all.
  rng = random.Random(1)
  (root / "e_random.txt").write_text(
      "\n\n".join(_random_text(rng, 400) for _ in range(30)), encoding="utf-8")
  return str(root / "*.txt")


_FUZZ = (CHARS + [" "] * 20 + [". ", "! ", "? ", "… ", ".. ", "... ", ".! ", ".? ", ".\" ", ".’ ", ". (", "Mr. ", "e.g. ",
                             "No. 7", "J. ", "U.S. ", "\t", "\u00a0", "\u3000", "\x1c",
                             "\x00", "\ufffd", "\u0301", "\u0323", "\u0f73", "İ", "ΟΔΟΣ ",
                             "\r", "\n", "  ", "##", "[MASK]", "😀", "\u200b"] + WORDS * 2)


def _random_text(rng, n):
  return "".join(rng.choice(_FUZZ) if rng.random() < 0.5 else rng.choice(WORDS) + " "
                 for _ in range(n))


# --------------------------------------------------------------------------------- tests


def test_split_sentences_matches_the_reference():
  rng = random.Random(0)
  texts = PARAGRAPHS + [_random_text(rng, rng.randint(1, 80)) for _ in range(3000)]
  texts += ["", " ", ".", ". A", "a. B", "x" * 100 + ". A", "(" + "a." * 40 + "b. C",
            "\u00a0" * 3 + "Mr.\u00a0Smith. No.\t5 and no. 6. Vol. X."]
  for text in texts:
    assert sentences.split_sentences(text) == old_split_sentences(text), repr(text)
    for stop in [m.start() for m in re.finditer(r"\.", text)]:
      nxt = text[stop + 1] if stop + 1 < len(text) else ""
      assert sentences._is_abbreviation(text, stop, nxt) == _old_is_abbreviation(
          text, stop, nxt), (text, stop)


def test_split_sentences_can_fail():
  """The comparison above sees a change of behaviour: an abbreviation dropped."""
  assert old_split_sentences("Mr. Smith left.") == ["Mr. Smith left."]
  assert sentences.split_sentences("Mr. Smith left.") == ["Mr. Smith left."]
  assert old_split_sentences("Mrx. Smith left.") == ["Mrx.", "Smith left."]


@pytest.mark.parametrize("lowercase", [True, False])
def test_encode_flat_matches_encode_batch(tmp_path, lowercase):
  tok = tokenizer_lib.Tokenizer.from_path(_vocab(str(tmp_path / "v" / "vocab.txt"), lowercase))
  assert tok._chunks is not None  # The table path is the one under test.
  rng = random.Random(2 + lowercase)
  texts = PARAGRAPHS + [s for p in PARAGRAPHS for s in old_split_sentences(p)]
  texts += [_random_text(rng, rng.randint(0, 60)) for _ in range(1500)]
  texts += ["", " ", "\n", "a\nb", " \n ", "\x00", "\ufffd", "a" * 100, "a" * 101, "é" * 101]
  for batch in (texts[:7], texts, texts[::-1], ["\n"], [""], texts[5:6]):
    want = tok.encode_batch(batch)
    tokens, lengths = tok.encode_flat(batch)
    assert lengths.tolist() == [len(w) for w in want]
    assert tokens.tolist() == [i for w in want for i in w]
  # A table that restarts between calls (its size limit) gives the same ids.
  tok._chunks.max_rows = 50
  for start in range(0, 600, 37):
    batch = texts[start:start + 37]
    tokens, lengths = tok.encode_flat(batch)
    assert tokens.tolist() == [i for w in tok.encode_batch(batch) for i in w]
  assert len(tok._chunks.ids) < 1000


def test_encode_flat_can_fail(tmp_path):
  """A table entry with wrong ids would be seen: the comparison is not vacuous."""
  tok = tokenizer_lib.Tokenizer.from_path(_vocab(str(tmp_path / "v" / "vocab.txt")))
  tok.encode_flat(["the cafe"])
  row = tok._chunks.rows["cafe"]
  tok._chunks.flat[tok._chunks.starts[row]] = tok.unk_id
  tokens, _ = tok.encode_flat(["the cafe"])
  assert tokens.tolist() != [i for w in tok.encode_batch(["the cafe"]) for i in w]


def _files(d):
  return {n: open(os.path.join(d, n), "rb").read() for n in store.FILES}


@pytest.mark.parametrize("fmt,num_shards", [("auto", 3), ("lines", 2), ("paragraphs", 5)])
def test_prepare_is_byte_identical_to_the_reference(tmp_path, monkeypatch, fmt, num_shards):
  spec = _write_corpora(tmp_path / "corpus")
  vocab = _vocab(str(tmp_path / "vocab" / "vocab.txt"))
  want = golden_prepare(spec, vocab, str(tmp_path / "golden"), num_shards, fmt)
  assert want["empty_documents"] >= (2 if fmt == "lines" else 1)
  assert want["documents"] >= 4 and want["unk_tokens"] > 0
  monkeypatch.setattr(prepare, "_TASK_CHARS", 700)  # Many tasks: dealing across them.
  out = str(tmp_path / "prepared")
  summary = prepare.prepare_corpus(spec, vocab, out, num_shards=num_shards, num_workers=1,
                                   fmt=fmt, progress=False)
  assert _files(out) == _files(str(tmp_path / "golden"))
  assert {k: summary[k] for k in want} == want
  assert json.load(open(os.path.join(out, prepare.SUMMARY_NAME)))["tokens"] == want["tokens"]


def test_prepare_with_workers_is_byte_identical_to_the_reference(tmp_path, monkeypatch):
  spec = _write_corpora(tmp_path / "corpus")
  vocab = _vocab(str(tmp_path / "vocab" / "vocab.txt"))
  want = golden_prepare(spec, vocab, str(tmp_path / "golden"), 4)
  monkeypatch.setattr(prepare, "_TASK_CHARS", 2000)
  out = str(tmp_path / "prepared")
  summary = prepare.prepare_corpus(spec, vocab, out, num_shards=4, num_workers=2,
                                   progress=False)
  assert _files(out) == _files(str(tmp_path / "golden"))
  assert {k: summary[k] for k in want} == want


def test_tokenize_documents_matches_the_reference(tmp_path):
  spec = _write_corpora(tmp_path / "corpus")
  tok = tokenizer_lib.Tokenizer.from_path(_vocab(str(tmp_path / "vocab" / "vocab.txt")))
  docs = list(corpus.iter_documents(spec))
  docs.insert(1, {"texts": [], "split": True})
  docs.append({"texts": ["\ufffd", ""], "split": False})
  for task in (docs, docs[:1], docs[-1:], docs[2:5]):
    got, want = prepare.tokenize_documents(task, tok), old_tokenize_documents(task, tok)
    assert set(got) == set(want)
    for key, value in want.items():
      if isinstance(value, np.ndarray):
        assert got[key].tolist() == value.tolist(), key
        assert got[key].dtype.kind == value.dtype.kind or key == "tokens"
      else:
        assert got[key] == value, key
  assert prepare.tokenize_documents([], tok)["tokens"].tolist() == []
  assert list(itertools.islice(prepare._tasks(docs), 1))
