"""Inference: fill-mask and feature extraction from a saved checkpoint."""
import json
import shutil
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import formats, predict
from bert_jax.models import bert as model_lib
from tests import test_train_utils as tu
from tests.test_task_data import make_vocab


def _checkpoint(tmp_path, num_layers=3):
  tok = make_vocab(tmp_path, ["the cat sat on the mat . a dog ran"])
  cfg = model_lib.BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_layers=num_layers, num_heads=2,
                             intermediate_size=32, max_position_embeddings=32)
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, ids, ids, ids))["params"]
  formats.save_native(str(tmp_path / "ckpt"), cfg, params)
  return tok, cfg, params


def test_fill_mask_ranks_by_model_probability(tmp_path, capsys):
  tok, cfg, params = _checkpoint(tmp_path)
  res = predict.fill_mask(cfg, params, tok, ["the cat [MASK] on the [MASK] ."], top_k=3)
  assert len(res) == 1 and len(res[0]) == 2 and len(res[0][0]) == 3
  ids = predict.encode_with_masks(tok, "the cat [MASK] on the [MASK] .", 32)
  assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "the", "cat", "[MASK]", "on", "the", "[MASK]", ".", "[SEP]"]
  out = model_lib.BertForPreTraining(cfg).apply(
      {"params": params}, jnp.array([ids]), jnp.zeros((1, 9), jnp.int32), jnp.ones((1, 9), jnp.int32),
      jnp.array([[3, 6]]))
  probs = np.asarray(jax.nn.softmax(out["mlm_logits"][0, 0]))
  assert res[0][0][0][0] == tok.convert_ids_to_tokens([int(np.argmax(probs))])[0]
  np.testing.assert_allclose(res[0][0][0][1], probs.max(), rtol=1e-5)
  predict.main([f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}",
                "--text=a dog [MASK] .", "--top_k=2"])
  assert "[MASK] #1:" in capsys.readouterr().out


def test_features_match_the_encoder_outputs(tmp_path):
  tok, cfg, params = _checkpoint(tmp_path)
  texts = ["the cat sat", "a dog ran on the mat"]
  feats, mask = predict.extract_features(cfg, params, tok, texts, layers=[-1, 0], max_len=12)
  assert feats.shape == (2, 12, 2, 16)
  ids = np.zeros((2, 12), np.int32)
  for i, t in enumerate(texts):
    row = [tok.cls_id] + tok.encode(t) + [tok.sep_id]
    ids[i, :len(row)] = row
  seq, pooled = model_lib.BertModel(cfg).apply({"params": params["bert"]}, jnp.asarray(ids),
                                               jnp.zeros_like(ids), jnp.asarray(mask))
  np.testing.assert_allclose(feats[:, :, 0], seq, atol=1e-5)
  pooled_feats, _ = predict.extract_features(cfg, params, tok, texts, max_len=12, pooled=True)
  np.testing.assert_allclose(pooled_feats, pooled, atol=1e-5)
  out = tmp_path / "f.npy"
  predict.main([f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}", "--mode=features",
                "--text=the cat", "--layers=-1,-2", f"--output={out}", "--max_seq_length=8"])
  assert np.load(out).shape == (1, 8, 2, 16)


def test_features_of_a_layer_the_model_does_not_have_is_a_clear_error(tmp_path, capsys):
  """The README's --layers=-1,-2,-3,-4 on a 2-layer model: one line naming the layer and the depth."""
  _checkpoint(tmp_path, num_layers=2)
  with pytest.raises(SystemExit) as e:
    predict.main([f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}", "--mode=features",
                  "--text=the cat", "--layers=-1,-2,-3,-4", f"--output={tmp_path / 'f.npy'}"])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "--layers=-1,-2,-3,-4: layer -3 is out of range: the model has 2 layers" in err, err
  assert "Traceback" not in err and not (tmp_path / "f.npy").exists()
  with pytest.raises(SystemExit):
    predict.main([f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}", "--mode=features",
                  "--text=the cat", "--layers=last"])
  assert "--layers=last: expected comma-separated integers" in capsys.readouterr().err


ORBAX_NOISE = ("_CHECKPOINT_METADATA", "Metadata file does not exist", "read_only=True",
               "Given directory is read only")


