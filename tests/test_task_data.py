"""Fine-tuning data: GLUE/custom readers, SQuAD windows and gold-span round trip, CoNLL, SWAG."""
import json
import re

import numpy as np
import pytest

from bert_jax import scoring
from common import errors
from input_pipeline import glue, squad, swag, tagging
from input_pipeline.tokenizer import Tokenizer

CONTEXT = ("The Normans were the people who in the 10th and 11th centuries gave their name to "
           "Normandy, a region in France. They were descended from Norse raiders and pirates from "
           "Denmark, Iceland and Norway who, under their leader Rollo, agreed to swear fealty to "
           "King Charles III of West Francia. Through generations of assimilation the descendants "
           "of the Vikings replaced the Norse religion and Old Norse language with Catholicism.")


def make_vocab(tmp_path, texts, lowercase=True):
  """A WordPiece vocab holding every word and character of `texts`."""
  words, chars = set(), set()
  for t in texts:
    t = t.lower() if lowercase else t
    words.update(re.findall(r"\w+|[^\w\s]", t))
    chars.update(c for c in t if not c.isspace())
  tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words | chars)
  tokens += ["##" + c for c in sorted(chars)]
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(dict.fromkeys(tokens)) + "\n")
  return Tokenizer.from_path(str(path), lowercase=lowercase)


def test_glue_tsv_reading_and_encoding(tmp_path):
  (tmp_path / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n"
                                      "0\tA cat sat.\tA dog ran far away.\tnot_entailment\n"
                                      "1\tIt rains.\tIt is wet.\tentailment\n")
  ex = glue.read_glue("rte", str(tmp_path), "train")
  assert [e.label for e in ex] == ["not_entailment", "entailment"]
  tok = make_vocab(tmp_path, [e.text_a + " " + e.text_b for e in ex])
  f = glue.encode_examples(ex, tok, 9, glue.GLUE["rte"].labels)
  assert f["input_ids"].shape == (2, 9) and list(f["labels"]) == [1, 0]
  row = tok.convert_ids_to_tokens(f["input_ids"][0][f["input_mask"][0] > 0])
  # 6 slots for 4 + 6 tokens: the longer side loses tokens first.
  assert row == ["[CLS]", "a", "cat", "sat", "[SEP]", "a", "dog", "ran", "[SEP]"]
  assert list(f["segment_ids"][0]) == [0] * 5 + [1] * 4


def test_cola_raw_release_layout_and_unknown_task(tmp_path):
  (tmp_path / "in_domain_train.tsv").write_text("gj04\t1\t\tThe sailors rode the breeze.\n"
                                                "gj04\t0\t*\tThe more.\n")
  ex = glue.read_glue("cola", str(tmp_path), "train")
  assert [(e.text_a, e.label) for e in ex] == [("The sailors rode the breeze.", "1"), ("The more.", "0")]
  with pytest.raises(ValueError, match="Unknown GLUE task"):
    glue.read_glue("colaa", str(tmp_path), "train")
  with pytest.raises(FileNotFoundError, match="does not exist"):
    glue.read_glue("sst2", str(tmp_path), "train")


def test_custom_jsonl_and_csv(tmp_path):
  (tmp_path / "d.jsonl").write_text('{"review": "good", "stars": "5"}\n{"review": "bad", "stars": "1"}\n')
  ex = glue.read_custom(str(tmp_path / "d.jsonl"), text_a="review", label="stars")
  assert glue.infer_labels(ex) == ("1", "5")
  (tmp_path / "d.csv").write_text('text,label\n"hello, world",pos\n')
  assert glue.read_custom(str(tmp_path / "d.csv"), text_a="text", label="label")[0].text_a == "hello, world"
  with pytest.raises(ValueError, match="has no field 'txt'"):
    glue.read_custom(str(tmp_path / "d.csv"), text_a="txt", label="label")
  # a row of another field count than the header: refused, not cut or short of a column
  (tmp_path / "r.csv").write_text('text,label\n"hello, world",pos\nhello, world,pos\n')
  with pytest.raises(glue.DataError, match=r"r.csv:3: 3 fields where the header has 2 \(text, "
                     "label\)"):
    glue.read_custom(str(tmp_path / "r.csv"), text_a="text", label="label")


