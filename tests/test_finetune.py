"""End-to-end fine-tuning of a tiny model for every task type, on fixtures in the original formats."""
import json
import os
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import finetune, finetuned, formats, loader, tasks
from bert_jax.models import bert as model_lib
from bert_jax.configs import classify_custom, conll, glue, squad, swag
from common import errors
from tests.test_task_data import CONTEXT, _squad_file, make_vocab

WORDS = "good great fine bad awful poor the movie was plot acting very".split()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("pretrained")
  tok = make_vocab(tmp, [" ".join(WORDS), CONTEXT, "What is answer number 0123456789?",
                         "EU rejects German call Peter A man sits. He eats. runs away fast. sleeps. sings."])
  cfg = model_lib.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_heads=2,
                             intermediate_size=64, max_position_embeddings=128)
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, ids, ids, ids))["params"]
  formats.save_native(str(tmp / "ckpt"), cfg, params)
  return str(tmp / "ckpt"), str(tmp / "vocab.txt")


def _common(c, pretrained, workdir, epochs=1):
  c.init_checkpoint, c.vocab_path = pretrained
  c.num_epochs = epochs
  c.global_batch_size = 8
  c.eval_batch_size = 8
  c.log_every_steps = 1000
  c.model.hidden_dropout_rate = 0.0
  c.model.attention_dropout_rate = 0.0
  return finetune.finetune(c, str(workdir))


def _sentiment(rng, n):
  pos, neg = WORDS[:3], WORDS[3:6]
  rows = []
  for i in range(n):
    label = int(rng.integers(0, 2))
    word = rng.choice(pos if label else neg)
    rows.append((f"the movie was very {word}", label))
  return rows