@pytest.fixture(scope="module")
def pretraining_workdir(tmp_path_factory):
  """A 2-layer pre-training workdir of ours (Orbax checkpoints), with a vocabulary of its size."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  tmp = tmp_path_factory.mktemp("pretrain_run")
  tu.use_compilation_cache()
  train.train_and_evaluate(tu.tiny_config(num_train_steps=2, checkpoint_every_steps=1), str(tmp / "run"))
  words = [f"w{i}" for i in range(tu.TINY["model.vocab_size"] - 5)]
  (tmp / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
  return str(tmp / "run"), str(tmp / "vocab.txt")


def test_predict_from_our_workdir_prints_no_orbax_warnings(pretraining_workdir):
  run, vocab = pretraining_workdir
  proc = tu.run([sys.executable, "-m", "bert_jax.predict", f"--checkpoint={run}", f"--vocab={vocab}",
                 "--text=w1 [MASK] w3"], timeout=120)
  assert "[MASK] #1:" in proc.stdout
  noise = [line for line in proc.stderr.splitlines() if any(n in line for n in ORBAX_NOISE)]
  assert not noise, proc.stderr


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_finetuning_from_our_workdir_logs_no_orbax_warnings(tmp_path, pretraining_workdir, caplog):
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import classify_custom  # pylint: disable=g-import-not-at-top
  run, vocab = pretraining_workdir
  rows = [{"text": f"w{i % 7} w{i % 3}", "label": str(i % 2)} for i in range(16)]
  (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  c = classify_custom.get_config()
  c.init_checkpoint, c.vocab_path = run, vocab
  c.train_file = c.eval_file = str(tmp_path / "train.jsonl")
  c.max_seq_length, c.global_batch_size, c.eval_batch_size, c.num_epochs = 16, 8, 8, 1
  with caplog.at_level("INFO"):
    finetune.finetune(c, str(tmp_path / "work"))
  assert (tmp_path / "work" / "metrics.json").exists()
  # (Orbax's save-time "Wrote Metadata=... _CHECKPOINT_METADATA" INFO line comes on the 1st
  # and every 100th save of a process, so with other tests before it: not about reading.)
  noise = [r.getMessage() for r in caplog.records if any(n in r.getMessage() for n in ORBAX_NOISE)
           and not r.getMessage().startswith("Wrote Metadata=")]
  assert not noise, noise


def _flip_bytes_in_the_largest_data_file(step_dir):
  """Same size, other bytes: what a bad disk, a bad copy or a stray write leaves."""
  victim = max((p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)),
               key=lambda p: p.stat().st_size)
  data = bytearray(victim.read_bytes())
  mid = len(data) // 2
  data[mid:mid + 4096] = b"\x7f" * len(data[mid:mid + 4096])
  victim.write_bytes(bytes(data))
  return victim


def test_predict_never_reads_a_damaged_checkpoint(tmp_path, pretraining_workdir, capsys, caplog):
  """Flipped bytes in the newest checkpoint used to give NaN probabilities with exit 0: the
  checksums written at save are verified, the previous step is used and the log says so;
  with no intact step left it is an error naming the damage. Nothing is moved."""
  run, vocab = pretraining_workdir
  shutil.copytree(run, tmp_path / "run")
  args = [f"--vocab={vocab}", "--text=w1 [MASK] w3"]
  predict.main([f"--checkpoint={tmp_path / 'run' / 'checkpoints' / '1'}"] + args)
  step1 = capsys.readouterr().out
  victim = _flip_bytes_in_the_largest_data_file(tmp_path / "run" / "checkpoints" / "2")
  with caplog.at_level("WARNING"):
    predict.main([f"--checkpoint={tmp_path / 'run'}"] + args)
  assert capsys.readouterr().out == step1 and "nan" not in step1
  assert f"{tmp_path / 'run' / 'checkpoints' / '2'} is damaged" in caplog.text, caplog.text
  assert victim.name in caplog.text and "reading step 1 instead" in caplog.text
  with pytest.raises(SystemExit) as e:
    predict.main([f"--checkpoint={tmp_path / 'run' / 'checkpoints' / '2'}"] + args)
  err = capsys.readouterr().err
  assert e.value.code == 2 and "is damaged" in err and "checksum differs" in err, err
  assert victim.exists() and (tmp_path / "run" / "checkpoints" / "2").is_dir()  # nothing moved
  # Without checksums (an older run's checkpoint): NaN parameters are damage too.
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step2 = tmp_path / "old" / "checkpoints" / "2"
  shutil.copytree(run, tmp_path / "old")
  (step2 / "MANIFEST.json").unlink()
  state = tu.load_checkpoint(tmp_path / "old", 2)
  state["params"]["bert"]["embeddings"]["word_embeddings"]["embedding"][7, 3] = np.nan
  shutil.rmtree(step2 / "state")
  with ocp.PyTreeCheckpointer() as ckptr:
    ckptr.save(step2 / "state", state)
  caplog.clear()
  with caplog.at_level("WARNING"):
    predict.main([f"--checkpoint={tmp_path / 'old'}"] + args)
  assert capsys.readouterr().out == step1
  assert "NaN or infinite values" in caplog.text and "reading step 1 instead" in caplog.text
  # Without checksums, files that no longer read are damage too (the tree index overwritten).
  shutil.rmtree(tmp_path / "old")
  shutil.copytree(run, tmp_path / "old")
  (step2 / "MANIFEST.json").unlink()
  for p in (step2 / "state").rglob("*"):
    if p.is_file() and "/d/" in str(p):
      p.write_bytes(b"\x7f" * p.stat().st_size)
  caplog.clear()
  with caplog.at_level("WARNING"):
    predict.main([f"--checkpoint={tmp_path / 'old'}"] + args)
  assert capsys.readouterr().out == step1
  assert "cannot be read" in caplog.text and "reading step 1 instead" in caplog.text


def test_predict_defaults_to_the_checkpoints_own_vocabulary(tmp_path, pretraining_workdir, capsys):
  """Before: "Missing required flags: --vocab" although the workdir holds its vocabulary."""
  run, vocab = pretraining_workdir
  args = ["--text=w1 [MASK] w3"]
  predict.main([f"--checkpoint={run}", f"--vocab={vocab}"] + args)
  expected = capsys.readouterr().out
  shutil.copytree(run, tmp_path / "run")
  (tmp_path / "run" / "vocab").mkdir()  # the run's data.vocab_path ("vocab", in the workdir)
  shutil.copy(vocab, tmp_path / "run" / "vocab" / "vocab.txt")
  predict.main([f"--checkpoint={tmp_path / 'run'}"] + args)
  assert capsys.readouterr().out == expected
  shutil.rmtree(tmp_path / "run" / "vocab")
  with pytest.raises(SystemExit) as e:
    predict.main([f"--checkpoint={tmp_path / 'run'}"] + args)
  err = capsys.readouterr().err
  assert e.value.code == 2 and "--vocab is not set and" in err and "pass --vocab=PATH" in err, err
  assert f"the run recorded {tmp_path / 'run' / 'vocab'}, which is not there" in err, err
  # An export or HuggingFace directory holding its vocab.txt.
  tok, _, _ = _checkpoint(tmp_path)
  shutil.copy(tmp_path / "vocab.txt", tmp_path / "ckpt" / "vocab.txt")
  predict.main([f"--checkpoint={tmp_path / 'ckpt'}", "--text=the [MASK] sat"])
  assert "[MASK] #1:" in capsys.readouterr().out


def _traced_rows(monkeypatch, module_cls):
  """Rows of every batch `module_cls` is traced or run with."""
  rows = []
  real = module_cls.__call__

  def call(self, input_ids, *args, **kwargs):
    rows.append(input_ids.shape[0])
    return real(self, input_ids, *args, **kwargs)

  monkeypatch.setattr(module_cls, "__call__", call)
  return rows


def test_fill_mask_runs_in_batches_and_bad_flags_are_named_first(tmp_path, monkeypatch, capsys):
  """Before: every input line in one batch (10,000 lines took 10.4 GB for a 1M-parameter
  model); --top_k=-3 printed 4,093 candidates, --max_seq_length=1 a broadcast error, a
  [MASK] cut off by max_seq_length 'No [MASK] in the input', a missing --output directory
  failed only after every feature was computed."""
  _checkpoint(tmp_path)
  lines = [f"the cat {'sat ' * (i % 5)}on the [MASK] ." for i in range(70)]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
  rows = _traced_rows(monkeypatch, model_lib.BertModel)
  base = [f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}"]
  predict.main(base + [f"--input_file={tmp_path / 'in.txt'}", "--batch_size=16", "--top_k=2"])
  out = capsys.readouterr().out
  assert out.count("[MASK] #1:") == 70 and rows and max(rows) == 16, rows
  monkeypatch.undo()
  whole = predict.fill_mask(*predict.load_checkpoint(str(tmp_path / "ckpt")),
                            predict.Tokenizer.from_path(str(tmp_path / "vocab.txt")), lines,
                            top_k=2, batch_size=128)
  assert out == "".join(t + "\n" + "".join(f"  [MASK] #{k + 1}: " + ", ".join(
      f"{w} ({p:.3f})" for w, p in c) + "\n" for k, c in enumerate(r)) for t, r in zip(lines, whole))
  for flag, message in (("--top_k=-3", "--top_k"), ("--max_seq_length=1", "--max_seq_length"),
                        ("--batch_size=0", "--batch_size")):
    with pytest.raises(SystemExit) as e:
      predict.main(base + ["--text=the [MASK] sat", flag])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err, err
  with pytest.raises(SystemExit) as e:
    predict.main(base + ["--text=the cat sat on the mat the [MASK]", "--max_seq_length=5"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "lies beyond --max_seq_length=5 tokens" in err, err
  rows = _traced_rows(monkeypatch, model_lib.BertModel)
  with pytest.raises(SystemExit) as e:
    predict.main(base + ["--mode=features", "--text=the cat", f"--output={tmp_path / 'no' / 'f.npy'}"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and f"the directory {tmp_path / 'no'} does not exist" in err, err
  assert not rows  # refused before any work


def test_binary_input_is_refused_and_a_few_bad_bytes_are_said(tmp_path, capsys, caplog):
  """--input_file of binary junk was read as text without a word (issue 35 item 8): a file
  that is not UTF-8 text is one line, exit 2, nothing predicted; a text with a few bytes
  that are not UTF-8 is read (as U+FFFD) with one warning naming the file and line."""
  import logging  # pylint: disable=g-import-not-at-top
  _checkpoint(tmp_path)
  base = [f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}"]
  junk = tmp_path / "model.bin"
  junk.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)))
  with pytest.raises(SystemExit) as e:
    predict.main(base + [f"--input_file={junk}"])
  out, err = capsys.readouterr()
  assert e.value.code == 2 and not out and "Traceback" not in err, err
  assert f"error: --input_file={junk} is not UTF-8 text: " in err.strip().splitlines()[-1], err
  text = tmp_path / "in.txt"
  text.write_bytes(b"the cat [MASK] on the mat .\n" * 300 + b"a dog \xff\xfe [MASK] .\n")
  with caplog.at_level(logging.WARNING):
    predict.main(base + [f"--input_file={text}", "--top_k=1"])
  assert capsys.readouterr().out.count("[MASK] #1:") == 301
  warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert any(f"{text}: 2 bytes are not UTF-8 (the first on line 301)" in m for m in warned), warned


def test_features_stream_to_npy_and_jsonl_as_extract_features_gives_them(tmp_path, capsys):
  """predict --mode=features writes features of many lines batch by batch (issue 36 item 1):
  the .npy (header written for the counted lines first) and Google's JSON Lines layout hold
  exactly extract_features' values."""
  import json  # pylint: disable=g-import-not-at-top
  tok, cfg, params = _checkpoint(tmp_path)
  lines = [f"the cat {'sat ' * (i % 4)}on the mat" for i in range(37)]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
  want, mask = predict.extract_features(cfg, params, tok, lines, layers=[-1, -2], max_len=12,
                                        batch_size=8)
  base = [f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}", "--mode=features",
          f"--input_file={tmp_path / 'in.txt'}", "--layers=-1,-2", "--max_seq_length=12",
          "--batch_size=8"]
  predict.main(base + [f"--output={tmp_path / 'f.npy'}"])
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["shape"] == [37, 12, 2, 16]
  np.testing.assert_array_equal(np.load(tmp_path / "f.npy"), want)
  np.testing.assert_array_equal(np.load(tmp_path / "f_mask.npy"), mask)
  predict.main(base + [f"--output={tmp_path / 'f.jsonl'}"])
  records = [json.loads(l) for l in (tmp_path / "f.jsonl").read_text().splitlines()]
  assert [r["linex_index"] for r in records] == list(range(37))
  for r, row, m, text in zip(records, want, mask, lines):
    assert [f["token"] for f in r["features"]] == ["[CLS]"] + tok.convert_ids_to_tokens(tok.encode(text)) + ["[SEP]"]
    assert len(r["features"]) == int(m.sum())
    for t, f in enumerate(r["features"]):
      assert [l["index"] for l in f["layers"]] == [-1, -2]
      np.testing.assert_allclose([l["values"] for l in f["layers"]], row[t], atol=1e-6)


