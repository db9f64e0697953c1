"""Tiny GLUE (+ AX) and SQuAD v2.0 directories in the downloads' real formats, and a tiny
checkpoint, for the fine-tuning suite's tests (tests/test_suite.py)."""
from __future__ import annotations

import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import formats
from bert_jax.models import bert as model_lib
from tests.test_task_data import CONTEXT, make_vocab

POS, NEG = ("good", "great", "fine"), ("bad", "awful", "poor")
FILLER = "the movie was very plot acting a question is it same".split()
MNLI_LABELS = ("contradiction", "entailment", "neutral")

# (header or None, columns as functions of (i, sentence_a, sentence_b, label)) per file kind.
_MNLI_COLS = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
              "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
              "sentence2"]


def _sentence(rng, label: int) -> str:
  word = rng.choice(POS if label else NEG)
  return f"the movie was very {word}"


def _rows(task: str, split: str, n: int, rng) -> str:
  test = split.startswith("test")
  lines = []
  for i in range(n):
    y = int(rng.integers(0, 2))
    a, b = _sentence(rng, y), _sentence(rng, int(rng.integers(0, 2)))
    if task == "cola":
      lines.append(f"{i}\t{a}" if test else f"gj04\t{y}\t\t{a}")
    elif task == "sst2":
      lines.append(f"{i}\t{a}" if test else f"{a}\t{y}")
    elif task == "mrpc":
      lines.append(f"{i}\t{i}\t{i + 1}\t{a}\t{b}" if test else f"{y}\t{i}\t{i + 1}\t{a}\t{b}")
    elif task == "stsb":
      common = f"{i}\tmain-news\tf\t2012\t{i}\tnone\tnone\t{a}\t{b}"
      lines.append(common if test else f"{common}\t{5.0 * y:.3f}")
    elif task == "qqp":
      lines.append(f"{i}\t{a}\t{b}" if test else f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{y}")
    elif task == "mnli":
      label = MNLI_LABELS[int(rng.integers(0, 3))]
      common = f"{i}\t{i}\t{i}e\tfiction\t( {a} )\t( {b} )\t(S {a})\t(S {b})\t{a}\t{b}"
      lines.append(common if test else f"{common}\t{label}\t{label}")
    elif task in ("qnli", "rte"):
      label = ("entailment", "not_entailment")[y]
      lines.append(f"{i}\t{a}\t{b}" if test else f"{i}\t{a}\t{b}\t{label}")
    elif task == "wnli":
      lines.append(f"{i}\t{a}\t{b}" if test else f"{i}\t{a}\t{b}\t{y}")
  return "".join(line + "\n" for line in lines)


_HEADERS = {
    "cola": (None, "index\tsentence"),
    "sst2": ("sentence\tlabel", "index\tsentence"),
    "mrpc": ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
             "index\t#1 ID\t#2 ID\t#1 String\t#2 String"),
    "stsb": ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
             "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"),
    "qqp": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "id\tquestion1\tquestion2"),
    "mnli": ("\t".join(_MNLI_COLS + ["label1", "gold_label"]), "\t".join(_MNLI_COLS)),
    "qnli": ("index\tquestion\tsentence\tlabel", "index\tquestion\tsentence"),
    "rte": ("index\tsentence1\tsentence2\tlabel", "index\tsentence1\tsentence2"),
    "wnli": ("index\tsentence1\tsentence2\tlabel", "index\tsentence1\tsentence2"),
}
DIRS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
        "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
TEST_ROWS = {"cola": 7, "sst2": 6, "mrpc": 5, "stsb": 6, "qqp": 9, "mnli": 8, "qnli": 5,
             "rte": 6, "wnli": 4}
AX_ROWS = 5