def test_glue_sst2_learns_and_writes_submission(tmp_path, pretrained):
  rng = np.random.default_rng(0)
  data = tmp_path / "SST-2"
  data.mkdir()
  for split, n in (("train", 96), ("dev", 24)):
    rows = _sentiment(rng, n)
    (data / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{l}\n" for s, l in rows))
  c = glue.get_config("sst2")
  c.data_dir, c.max_seq_length = str(data), 16
  c.opt.learning_rate = 3e-3
  best = _common(c, pretrained, tmp_path / "work", epochs=6)
  # The label is one word: a working fine-tuning loop learns it.
  assert best["accuracy"] >= 0.9, best
  lines = (tmp_path / "work" / "SST-2.tsv").read_text().splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 25
  metrics = json.loads((tmp_path / "work" / "metrics.json").read_text())
  assert metrics["main_metric"] == "accuracy" and len(metrics["epochs"]) == 6
  # best/ is in the export format, with the model's real BertConfig: also an init_checkpoint.
  best_dir = tmp_path / "work" / "best"
  assert (best_dir / "params.safetensors").is_file() and (best_dir / "bert_jax_config.json").is_file()
  cfg, enc = loader.read(str(best_dir), target="encoder")
  assert (cfg.hidden_size, cfg.num_layers) == (32, 2) and "pooler" in enc


@pytest.mark.slow
def test_glue_stsb_regression_and_custom_jsonl(tmp_path, pretrained):
  data = tmp_path / "STS-B"
  data.mkdir()
  header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
  rows = "".join(f"{i}\tg\tf\ty\to\ts\ts\tthe movie\tthe {w} movie\t{i % 5}.0\n" for i, w in enumerate(WORDS * 2))
  for split in ("train", "dev"):
    (data / f"{split}.tsv").write_text(header + rows)
  c = glue.get_config("stsb")
  c.data_dir, c.max_seq_length = str(data), 16
  best = _common(c, pretrained, tmp_path / "w1")
  assert set(best) >= {"pearson", "spearman"}
  assert (tmp_path / "w1" / "STS-B.tsv").exists()
  (tmp_path / "train.jsonl").write_text("".join(json.dumps({"review": s, "stars": str(l)}) + "\n"
                                                for s, l in _sentiment(np.random.default_rng(1), 24)))
  c = classify_custom.get_config()
  c.train_file = c.eval_file = str(tmp_path / "train.jsonl")
  c.text_a_column, c.label_column, c.max_seq_length = "review", "stars", 16
  best = _common(c, pretrained, tmp_path / "w2")
  assert set(best) >= {"accuracy", "f1"}


@pytest.mark.parametrize("version", [pytest.param("v1", marks=pytest.mark.slow), "v2"])
def test_squad_end_to_end(tmp_path, pretrained, version, capsys):
  path = _squad_file(tmp_path, version_2=version == "v2")
  c = squad.get_config(version)
  c.train_file = c.eval_file = path
  c.max_seq_length, c.doc_stride, c.max_query_length = 48, 16, 12
  best = _common(c, pretrained, tmp_path / "work")
  preds = json.loads((tmp_path / "work" / "predictions.json").read_text())
  assert set(preds) == {f"q{i}" for i in range(6)} | ({"qx"} if version == "v2" else set())
  assert all(isinstance(p, str) for p in preds.values())
  assert 0.0 <= best["f1"] <= 100.0
  if version == "v2":
    assert (tmp_path / "work" / "null_odds.json").exists()
    assert "best_f1_thresh" in best and "NoAns_total" in best
  from bert_jax import predict
  predict.main([f"--checkpoint={tmp_path / 'work'}", f"--vocab={pretrained[1]}", "--mode=qa",
                "--question=Who was their leader?", f"--context={CONTEXT}"])
  out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert isinstance(out["answer"], str) and (out["answer"] == "" or out["answer"] in CONTEXT)


@pytest.mark.slow
def test_conll_end_to_end(tmp_path, pretrained, capsys):
  sent = "EU NNP B-NP I-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP I-MISC\ncall NN I-NP O\n\nPeter NNP B-NP I-PER\n\n"
  (tmp_path / "train.txt").write_text("-DOCSTART- -X- -X- O\n\n" + sent * 8)
  (tmp_path / "valid.txt").write_text(sent)
  c = conll.get_config()
  c.data_dir, c.max_seq_length, c.tag_scheme = str(tmp_path), 16, "iob1"
  c.opt.learning_rate = 3e-3
  best = _common(c, pretrained, tmp_path / "work", epochs=4)
  assert set(best) >= {"precision", "recall", "f1"}
  lines = [l for l in (tmp_path / "work" / "predictions.txt").read_text().splitlines() if l]
  assert lines[0].startswith("EU B-ORG ")  # IOB1 gold converted to IOB2
  assert len(lines) == 5
  from bert_jax import predict
  predict.main([f"--checkpoint={tmp_path / 'work'}", f"--vocab={pretrained[1]}", "--mode=tag",
                "--text=EU rejects German call"])
  tagged = capsys.readouterr().out.strip().splitlines()[-1].split()
  assert [t.split("/")[0] for t in tagged] == ["EU", "rejects", "German", "call"]


@pytest.mark.slow
def test_swag_end_to_end(tmp_path, pretrained):
  header = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
  rows = "".join(f"v,{i},x,A man sits.,He,gold,eats.,runs away fast.,sleeps.,sings.,{i % 4}\n" for i in range(16))
  (tmp_path / "train.csv").write_text(header + rows)
  (tmp_path / "val.csv").write_text(header + rows)
  c = swag.get_config()
  c.data_dir, c.max_seq_length = str(tmp_path), 16
  best = _common(c, pretrained, tmp_path / "work")
  assert 0.0 <= best["accuracy"] <= 1.0
  assert (tmp_path / "work" / "predictions.csv").read_text().startswith("id,pred\n")


def test_missing_init_checkpoint_is_a_clear_error(tmp_path):
  c = glue.get_config("cola")
  with pytest.raises(ValueError, match="needs --config.init_checkpoint"):
    finetune.finetune(c, str(tmp_path))


def test_predict_with_a_finetuned_classifier(tmp_path, pretrained, capsys):
  from bert_jax import predict
  rng = np.random.default_rng(2)
  (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": s, "label": ["neg", "pos"][l]}) + "\n"
                                                for s, l in _sentiment(rng, 64)))
  c = classify_custom.get_config()
  c.train_file = c.eval_file = str(tmp_path / "train.jsonl")
  c.max_seq_length = 16
  c.opt.learning_rate = 3e-3
  best = _common(c, pretrained, tmp_path / "work", epochs=5)
  assert best["accuracy"] >= 0.9, best
  predict.main([f"--checkpoint={tmp_path / 'work'}", f"--vocab={pretrained[1]}", "--mode=classify",
                "--text=the movie was very great", "--text=the movie was very awful"])
  out = [json.loads(l) for l in capsys.readouterr().out.splitlines() if l.startswith("{")]
  assert [o["prediction"] for o in out] == ["pos", "neg"]