BLANKS = ["the cat sat", "", "a dog ran", "   ", "on the mat"]  # lines 1 and 3 are blank


def _last_json(capsys) -> dict:
  import json  # pylint: disable=g-import-not-at-top
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_blank_lines_keep_their_rows_in_features_and_embed(tmp_path, capsys):
  """5 lines with 2 blank gave a [3, D] array and line_index 0, 1, 2 (issue 56 item 2): every
  line now has its row, a blank one's zero and marked (its mask zero, "blank": true in
  .jsonl, counted in the report), the others as the same texts give without blank lines."""
  import json  # pylint: disable=g-import-not-at-top
  _checkpoint(tmp_path)
  (tmp_path / "in.txt").write_text("\n".join(BLANKS) + "\n")
  (tmp_path / "full.txt").write_text("\n".join(l for l in BLANKS if l.strip()) + "\n")
  base = [f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}",
          "--max_seq_length=8", "--batch_size=2"]
  real, blank = [0, 2, 4], [1, 3]
  for mode, name in (("features", "f"), ("embed", "e")):
    predict.main(base + [f"--mode={mode}", f"--input_file={tmp_path / 'full.txt'}",
                         f"--output={tmp_path / name}_full.npy"])
    assert _last_json(capsys)["shape"][0] == 3
    predict.main(base + [f"--mode={mode}", f"--input_file={tmp_path / 'in.txt'}",
                         f"--output={tmp_path / name}.npy"])
    report = _last_json(capsys)
    assert report["shape"][0] == 5 and report["blank_lines"] == 2, report
    rows = np.load(tmp_path / f"{name}.npy")
    np.testing.assert_allclose(rows[real], np.load(tmp_path / f"{name}_full.npy"), atol=1e-6)
    assert rows[real].any(axis=tuple(range(1, rows.ndim))).all() and not rows[blank].any()
    predict.main(base + [f"--mode={mode}", f"--input_file={tmp_path / 'in.txt'}",
                         f"--output={tmp_path / name}.jsonl"])
    records = [json.loads(l) for l in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    index = "linex_index" if mode == "features" else "line_index"
    assert [r[index] for r in records] == [0, 1, 2, 3, 4]
    assert [r.get("blank", False) for r in records] == [False, True, False, True, False]
    if mode == "features":
      assert [len(r["features"]) > 0 for r in records] == [True, False, True, False, True]
  mask = np.load(tmp_path / "f_mask.npy")
  assert mask[real, 0].all() and not mask[blank].any()


def _finetuned_workdir(tmp_path, cfg, head, task: dict, labels) -> str:
  """A fine-tuning run's workdir as predict reads it: best/ with `head`'s fresh parameters."""
  from bert_jax import best_dir  # pylint: disable=g-import-not-at-top
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(head.init(jax.random.key(0), ids, ids, ids))["params"]
  best = tmp_path / task["task"] / "best"
  formats.save_native(str(best), cfg, params)
  best_dir.mark(best, labels, {"max_seq_length": 16, **task})
  return str(best.parent)


def test_blank_lines_keep_their_place_in_every_mode(tmp_path, capsys):
  """fill_mask, classify and tag answer every input line in its place as features and embed
  do (issue 56 item 2): a blank line gives an empty line (classify: a record marked
  "blank": true, no prediction), never a prediction for an empty text, never nothing."""
  import json  # pylint: disable=g-import-not-at-top
  from bert_jax import heads  # pylint: disable=g-import-not-at-top
  _, cfg, _ = _checkpoint(tmp_path)
  vocab = f"--vocab={tmp_path / 'vocab.txt'}"
  (tmp_path / "mask.txt").write_text("the [MASK] sat\n\n  \na dog [MASK]\n")
  predict.main([f"--checkpoint={tmp_path / 'ckpt'}", vocab, f"--input_file={tmp_path / 'mask.txt'}"])
  shown = [l for l in capsys.readouterr().out.splitlines() if not l.startswith("  [MASK]")]
  assert shown == ["the [MASK] sat", "", "  ", "a dog [MASK]"]  # each line as it is
  (tmp_path / "in.txt").write_text("\n".join(BLANKS) + "\n")
  work = _finetuned_workdir(tmp_path, cfg, heads.BertForSequenceClassification(cfg, num_labels=2),
                            {"task": "glue"}, ["0", "1"])
  predict.main([f"--checkpoint={work}", vocab, "--mode=classify", f"--input_file={tmp_path / 'in.txt'}",
                "--batch_size=2"])
  records = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert [r["text"] for r in records] == BLANKS
  assert [r["prediction"] in ("0", "1") for r in records] == [True, False, True, False, True]
  assert [r.get("blank", False) for r in records] == [False, True, False, True, False]
  work = _finetuned_workdir(tmp_path, cfg, heads.BertForTokenClassification(cfg, num_labels=2),
                            {"task": "conll"}, ["O", "B-X"])
  predict.main([f"--checkpoint={work}", vocab, "--mode=tag", f"--input_file={tmp_path / 'in.txt'}"])
  tagged = capsys.readouterr().out.splitlines()
  assert [" ".join(w.rsplit("/", 1)[0] for w in l.split()) for l in tagged] == [
      "the cat sat", "", "a dog ran", "", "on the mat"]


def test_output_holds_what_fill_mask_classify_and_tag_print(tmp_path, capsys):
  """--output was ignored by fill_mask / classify / qa / tag: what they print is written there
  instead (stdout: where, and how many lines); a suffix other than the one each writes (.txt,
  .jsonl) is one line, exit 2, before the checkpoint is read."""
  import json  # pylint: disable=g-import-not-at-top
  from bert_jax import heads  # pylint: disable=g-import-not-at-top
  _, cfg, _ = _checkpoint(tmp_path)
  vocab = f"--vocab={tmp_path / 'vocab.txt'}"
  (tmp_path / "in.txt").write_text("the [MASK] sat\n\na dog [MASK]\n")
  text = [vocab, f"--input_file={tmp_path / 'in.txt'}"]
  classifier = _finetuned_workdir(tmp_path, cfg, heads.BertForSequenceClassification(
      cfg, num_labels=2), {"task": "glue"}, ["0", "1"])
  tagger = _finetuned_workdir(tmp_path, cfg, heads.BertForTokenClassification(cfg, num_labels=2),
                              {"task": "conll"}, ["O", "B-X"])
  for checkpoint, mode, name in ((tmp_path / "ckpt", "fill_mask", "m.txt"),
                                 (classifier, "classify", "c.jsonl"), (tagger, "tag", "t.txt")):
    predict.main([f"--checkpoint={checkpoint}", f"--mode={mode}"] + text)
    printed = capsys.readouterr().out
    predict.main([f"--checkpoint={checkpoint}", f"--mode={mode}", f"--output={tmp_path / name}"]
                 + text)
    assert (tmp_path / name).read_text() == printed, mode
    assert json.loads(capsys.readouterr().out) == {
        "output": str(tmp_path / name), "lines": printed.count("\n")}, mode
  for mode, name, suffix in (("fill_mask", "m.jsonl", ".txt"), ("classify", "c.txt", ".jsonl"),
                             ("qa", "q", ".jsonl"), ("tag", "t.npy", ".txt")):
    with pytest.raises(SystemExit) as e:
      predict.main([f"--checkpoint={tmp_path / 'nothing'}", f"--mode={mode}", "--text=a",
                    f"--output={tmp_path / name}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert (f"--output={tmp_path / name}: --mode={mode} writes what it prints, as {suffix}: "
            f"name it e.g. {tmp_path / name.split('.')[0]}{suffix}.") in err, err


def test_an_output_suffix_the_mode_does_not_write_is_refused_first(tmp_path, capsys):
  """--output=f.csv wrote a binary .npy under that name, and f.csv_mask.npy beside it (issue
  56 item 10): a suffix features / embed do not write is one line naming the ones they do,
  exit 2, before the checkpoint is read (so any directory stands for one here), nothing
  written."""
  base = [f"--checkpoint={tmp_path}", "--text=the cat"]
  for mode in ("features", "embed"):
    for name, suffix in (("f.csv", ".csv"), ("f", "no suffix")):
      with pytest.raises(SystemExit) as e:
        predict.main(base + [f"--mode={mode}", f"--output={tmp_path / name}"])
      err = capsys.readouterr().err
      assert e.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
      assert (f"--output={tmp_path / name}: --mode={mode} writes .npy or .jsonl, not {suffix}: "
              f"name it e.g. {tmp_path / 'f.npy'}") in err, err
  assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())


def _zero_checkpoint(tmp_path, max_positions=32):
  """An export of _checkpoint's model with zero weights (shapes only: nothing compiled), for
  tests of what predict refuses before it runs the model."""
  tok = make_vocab(tmp_path, ["the cat sat on the mat . a dog ran"])
  cfg = model_lib.BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_layers=2, num_heads=2,
                             intermediate_size=32, max_position_embeddings=max_positions)
  ids = jnp.ones((1, 4), jnp.int32)
  shapes = jax.eval_shape(model_lib.BertForPreTraining(cfg).init, jax.random.key(0), ids, ids, ids, ids)
  params = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nn.unbox(shapes)["params"])
  formats.save_native(str(tmp_path / "ckpt"), cfg, params)
  return tok, cfg