def make_glue(root: pathlib.Path, n_train: int = 24, n_dev: int = 10) -> pathlib.Path:
  """root/{CoLA,SST-2,...,WNLI,diagnostic}: train/dev/test files as the GLUE download has them."""
  rng = np.random.default_rng(0)
  for task, name in DIRS.items():
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    header, test_header = _HEADERS[task]
    dev_splits = ("dev_matched", "dev_mismatched") if task == "mnli" else ("dev",)
    test_splits = ("test_matched", "test_mismatched") if task == "mnli" else ("test",)
    for split, n in [("train", n_train)] + [(s, n_dev) for s in dev_splits]:
      (d / f"{split}.tsv").write_text((header + "\n" if header else "") + _rows(task, split, n, rng))
    for split in test_splits:
      (d / f"{split}.tsv").write_text(test_header + "\n" + _rows(task, "test", TEST_ROWS[task], rng))
  with open(root / "QQP" / "train.tsv", "a", encoding="utf-8") as f:
    f.write("999\t1\t2\ta question cut short\n")  # as the release has a few: columns missing
  ax = root / "diagnostic"
  ax.mkdir(exist_ok=True)
  (ax / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n" + "".join(
      f"{i}\t{_sentence(rng, i % 2)}\t{_sentence(rng, 1)}\n" for i in range(AX_ROWS)))
  return root


def make_squad2(root: pathlib.Path) -> pathlib.Path:
  """root/squad/{train,dev}-v2.0.json (one paragraph, answerable and impossible questions)."""
  d = root / "squad"
  d.mkdir(parents=True, exist_ok=True)
  answers = ["the 10th and 11th centuries", "Normandy", "Rollo", "Catholicism"]
  qas = [{"id": f"q{i}", "question": f"What is answer number {i}?",
          "answers": [{"text": a, "answer_start": CONTEXT.index(a)}], "is_impossible": False}
         for i, a in enumerate(answers + answers)]
  qas.append({"id": "qx", "question": "What is answer number 9?", "answers": [],
              "is_impossible": True})
  data = {"version": "v2.0", "data": [{"title": "Normans", "paragraphs": [
      {"context": CONTEXT, "qas": qas}]}]}
  for name in ("train-v2.0.json", "dev-v2.0.json"):
    (d / name).write_text(json.dumps(data))
  return root


def make_checkpoint(root: pathlib.Path, texts=()) -> tuple[str, str]:
  """A tiny random BERT (export format) and its vocabulary (the test files' words and
  `texts`'): (checkpoint dir, vocab.txt)."""
  root.mkdir(parents=True, exist_ok=True)
  tok = make_vocab(root, [" ".join(POS + NEG + tuple(FILLER)), CONTEXT,
                          "What is answer number 0123456789?", *texts])
  cfg = model_lib.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2,
                             num_heads=2, intermediate_size=64, max_position_embeddings=128)
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, ids, ids,
                                                            ids))["params"]
  formats.save_native(str(root / "ckpt"), cfg, params)
  return str(root / "ckpt"), str(root / "vocab.txt")


def make_embed(root: pathlib.Path, n_train: int = 24, n_docs: int = 12) -> pathlib.Path:
  """root/embed: train.jsonl (anchor, positive: the same sentiment's sentence) and beir/
  (queries, a corpus, qrels/dev.tsv), as the suite's `embed` task reads them."""
  rng = np.random.default_rng(3)
  d = root / "embed"
  (d / "beir" / "qrels").mkdir(parents=True, exist_ok=True)
  rows = []
  for k in range(n_train):  # no text twice: contrastive batches keep repeats apart
    y = int(rng.integers(0, 2))
    rows.append({"anchor": f"{_sentence(rng, y)} in part {k}",
                 "positive": f"a {rng.choice(POS if y else NEG)} film, take {k}"})
  (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  docs = [f"a {rng.choice(POS if i % 2 else NEG)} film number {i}" for i in range(n_docs)]
  (d / "beir" / "corpus.jsonl").write_text("".join(
      json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(docs)))
  (d / "beir" / "queries.jsonl").write_text("".join(
      json.dumps({"_id": f"q{y}", "text": _sentence(rng, y)}) + "\n" for y in (0, 1)))
  (d / "beir" / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
      f"q{i % 2}\td{i}\t1\n" for i in range(n_docs)))
  return d
