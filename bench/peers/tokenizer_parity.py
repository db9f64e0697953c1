r"""Tokenizer parity with transformers on real text, for HuggingFace-style vocabulary dirs.

    python -m bench.peers.tokenizer_parity [--vocab_size=30522] [--data=../shared/data]

Trains an uncased and a cased WordPiece vocabulary on Gutenberg books (pg1*.txt), adds letters
that `str.isupper()` calls upper-case but that have no lower-case form ("ℝ", "ℂ", as in
bert-base-uncased's vocab.txt) to the uncased one, and writes each as a model directory the
way the Hub ships it (vocab.txt + tokenizer_config.json with do_lower_case). Then, on every
CoLA sentence (train + dev), compares with `transformers.AutoTokenizer.from_pretrained(dir)`:
  - bert_jax as it reads the directory now;
  - the rule bert_jax used before issue 11 ("uncased iff no vocab entry has an upper-case
    letter", tokenizer_config.json ignored), reproduced here as an explicit `lowercase`.
Prints the share of sentences and tokens whose ids differ. Needs ../shared/data.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

from input_pipeline import tokenizer as tokenizer_lib
from input_pipeline import vocab as vocab_lib

from bench import harness


def cola_sentences(data: pathlib.Path) -> list[str]:
  out = []
  for name in ("in_domain_train.tsv", "in_domain_dev.tsv", "out_of_domain_dev.tsv"):
    out += [line.split("\t")[3] for line in
            (data / "cola" / "raw" / name).read_text(encoding="utf-8").splitlines()
            if line.count("\t") >= 3]
  return out


def old_rule_lowercase(tokens: list[str]) -> bool:
  return not any(c.isupper() for t in tokens if t not in tokenizer_lib.SPECIAL_TOKENS for c in t)


def compare(tok, ref, texts) -> dict[str, float]:
  ours = tok.encode_batch(texts)
  theirs = ref(texts, add_special_tokens=False)["input_ids"]
  diff_sent = sum(a != b for a, b in zip(ours, theirs))
  total_tok = sum(len(b) for b in theirs)
  diff_tok = sum(sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
                 for a, b in zip(ours, theirs))
  return {"sentences_differ": diff_sent / len(texts), "tokens_differ": diff_tok / total_tok,
          "sentences": len(texts)}


def main() -> None:
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--vocab_size", type=int, default=30522)
  parser.add_argument("--data", default=str(pathlib.Path(harness.REPO).parent / "shared" / "data"))
  args = parser.parse_args()
  data = pathlib.Path(args.data)
  texts = cola_sentences(data)
  root = pathlib.Path(tempfile.mkdtemp())
  corpus = str(data / "gutenberg" / "pg1*.txt")  # about a third of the books
  for name, lowercase in (("uncased", True), ("cased", False)):
    t0 = time.time()
    path = vocab_lib.train_vocab(corpus, str(root / f"train_{name}"), vocab_size=args.vocab_size,
                                 lowercase=lowercase)
    tokens = pathlib.Path(tokenizer_lib.resolve_vocab_path(path)[1]).read_text(encoding="utf-8").splitlines()
    if lowercase:
      tokens += ["ℝ", "ℂ"]
    d = root / name
    d.mkdir()
    (d / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lowercase,
                                                         "model_max_length": 512}))
    (d / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": len(tokens)}))
    ref = AutoTokenizer.from_pretrained(str(d))
    now = compare(tokenizer_lib.Tokenizer.from_path(str(d)), ref, texts)
    before = compare(tokenizer_lib.Tokenizer.from_path(str(d), lowercase=old_rule_lowercase(tokens)),
                     ref, texts)
    bare = tokenizer_lib.wordpiece_normalization(str(root / "bare" / "vocab.txt"), tokens)  # no config
    print(json.dumps({"vocab": name, "entries": len(tokens), "build_s": round(time.time() - t0, 1),
                      "bare_vocab_rule": bare.reason,
                      "old_rule_lowercase": old_rule_lowercase(tokens),
                      "before_fix": before, "after_fix": now}))


if __name__ == "__main__":
  main()