def test_a_max_seq_length_above_the_models_positions_is_refused(tmp_path, capsys):
  """--max_seq_length=512 on a model of 128 positions cut every text at 128 without a word
  (issue 56 item 10): a length given above the model's is one line naming its limit, exit 2,
  in every mode that reads the flag; unset, the default (128) is the model's 32 here."""
  _zero_checkpoint(tmp_path)
  base = [f"--checkpoint={tmp_path / 'ckpt'}", f"--vocab={tmp_path / 'vocab.txt'}", "--text=the [MASK] sat"]
  for mode in ("fill_mask", "features", "embed"):
    with pytest.raises(SystemExit) as e:
      out = tmp_path / ("f.txt" if mode == "fill_mask" else "f.npy")  # (each mode's suffix)
      predict.main(base + [f"--mode={mode}", "--max_seq_length=512", f"--output={out}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert (f"--max_seq_length=512: {tmp_path / 'ckpt'} takes at most 32 tokens a text (its "
            "position embeddings end there): set --max_seq_length=32 or less") in err, err
  assert not (tmp_path / "f.npy").exists() and not (tmp_path / "f.txt").exists()
  # At the model's limit already (the default, capped), a [MASK] past it is not told to raise it.
  with pytest.raises(SystemExit) as e:
    predict.main(base[:2] + ["--text=" + "the cat " * 20 + "[MASK]"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "lies beyond token 32, where the text is cut: the model takes no " \
      "more: shorten the text or put the [MASK] earlier" in err, err


def test_a_vocabulary_other_than_the_checkpoints_own_is_said(tmp_path, capsys, caplog):
  """--vocab of another vocabulary of the same size was used without a word, every id then
  meaning another token than the model learned (issue 56 item 10): one warning naming both
  files, how many tokens differ and the first; the same tokens from another file say nothing."""
  import logging  # pylint: disable=g-import-not-at-top
  _zero_checkpoint(tmp_path)
  own = (tmp_path / "vocab.txt").read_text().splitlines()
  shutil.copy(tmp_path / "vocab.txt", tmp_path / "ckpt" / "vocab.txt")  # the checkpoint's own
  (tmp_path / "other.txt").write_text("\n".join(own[:5] + [f"x{i}" for i in range(len(own) - 5)]) + "\n")
  (tmp_path / "same").mkdir()
  shutil.copy(tmp_path / "vocab.txt", tmp_path / "same" / "vocab.txt")
  base = [f"--checkpoint={tmp_path / 'ckpt'}", "--text=the [MASK] sat", "--max_seq_length=8"]
  for vocab, warned in (("other.txt", True), ("same", False)):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      predict.main(base + [f"--vocab={tmp_path / vocab}"])
    assert "[MASK] #1:" in capsys.readouterr().out
    said = [r.getMessage() for r in caplog.records if "--vocab=" in r.getMessage()]
    assert bool(said) == warned, said
  assert said == [] and len(own) - 5 > 0
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    predict.main(base + [f"--vocab={tmp_path / 'other.txt'}", "--mode=features",
                         f"--output={tmp_path / 'f.npy'}"])
  said = [r.getMessage() for r in caplog.records if "--vocab=" in r.getMessage()]
  assert said == [
      f"--vocab={tmp_path / 'other.txt'} is not the vocabulary {tmp_path / 'ckpt'} comes with "
      f"({tmp_path / 'ckpt' / 'vocab.txt'}): {len(own) - 5} of its {len(own)} tokens differ (the first: id 5 is "
      f"{own[5]!r} there, 'x0' in --vocab), so those ids mean other tokens than the model learned: "
      "leave out --vocab to use the checkpoint's own."], said


def test_fill_mask_on_an_electra_discriminator_names_electras_generator(tmp_path, capsys):
  """fill-mask on an ELECTRA discriminator named BERT's classes and cls.predictions.* (issue
  56 item 11): it says the discriminator has no masked-LM head and to give ELECTRA's
  generator, naming its tensors; a discriminator holding its generator (a run's) is told how
  to export it; an encoder-only ELECTRA names the generator's tensors too."""
  from bert_jax.models import electra  # pylint: disable=g-import-not-at-top
  make_vocab(tmp_path, ["the cat sat on the mat . a dog ran"])
  cfg = electra.ElectraConfig.from_preset(
      "electra-small", vocab_size=len((tmp_path / "vocab.txt").read_text().splitlines()),
      embedding_size=8, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
      max_position_embeddings=32)
  ids = jnp.ones((1, 4), jnp.int32)
  shapes = jax.eval_shape(electra.ElectraDiscriminator(cfg).init, jax.random.key(0), ids, ids, ids)
  params = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nn.unbox(shapes)["params"])
  generator = {"bert": params["bert"]}  # (its shapes do not matter: the message is said first)
  for name, tree in (("disc", params), ("run", {**params, "generator": generator}),
                     ("encoder", {"bert": params["bert"]})):
    formats.save_native(str(tmp_path / name), cfg, tree)
    with pytest.raises(SystemExit) as e:
      predict.main([f"--checkpoint={tmp_path / name}", f"--vocab={tmp_path / 'vocab.txt'}",
                    "--text=the [MASK] sat"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "Bert" not in err and "cls.predictions" not in err, err
    assert "generator_predictions.*, generator_lm_head.*" in err, err
    if name != "encoder":
      assert (f"{tmp_path / name} is an ELECTRA discriminator (ElectraForPreTraining): it has no "
              "masked-LM head, only the replaced-token one (discriminator_predictions.*): "
              "fill-mask needs ELECTRA's generator (ElectraForMaskedLM: generator_predictions.*, "
              "generator_lm_head.*): ") in err, err
    said = {"disc": "give --checkpoint= the generator's directory (a HuggingFace "
                    "ElectraForMaskedLM such as electra-base-generator, or the generator/ that "
                    "an export of an ELECTRA run of ours holds).",
            "run": f"it holds its generator: python -m bert_jax.convert --input={tmp_path / 'run'} "
                   "--output=OUT --to=huggingface writes it to OUT/generator; give "
                   "--checkpoint=OUT/generator.",
            "encoder": f"{tmp_path / 'encoder'} has no masked-LM head (generator_predictions.*, "
                       "generator_lm_head.*): fill-mask needs an ElectraForMaskedLM (ELECTRA's "
                       "generator) checkpoint, not an encoder-only one."}[name]
    assert said in err, err