def _squad_file(tmp_path, version_2=False):
  answers = ["the 10th and 11th centuries", "Normandy", "Rollo", "King Charles III of West Francia",
             "Catholicism", "Norse raiders and pirates"]
  qas = [{"id": f"q{i}", "question": f"What is answer number {i}?",
          "answers": [{"text": a, "answer_start": CONTEXT.index(a)}]} for i, a in enumerate(answers)]
  if version_2:
    qas.append({"id": "qx", "question": "Who won?", "answers": [], "is_impossible": True})
  path = tmp_path / "squad.json"
  path.write_text(json.dumps({"data": [{"title": "Normans", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}))
  return str(path)


@pytest.mark.parametrize("max_seq_length,doc_stride", [(384, 128), (40, 8)])
def test_squad_gold_spans_map_back_to_the_same_text(tmp_path, max_seq_length, doc_stride):
  examples = squad.read_squad(_squad_file(tmp_path))
  tok = make_vocab(tmp_path, [CONTEXT] + [e.question for e in examples])
  feats = squad.convert_examples(examples, tok, max_seq_length, doc_stride, max_query_length=16)
  n = len(feats["input_ids"])
  assert feats["input_ids"].shape == (n, max_seq_length)
  if max_seq_length == 40:
    assert n > 2 * len(examples)  # Long context split into overlapping windows.
  # Gold positions as one-hot logits -> decoding must give back the gold text.
  start = np.full((n, max_seq_length), -10.0)
  end = np.full((n, max_seq_length), -10.0)
  start[np.arange(n), feats["start_positions"]] = 10.0
  end[np.arange(n), feats["end_positions"]] = 10.0
  has = feats["start_positions"] > 0
  assert has.sum() >= len(examples)
  start[~has, 0] = end[~has, 0] = -20.0  # Windows without the answer: no null preference.
  preds, _, _ = squad.decode_answers(examples, feats, start, end)
  scores = scoring.squad_scores(preds, {e.qid: list(e.answers) for e in examples})
  assert scores["f1"] == 100.0 and scores["exact"] == 100.0, preds


def test_squad_v2_null_answer_and_all_null_never_crashes(tmp_path):
  examples = squad.read_squad(_squad_file(tmp_path, version_2=True))
  assert examples[-1].is_impossible and examples[-1].answers == ()
  tok = make_vocab(tmp_path, [CONTEXT] + [e.question for e in examples])
  feats = squad.convert_examples(examples, tok, 64, 16, 16)
  n = len(feats["input_ids"])
  # Every logit on [CLS]: every candidate is the null answer.
  start = np.full((n, 64), -10.0)
  end = np.full((n, 64), -10.0)
  start[:, 0] = end[:, 0] = 10.0
  preds, diffs, _ = squad.decode_answers(examples, feats, start, end, version_2=True)
  assert all(p == "" for p in preds.values())
  assert all(d > 0 for d in diffs.values())
  # v1 decoding of the same logits still returns strings for all questions.
  preds_v1, _, _ = squad.decode_answers(examples, feats, start, end, version_2=False)
  assert set(preds_v1) == {e.qid for e in examples}


def test_conll_first_wordpiece_labelled_and_iob(tmp_path):
  (tmp_path / "train.txt").write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP I-ORG\nrejects VBZ B-VP O\n"
                                      "German JJ B-NP I-MISC\ncall NN I-NP O\n\nPeter NNP B-NP I-PER\n")
  sents = tagging.read_conll(str(tmp_path / "train.txt"))
  assert sents[0] == (["EU", "rejects", "German", "call"], ["I-ORG", "O", "I-MISC", "O"])
  assert tagging.iob1_to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == ["B-PER", "I-PER", "B-PER", "O", "B-LOC"]
  # "rejects" splits into several pieces with this vocab: only its first is labelled.
  vocab_words = ["eu", "german", "call", "peter", "re", "##jects"]
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + vocab_words) + "\n")
  tok = Tokenizer.from_path(str(path), lowercase=True)
  labels = ["O", "I-ORG", "I-MISC", "I-PER"]
  f = tagging.encode_conll(sents, tok, 10, labels)
  assert tok.convert_ids_to_tokens(f["input_ids"][0][:7]) == ["[CLS]", "eu", "re", "##jects", "german", "call", "[SEP]"]
  assert list(f["label_weights"][0][:7]) == [0, 1, 1, 0, 1, 1, 0]
  assert list(f["labels"][0][:6]) == [0, 1, 0, 0, 2, 0]
  assert list(f["word_index"][0][:6]) == [-1, 0, 1, -1, 2, 3]