def test_predict_reads_the_best_dir_of_older_versions(tmp_path, pretrained):
  """best/ as versions before the export format wrote it (Orbax params, the BertConfig in
  config.json) still loads for predict."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from bert_jax import heads, predict  # pylint: disable=g-import-not-at-top
  cfg, _ = loader.read(pretrained[0], target="encoder")
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(heads.BertForSequenceClassification(cfg, num_labels=2).init(
      jax.random.key(0), ids, ids, ids))["params"]
  best = tmp_path / "best"
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(best / "params", params)
  (best / "config.json").write_text(json.dumps({"bert": cfg.to_dict(), "labels": ["0", "1"],
                                                "task": {"task": "glue"}}))
  got_cfg, got, task, labels = finetuned.load(str(tmp_path))
  assert got_cfg.hidden_size == cfg.hidden_size and labels == ["0", "1"] and task["task"] == "glue"
  np.testing.assert_array_equal(got["classifier"]["kernel"], np.asarray(params["classifier"]["kernel"]))


# Bad input fails before training, naming the config field or the file (and line).

def _custom(tmp_path, pretrained, train_rows, eval_rows=None, labels=()):
  """A classify_custom config on JSONL files of (text, label) rows (eval: the train file)."""
  def write(name, rows):
    (tmp_path / name).write_text("".join(json.dumps({"text": s, "label": l}) + "\n" for s, l in rows))
    return str(tmp_path / name)
  c = classify_custom.get_config()
  c.init_checkpoint, c.vocab_path = pretrained
  c.train_file = write("train.jsonl", train_rows)
  c.eval_file = write("dev.jsonl", eval_rows) if eval_rows is not None else c.train_file
  c.labels = labels
  c.max_seq_length, c.global_batch_size, c.eval_batch_size = 16, 8, 8
  return c


def _labelled(n, names=("neg", "pos")):
  return [(s, names[l]) for s, l in _sentiment(np.random.default_rng(3), n)]


@pytest.mark.parametrize("module,field", [(classify_custom, "eval_file"), (classify_custom, "train_file"),
                                          (squad, "eval_file"), (glue, "data_dir"), (conll, "data_dir")])
def test_unset_input_field_names_the_config_field(tmp_path, pretrained, module, field):
  c = module.get_config()
  c.init_checkpoint, c.vocab_path = pretrained
  c.max_seq_length = 16
  for name in ("train_file", "eval_file", "data_dir"):
    if name in c and name != field and not c[name]:
      c[name] = str(tmp_path / f"{name}.json")
  c[field] = ""
  with pytest.raises(errors.UserError, match=re.escape(f"config.{field} is not set") + ".*"
                     + re.escape(f"--config.{field}=")):
    finetune.finetune(c, str(tmp_path / "work"))


def test_missing_input_file_names_the_config_field(tmp_path, pretrained):
  c = _custom(tmp_path, pretrained, _labelled(16))
  c.eval_file = str(tmp_path / "nowhere.jsonl")
  with pytest.raises(errors.UserError, match=re.escape(f"config.eval_file: {tmp_path}/nowhere.jsonl "
                                                       "does not exist")):
    finetune.finetune(c, str(tmp_path / "work"))


def test_stray_train_label_is_an_error_naming_file_and_line(tmp_path, pretrained):
  rows = _labelled(24)
  rows[9] = (rows[9][0], "pos ")  # a typo: a third class seen once
  c = _custom(tmp_path, pretrained, rows)
  with pytest.raises(errors.UserError, match=re.escape(f"{c.train_file}:10: label 'pos '") + ".*only once"):
    finetune.finetune(c, str(tmp_path / "work"))
  assert not (tmp_path / "work" / "checkpoints").exists()
  # Declared labels: a train label outside them is an error too.
  c = _custom(tmp_path, pretrained, rows, labels=("neg,pos",))
  with pytest.raises(errors.UserError, match=re.escape(f"{c.train_file}:10: label 'pos ' is not one of "
                                                       "the declared labels ['neg', 'pos']")):
    finetune.finetune(c, str(tmp_path / "work"))


def test_unknown_dev_label_is_an_error_naming_the_dev_file_and_line(tmp_path, pretrained):
  dev = _labelled(8)
  dev[4] = (dev[4][0], "neutral")
  c = _custom(tmp_path, pretrained, _labelled(24), dev)
  with pytest.raises(errors.UserError, match=re.escape(f"{c.eval_file}:5: label 'neutral' is not one of "
                                                       "['neg', 'pos']")):
    finetune.finetune(c, str(tmp_path / "work"))


def test_labels_are_logged_with_their_counts(tmp_path, pretrained, caplog):
  rows = _labelled(24)
  c = _custom(tmp_path, pretrained, rows)
  cfg, _, tok = finetune._load(c)  # pylint: disable=protected-access
  with caplog.at_level("INFO"):
    task = tasks.classification_task(c, tok, cfg)
  n_pos = sum(l == "pos" for _, l in rows)
  assert task.labels == ("neg", "pos")
  assert f"'neg': {24 - n_pos}, 'pos': {n_pos}" in caplog.text, caplog.text
  assert c.train_file in caplog.text


@pytest.mark.parametrize("which", ["eval", "train"])
def test_input_file_with_a_header_and_no_rows_fails_before_training(tmp_path, pretrained, which):
  c = _custom(tmp_path, pretrained, _labelled(24), _labelled(8))
  path = c.eval_file if which == "eval" else c.train_file
  (tmp_path / path).write_text("")
  (tmp_path / "dev.csv").write_text("text,label\n")
  if which == "eval":
    c.eval_file = path = str(tmp_path / "dev.csv")
  with pytest.raises(errors.UserError, match=re.escape(path) + ".*no examples"):
    finetune.finetune(c, str(tmp_path / "work"))
  assert not (tmp_path / "work" / "checkpoints").exists()  # nothing trained


def test_init_checkpoint_that_does_not_exist_says_so(tmp_path, pretrained):
  c = _custom(tmp_path, pretrained, _labelled(16))
  c.init_checkpoint = str(tmp_path / "no_such_checkpoint")
  with pytest.raises(errors.UserError, match=re.escape(f"config.init_checkpoint: {tmp_path}/no_such_checkpoint"
                                                       " does not exist")):
    finetune.finetune(c, str(tmp_path / "work"))


def test_truncated_init_checkpoint_names_the_file(tmp_path, pretrained):
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  for f in os.listdir(pretrained[0]):
    (ckpt / f).write_bytes((pathlib.Path(pretrained[0]) / f).read_bytes())
  data = (ckpt / formats.NATIVE_PARAMS).read_bytes()
  (ckpt / formats.NATIVE_PARAMS).write_bytes(data[:len(data) // 2])
  c = _custom(tmp_path, pretrained, _labelled(16))
  c.init_checkpoint = str(ckpt)
  with pytest.raises(errors.UserError, match=re.escape(str(ckpt / formats.NATIVE_PARAMS)) + ".*truncated or corrupt"):
    finetune.finetune(c, str(tmp_path / "work"))


@pytest.mark.parametrize("field", ["global_batch_size", "eval_batch_size", "num_epochs"])
def test_zero_sizes_are_config_errors_naming_the_field(tmp_path, pretrained, field):
  c = _custom(tmp_path, pretrained, _labelled(16))
  c[field] = 0
  with pytest.raises(errors.UserError, match=re.escape(f"config.{field}=0: it must be at least 1")):
    finetune.finetune(c, str(tmp_path / "work"))
  assert not (tmp_path / "work" / "checkpoints").exists()
