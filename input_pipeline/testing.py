"""Tiny corpora and vocabularies for tests (ours and the training loop's), no download.

`make_tagged_corpus` writes a corpus whose every word names its document ("d3w17" is word
17 of document 3), a WordPiece vocabulary holding exactly those words plus the
continuation piece "##sfx" (words written "d3w17sfx" tokenize to two pieces, for
whole-word masking), and the prepared corpus. `token_document` maps token ids back to
documents, so tests can check where each segment came from.
"""
import contextlib
import io
import os
import random

import numpy as np

from common import errors
from input_pipeline import prepare
from input_pipeline import tokenizer as tokenizer_lib

SUFFIX = "sfx"


def write_vocab(path: str, tokens: list[str], *, specials: bool = True) -> str:
  """A WordPiece vocab.txt (special tokens first unless specials=False)."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  entries = (list(tokenizer_lib.SPECIAL_TOKENS) if specials else []) + list(tokens)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(entries) + "\n")
  return path


def tagged_words(num_docs: int, words_per_doc: int) -> list[str]:
  return [f"d{d}w{j}" for d in range(num_docs) for j in range(words_per_doc)]


def make_tagged_corpus(root: str, *, num_docs: int = 12, sentences_per_doc=(5, 40),
                       sentence_words=(3, 30), words_per_doc: int = 50,
                       suffix_prob: float = 0.2, num_shards: int = 4, seed: int = 0) -> dict:
  """Writes root/{corpus.txt, vocab/vocab.txt, prepared/}; returns their paths and sizes."""
  rng = random.Random(seed)
  os.makedirs(root, exist_ok=True)
  lines = []
  for d in range(num_docs):
    for _ in range(rng.randint(*sentences_per_doc)):
      words = [f"d{d}w{rng.randrange(words_per_doc)}" for _ in range(
          rng.randint(*sentence_words))]
      words = [w + SUFFIX if rng.random() < suffix_prob else w for w in words]
      lines.append(" ".join(words))
    lines.append("")
  corpus = os.path.join(root, "corpus.txt")
  with open(corpus, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  vocab = write_vocab(os.path.join(root, "vocab", tokenizer_lib.WORDPIECE_FILE),
                      tagged_words(num_docs, words_per_doc) + ["##" + SUFFIX])
  tokenizer_lib.write_tokenizer_config(os.path.dirname(vocab), "wordpiece", True)
  prepared = os.path.join(root, "prepared")
  summary = prepare.prepare_corpus(corpus, vocab, prepared, num_shards=num_shards,
                                   num_workers=1, fmt="lines", progress=False)
  return {"corpus": corpus, "vocab": vocab, "prepared": prepared, "summary": summary,
          "num_docs": num_docs, "words_per_doc": words_per_doc}


def token_document(ids, num_docs: int, words_per_doc: int) -> np.ndarray:
  """Document of each token id of a tagged corpus; -1 for specials and "##sfx"."""
  ids = np.asarray(ids)
  first = len(tokenizer_lib.SPECIAL_TOKENS)
  doc = (ids - first) // words_per_doc
  return np.where((ids >= first) & (doc < num_docs), doc, -1)


def refusal(main, argv: list[str]) -> str:
  """`main(argv)` run as its command line runs it (errors.reported), in this process: the
  one line it prints for a refused input. AssertionError unless it exits with status 2
  after exactly that line on stderr (any other exception propagates, traceback and all)."""
  stderr = io.StringIO()
  with contextlib.redirect_stderr(stderr):
    try:
      errors.reported(main)(argv)
      code = 0
    except SystemExit as e:
      code = e.code
  lines = stderr.getvalue().splitlines()
  assert code == 2 and len(lines) == 1, (code, lines)
  assert ": error: " in lines[0], lines
  return lines[0]