def test_swag_four_choices(tmp_path):
  (tmp_path / "val.csv").write_text(
      "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
      "v1,7,x,A man sits.,He,gold,eats.,runs away fast.,sleeps.,sings.,1\n")
  ex = swag.read_swag(str(tmp_path / "val.csv"))
  assert ex[0]["label"] == 1 and ex[0]["endings"][1] == "runs away fast."
  tok = make_vocab(tmp_path, ["A man sits. He eats. runs away fast. sleeps. sings."])
  f = swag.encode_swag(ex, tok, 12)
  assert f["input_ids"].shape == (1, 4, 12) and list(f["labels"]) == [1]
  assert tok.convert_ids_to_tokens(f["input_ids"][0, 1][f["input_mask"][0, 1] > 0]) == [
      "[CLS]", "a", "man", "sits", ".", "[SEP]", "he", "runs", "away", "fast", ".", "[SEP]"]


def test_glue_from_a_local_tfds_copy(tmp_path):
  import tensorflow_datasets as tfds

  class TinyGlueCola(tfds.core.GeneratorBasedBuilder):
    """glue/cola's features, generated locally: nothing to download."""
    VERSION = tfds.core.Version("1.0.0")
    __module__ = "tiny_glue_cola_builder"  # top-level: no checksum lookup beside a package

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"sentence": tfds.features.Text(), "label": tfds.features.ClassLabel(num_classes=2),
           "idx": tfds.features.Scalar(dtype=np.int32)}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples(0), "validation": self._generate_examples(1),
              "test": self._generate_examples(2)}

    def _generate_examples(self, k):
      for i in range(3):
        yield i, {"sentence": f"Sentence {k}.{i}.", "label": -1 if k == 2 else i % 2, "idx": i}

  TinyGlueCola(data_dir=str(tmp_path)).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  ex = glue.read_tfds_glue("cola", "dev", str(tmp_path), name="tiny_glue_cola")
  assert sorted((e.text_a, e.label) for e in ex) == [("Sentence 1.0.", "0"), ("Sentence 1.1.", "1"), ("Sentence 1.2.", "0")]
  assert all(e.label is None for e in glue.read_tfds_glue("cola", "test", str(tmp_path), name="tiny_glue_cola"))
  with pytest.raises(FileNotFoundError, match="not prepared locally"):
    glue.read_tfds_glue("cola", "dev", str(tmp_path / "none"))


def test_squad_answers_longer_than_max_answer_length_are_counted(tmp_path):
  examples = squad.read_squad(_squad_file(tmp_path, version_2=True))
  tok = make_vocab(tmp_path, [CONTEXT] + [e.question for e in examples])
  lengths = {e.qid: len(tok.encode(e.answers[0])) for e in examples if e.answers}
  longest = max(lengths.values())  # "King Charles III of West Francia": 6 words
  assert longest >= 6
  assert squad.answers_over_length(examples, tok, 30) == {"examples": 0, "answers": 0,
                                                           "longest": longest}
  counted = squad.answers_over_length(examples, tok, 4)
  assert counted["answers"] == counted["examples"] == sum(n > 4 for n in lengths.values()) > 0
  # A question with a second, shorter gold answer stays reachable.
  two = squad.QAExample("q", "?", CONTEXT, ("King Charles III of West Francia", "Rollo"), 0)
  assert squad.answers_over_length([two], tok, 4) == {"examples": 0, "answers": 1,
                                                      "longest": lengths["q3"]}


# Bad input: every error names the file (and line) and what to do; all are UserErrors.

def _jsonl(path, labels):
  path.write_text("".join(json.dumps({"text": f"text {i}", "label": l}) + "\n" for i, l in enumerate(labels)))
  return str(path)


def test_inferred_label_seen_once_in_train_is_an_error_naming_file_and_line(tmp_path):
  train = _jsonl(tmp_path / "train.jsonl", ["neg", "pos"] * 3 + ["poss"] + ["neg", "pos"])
  ex = glue.read_custom(train, text_a="text", label="label")
  with pytest.raises(errors.UserError, match=re.escape(f"{train}:7: label 'poss'") + ".*only once.*config.labels"):
    glue.label_set(ex, (), train)
  # Declared, the same label is a class of its own.
  assert glue.label_set(ex, ("neg", "pos", "poss"), train) == ("neg", "pos", "poss")
  counts = glue.label_counts(ex)
  assert counts == {"neg": 4, "pos": 4, "poss": 1}


def test_label_absent_from_the_declared_set_is_an_error_naming_file_and_line(tmp_path):
  (tmp_path / "train.csv").write_text("text,label\na,neg\nb,pos\nc,neutral\nd,neg\n")
  train = str(tmp_path / "train.csv")
  ex = glue.read_custom(train, text_a="text", label="label")
  with pytest.raises(errors.UserError, match=re.escape(f"{train}:4: label 'neutral' is not one of the "
                                                       "declared labels ['neg', 'pos']")):
    glue.label_set(ex, ("neg", "pos"), train)
  # A comma-separated string (the command line's --config.labels=neg,pos) is a declaration too.
  assert glue.parse_labels(("neg,pos",)) == ("neg", "pos")
  assert glue.parse_labels("neg, pos") == ("neg", "pos")
  assert glue.parse_labels(()) == () and glue.parse_labels(("",)) == ()
  assert glue.parse_labels((1, 0)) == ("1", "0")


def test_unknown_dev_label_is_an_error_naming_the_dev_file_and_line(tmp_path):
  dev = _jsonl(tmp_path / "dev.jsonl", ["neg", "pos", "maybe"])
  ex = glue.read_custom(dev, text_a="text", label="label")
  with pytest.raises(errors.UserError, match=re.escape(f"{dev}:3: label 'maybe' is not one of ['neg', 'pos']")):
    glue.check_labels(ex, ("neg", "pos"), dev)
  # A row without a label would silently be class 0: an error too.
  (tmp_path / "nolabel.csv").write_text("text,label\na,neg\nb,\n")
  path = str(tmp_path / "nolabel.csv")
  with pytest.raises(errors.UserError, match=re.escape(f"{path}:3: no label")):
    glue.check_labels(glue.read_custom(path, text_a="text", label="label"), ("neg", "pos"), path)


def test_glue_label_outside_the_tasks_labels_names_file_and_line(tmp_path):
  (tmp_path / "dev.tsv").write_text("sentence\tlabel\nfine\t1\nbad\t0\nodd\t2\n")
  with pytest.raises(errors.UserError, match=re.escape(f"{tmp_path}/dev.tsv:4: label '2' is not one of "
                                                       "['0', '1']")):
    glue.read_glue("sst2", str(tmp_path), "dev")
  (tmp_path / "train.tsv").write_text("sentence1\tsentence2\tscore\na\tb\t1.5\nc\td\tx\n")
  with pytest.raises(errors.UserError, match=re.escape(f"{tmp_path}/train.tsv:3: score 'x' is not a number")):
    glue.read_glue("stsb", str(tmp_path), "train")


@pytest.mark.parametrize("name,content", [("d.csv", "text,label\n"), ("d.tsv", "text\tlabel\n"),
                                          ("d.jsonl", "\n"), ("d.csv", "")])
def test_custom_file_without_rows_is_an_error_naming_it(tmp_path, name, content):
  (tmp_path / name).write_text(content)
  with pytest.raises(errors.UserError, match=re.escape(str(tmp_path / name)) + ".*no examples"):
    glue.read_custom(str(tmp_path / name), text_a="text", label="label")


def test_task_files_without_rows_are_errors_naming_them(tmp_path):
  (tmp_path / "squad.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": []}]}))
  with pytest.raises(errors.UserError, match=re.escape(str(tmp_path / "squad.json")) + ".*no questions"):
    squad.read_squad(str(tmp_path / "squad.json"))
  (tmp_path / "val.csv").write_text("video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,"
                                    "ending1,ending2,ending3,label\n")
  with pytest.raises(errors.UserError, match=re.escape(str(tmp_path / "val.csv")) + ".*no examples"):
    swag.read_swag(str(tmp_path / "val.csv"))
  with (tmp_path / "val.csv").open("a") as f:
    f.write("v1,7,x,A man sits.,He,gold,eats.,runs.,sleeps.,sings.,1\nv1,8,x,A man sits.,He,gold,eats.,runs.,sleeps.,sings.,7\n")
  with pytest.raises(errors.UserError, match=re.escape(f"{tmp_path / 'val.csv'}:3: label '7' is not a choice")):
    swag.read_swag(str(tmp_path / "val.csv"))
  (tmp_path / "valid.txt").write_text("-DOCSTART- -X- -X- O\n\n")
  with pytest.raises(errors.UserError, match=re.escape(str(tmp_path / "valid.txt")) + ".*no sentences"):
    tagging.read_conll(str(tmp_path / "valid.txt"))
  (tmp_path / "dev.tsv").write_text("sentence\tlabel\n")
  with pytest.raises(errors.UserError, match=re.escape(str(tmp_path / "dev.tsv")) + ".*no examples"):
    glue.read_glue("sst2", str(tmp_path), "dev")


def test_cola_without_a_dev_file_names_every_file_it_looked_for(tmp_path):
  (tmp_path / "in_domain_train.tsv").write_text("gj04\t1\t\tThe sailors rode the breeze.\n")
  with pytest.raises(errors.UserError, match=re.escape(f"{tmp_path}/dev.tsv") + ".*"
                     + re.escape(f"{tmp_path}/in_domain_dev.tsv")):
    glue.read_glue("cola", str(tmp_path), "dev")


def test_numeric_labels_are_one_class_by_value_and_null_text_is_refused(tmp_path):
  """Before: labels 1 and 1.0 in one file (pandas writes floats once a column held NaN)
  became two classes of a 3-class model; a JSONL "text": null trained as the string "None"."""
  (tmp_path / "t.csv").write_text("text,label\na,1\nb,1.0\nc,0\nd,0.0\ne,2\nf,2\n")
  ex = glue.read_custom(str(tmp_path / "t.csv"), "text", "label")
  assert glue.label_set(ex, (), str(tmp_path / "t.csv")) == ("0", "1", "2")
  assert glue.parse_labels("0.0,1,2.0") == ("0", "1", "2")
  (tmp_path / "t.jsonl").write_text('{"text": "a", "label": 1}\n{"text": "b", "label": 1.0}\n'
                                    '{"text": "c", "label": "1.5"}\n{"text": null, "label": 0}\n')
  with pytest.raises(glue.DataError, match=r"t\.jsonl:4: field 'text' is null"):
    glue.read_custom(str(tmp_path / "t.jsonl"), "text", "label")
  (tmp_path / "n.jsonl").write_text('{"text": "a", "label": 1}\n{"text": ["x"], "label": 1.0}\n')
  with pytest.raises(glue.DataError, match=r"n\.jsonl:2: field 'text' holds list"):
    glue.read_custom(str(tmp_path / "n.jsonl"), "text", "label")
  (tmp_path / "SST-2").mkdir()
  (tmp_path / "SST-2" / "train.tsv").write_text("sentence\tlabel\ngood\t1.0\nbad\t0\n")
  assert [e.label for e in glue.read_glue("sst2", str(tmp_path / "SST-2"), "train")] == ["1", "0"]


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "gzip"])
def test_task_files_as_spreadsheets_save_them(tmp_path, encoding):
  """Before: Excel's "CSV UTF-8" (a BOM) was refused ('\\ufefftext' is no column), UTF-16
  and gzip files stopped with a bare _csv.Error traceback."""
  import gzip  # pylint: disable=g-import-not-at-top
  text = "text,label\ncafé au lait,yes\nthé,no\n"
  data = gzip.compress(text.encode()) if encoding == "gzip" else text.encode(encoding)
  name = "t.csv.gz" if encoding == "gzip" else "t.csv"
  (tmp_path / name).write_bytes(data)
  ex = glue.read_custom(str(tmp_path / name), "text", "label")
  assert [(e.text_a, e.label) for e in ex] == [("café au lait", "yes"), ("thé", "no")]


def test_unreadable_task_files_name_the_file_and_line(tmp_path):
  (tmp_path / "u16.csv").write_bytes("text,label\na,1\n".encode("utf-16-le"))
  with pytest.raises(glue.DataError, match=r"u16\.csv holds NUL bytes .* UTF-16 without a byte-order mark"):
    glue.read_custom(str(tmp_path / "u16.csv"), "text", "label")
  (tmp_path / "bad.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
  with pytest.raises(glue.DataError, match=r"bad\.gz is a gzip file that does not decompress"):
    glue.read_custom(str(tmp_path / "bad.gz"), "text", "label")
  (tmp_path / "q.csv").write_bytes(b'text,label\n"ok",1\na\rb,1\n')  # a stray carriage return
  with pytest.raises(glue.DataError, match=r"q\.csv:3: not a readable CSV row"):
    glue.read_custom(str(tmp_path / "q.csv"), "text", "label")
  (tmp_path / "s.csv").write_bytes(b'sent1,sent2,ending0,ending1,ending2,ending3,label\n'
                                   b'a,b,c,d,e,f,1\na\rx,b,c,d,e,f,1\n')
  with pytest.raises(glue.DataError, match=r"s\.csv:3: not a readable CSV row"):
    swag.read_swag(str(tmp_path / "s.csv"))


def test_malformed_glue_rows_are_skipped_and_counted(tmp_path, caplog):
  """Rows missing a column (a handful in QQP/MNLI's release) are skipped as the original
  code does, and said: one warning per file with how many and the first lines (issue 35,
  item 8)."""
  (tmp_path / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n"
                                      "0\tA cat sat.\tA dog ran far away.\tnot_entailment\n"
                                      "1\tcut short\n"
                                      "2\tIt rains.\tIt is wet.\tentailment\n"
                                      "3\n")
  with caplog.at_level("WARNING"):
    ex = glue.read_glue("rte", str(tmp_path), "train")
  assert [e.guid for e in ex] == ["0", "2"]
  said = [r.getMessage() for r in caplog.records if "train.tsv" in r.getMessage()]
  assert len(said) == 1 and "skipped 2 malformed rows" in said[0] and "lines 3, 5" in said[0], said


@pytest.mark.parametrize("scheme", ["auto", "iob2"])
def test_conll_tags_of_the_original_files_train_as_iob2_by_default(tmp_path, scheme, caplog):
  """The original CoNLL-2003 files are IOB1 (an entity starts with I-): with the default
  tag_scheme (auto) the head trains on IOB2 targets (B- starts every entity) and the log says
  so, where it trained on the IOB1 tags unless told --config.tag_scheme=iob1; iob2 keeps
  the tags as they are."""
  import logging as py_logging  # pylint: disable=g-import-not-at-top
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import conll  # pylint: disable=g-import-not-at-top
  from bert_jax.models import bert as bert_model  # pylint: disable=g-import-not-at-top
  text = ("-DOCSTART- -X- -X- O\n\nEU NNP B-NP I-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP I-MISC\n"
          "call NN I-NP O\n\nPeter NNP B-NP I-PER\nBlackburn NNP I-NP I-PER\n")
  (tmp_path / "train.txt").write_text(text)
  (tmp_path / "valid.txt").write_text(text)
  (tmp_path / "vocab.txt").write_text(
      "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "eu", "german", "call"]) + "\n")
  c = conll.get_config()
  assert c.tag_scheme == "auto"
  c.data_dir, c.max_seq_length, c.tag_scheme = str(tmp_path), 16, scheme
  tok = Tokenizer.from_path(str(tmp_path / "vocab.txt"), lowercase=True)
  cfg = bert_model.BertConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=1,
                              intermediate_size=8, max_position_embeddings=16)
  with caplog.at_level(py_logging.INFO):
    data = tasks.conll_task(c, tok, cfg)
  said = [r.getMessage() for r in caplog.records if "IOB1" in r.getMessage()]
  if scheme == "auto":
    assert data.labels == ("B-MISC", "B-ORG", "B-PER", "I-PER", "O")
    assert len(said) == 1 and "3 entities" in said[0], said
  else:
    assert data.labels == ("I-MISC", "I-ORG", "I-PER", "O") and not said


def test_conll_default_names_in_a_directory_of_the_original_files_say_theirs(tmp_path):
  """A data_dir holding the original release (eng.train, eng.testa, eng.testb) with the
  default file names: the one-line refusal names the flags that read it."""
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import conll  # pylint: disable=g-import-not-at-top
  for name in ("eng.train", "eng.testa", "eng.testb"):
    (tmp_path / name).write_text("EU NNP B-NP I-ORG\n")
  c = conll.get_config()
  c.data_dir = str(tmp_path)
  with pytest.raises(glue.MissingDataError, match=r"train\.txt does not exist.*the original "
                     r"CoNLL-2003 files: --config\.train_file=eng\.train "
                     r"--config\.eval_file=eng\.testa"):
    tasks.conll_task(c, None, None)
