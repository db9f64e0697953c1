"""Rerunning a fine-tuning workdir: what it was made from is checked, and its history is
never lost (issue: nothing silent, part 2, items 2 and 5).

One finished custom-classification run (a CSV, 1 epoch) is shared; each probe reruns a
copy of it."""
import errno
import json
import shutil

from etils import epath
import numpy as np
import pytest

from bert_jax import checkpointing, finetune
from bert_jax.configs import classify_custom
from common import fileio
from tests import test_finetune
from tests.test_finetune import pretrained  # noqa: F401  pylint: disable=unused-import


def _csv(path, seed, flip=False):
  rows = test_finetune._sentiment(np.random.default_rng(seed), 48)  # pylint: disable=protected-access
  path.write_text("text,label\n" + "".join(
      f"{s},{('neg', 'pos')[int(l) ^ flip]}\n" for s, l in rows))
  return str(path)


def _config(pretrained, data, epochs=1, **overrides):  # noqa: F811
  c = classify_custom.get_config()
  c.init_checkpoint, c.vocab_path = pretrained
  c.train_file, c.eval_file = data
  c.max_seq_length, c.global_batch_size, c.eval_batch_size = 16, 8, 8
  c.num_epochs, c.log_every_steps = epochs, 1000
  c.opt.learning_rate = 3e-3
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.fixture(scope="module")
def finished(tmp_path_factory, pretrained):  # noqa: F811
  tmp = tmp_path_factory.mktemp("rerun")
  data = (_csv(tmp / "train.csv", 0), _csv(tmp / "dev.csv", 1))
  finetune.finetune(_config(pretrained, data), str(tmp / "work"))
  return tmp, data


def _copy(finished, tmp_path):
  shutil.copytree(finished[0] / "work", tmp_path / "work")
  return tmp_path / "work"


def _outputs(work):
  return {p.name: p.read_bytes() for p in sorted(work.glob("*")) if p.is_file() and p.name != "LOCK"}


@pytest.mark.parametrize("change", ["train_file", "eval_file", "init_checkpoint"])
def test_rerun_with_other_data_or_weights_is_refused_and_keeps_everything(
    tmp_path, finished, pretrained, change):  # noqa: F811
  """Before: 'Training already reached step N', exit 0, the old metrics and predictions
  kept as if they were this command's. Now refused, naming what differs."""
  work = _copy(finished, tmp_path)
  before = _outputs(work)
  data = list(finished[1])
  overrides = {}
  if change == "train_file":  # the same classes, other labels: same shapes, other run
    data[0] = _csv(tmp_path / "other.csv", 0, flip=True)
  elif change == "eval_file":
    data[1] = _csv(tmp_path / "other.csv", 5)
  else:  # the same architecture, other weights: a copy of the run's own encoder, perturbed
    from bert_jax import formats  # pylint: disable=g-import-not-at-top
    cfg, params = formats.read_native(pretrained[0])
    params["bert"]["embeddings"]["word_embeddings"]["embedding"] = (
        params["bert"]["embeddings"]["word_embeddings"]["embedding"] + 1e-3)
    formats.save_native(str(tmp_path / "other_ckpt"), cfg, params)
    overrides["init_checkpoint"] = str(tmp_path / "other_ckpt")
  config = _config(pretrained, data, **overrides)
  with pytest.raises(checkpointing.InputsChangedError) as e:
    finetune.finetune(config, str(work))
  text = str(e.value)
  what = {"train_file": "the training examples differ", "eval_file": "the dev examples differ",
          "init_checkpoint": "the initial weights differ"}[change]
  assert what in text and "nothing was moved or changed" in text, text
  assert f"{change}: saved" in text  # the config field that changed, old and new values
  assert _outputs(work) == before


def test_moved_data_with_the_same_content_resumes(tmp_path, finished, pretrained):  # noqa: F811
  """Inputs are compared by content: the same files at another path are the same run."""
  work = _copy(finished, tmp_path)
  moved = [str(shutil.copy(p, tmp_path / f"moved_{i}.csv")) for i, p in enumerate(finished[1])]
  best = finetune.finetune(_config(pretrained, moved), str(work))
  assert best == json.loads((work / "metrics.json").read_text())["best"]


def test_more_epochs_on_resume_says_the_learning_rate_restarts(tmp_path, finished, pretrained,  # noqa: F811
                                                               caplog):
  work = _copy(finished, tmp_path)
  caplog.set_level("WARNING")
  finetune.finetune(_config(pretrained, finished[1], epochs=2), str(work))
  text = "\n".join(r.getMessage() for r in caplog.records)
  assert "learning-rate schedule now spans 12 steps, not 6" in text, text
  assert "goes from 0 to 0.00164" in text, text
  history = json.loads((work / "metrics.json").read_text())["epochs"]
  assert [h["epoch"] for h in history] == [1, 2]


@pytest.mark.parametrize("content", ["", '{"task": "custom", "best": {"epoch": 1, "acc',
                                     "[1, 2]"])
def test_unreadable_metrics_json_is_refused_not_treated_as_empty(tmp_path, finished, pretrained,  # noqa: F811
                                                                 content):
  """Before: an empty or cut metrics.json (a kill or full disk mid-write) was read as no
  history: the rerun dropped the earlier epochs and let a later, worse epoch replace best/."""
  work = _copy(finished, tmp_path)
  (work / "metrics.json").write_text(content)
  before = _outputs(work)
  best_before = (work / "best" / "params.safetensors").read_bytes()
  with pytest.raises(finetune.UnreadableMetricsError, match=r"metrics.json is unreadable .*"
                     r"Put back a good copy of it, or delete it"):
    finetune.finetune(_config(pretrained, finished[1], epochs=2), str(work))
  assert _outputs(work) == before
  assert (work / "best" / "params.safetensors").read_bytes() == best_before


def test_metrics_json_is_replaced_atomically(tmp_path, monkeypatch):
  """A write that fails half-way (full disk, kill) leaves the previous file whole."""
  target = tmp_path / "metrics.json"
  fileio.write_json(target, {"epochs": [1]})
  real = epath.Path.write_bytes

  def half_then_full(self, data, *args, **kwargs):
    real(self, data[:len(data) // 2], *args, **kwargs)
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(epath.Path, "write_bytes", half_then_full)
  with pytest.raises(OSError):
    fileio.write_json(target, {"epochs": [1, 2]})
  monkeypatch.undo()
  assert json.loads(target.read_text()) == {"epochs": [1]}
  assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_predict_reads_a_finetuned_workdir_only_in_its_own_mode(finished, pretrained, capsys,  # noqa: F811
                                                               monkeypatch):
  """Before: --mode=tag on a sentence classifier printed per-token 'tags' from the
  classifier (exit 0) and --mode=qa died with KeyError: 'doc_stride'. classify defaults to
  the vocabulary the run recorded and runs in batches."""
  from bert_jax import heads, predict  # pylint: disable=g-import-not-at-top
  work = str(finished[0] / "work")
  for mode, extra in (("tag", ["--text=good stuff"]),
                      ("qa", ["--question=who?", "--context=the movie was good"])):
    with pytest.raises(SystemExit) as e:
      predict.main([f"--checkpoint={work}", f"--mode={mode}"] + extra)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    assert f"was fine-tuned for task 'custom': use --mode=classify" in err, err
  rows = []
  real = heads.BertForSequenceClassification.__call__
  monkeypatch.setattr(heads.BertForSequenceClassification, "__call__",
                      lambda self, ids, *a, **k: rows.append(ids.shape[0]) or real(self, ids, *a, **k))
  texts = [f"the movie was very {w}" for w in test_finetune.WORDS * 3]
  predict.main([f"--checkpoint={work}", "--mode=classify", "--batch_size=8"]
               + [f"--text={t}" for t in texts])
  out = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert [o["text"] for o in out] == texts and max(rows) == 8, rows
  monkeypatch.undo()
  predict.main([f"--checkpoint={work}", "--mode=classify", f"--vocab={pretrained[1]}",
                "--batch_size=64"] + [f"--text={t}" for t in texts])
  again = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert [(o["text"], o["prediction"]) for o in again] == [(o["text"], o["prediction"]) for o in out]
  np.testing.assert_allclose([o["probability"] for o in again], [o["probability"] for o in out],
                             rtol=1e-5)


@pytest.mark.parametrize("decay_steps,warned", [(0, True), (1000, False)])
def test_a_longer_run_warns_only_when_the_learning_rate_jumps(decay_steps, warned, caplog):
  """Pre-training's num_train_steps raised on resume: with the decay tied to it
  (decay_steps=0) the learning rate jumps and the log says so; with a fixed schedule
  length (BERT's decay_steps) nothing changes and nothing is said."""
  import types  # pylint: disable=g-import-not-at-top
  from bert_jax import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  config = tu.tiny_config(num_train_steps=20, schedule__decay_steps=decay_steps)
  fake = types.SimpleNamespace(config=config, inputs=None, total_steps=20,
                               checkpointer=types.SimpleNamespace(directory=epath.Path("/w")))
  caplog.set_level("WARNING")
  trainer_lib.Trainer._check_resume(fake, 10, {checkpointing.SCHEDULE_KEY: 10})  # pylint: disable=protected-access
  assert ("learning-rate schedule now spans 20 steps, not 10" in caplog.text) is warned, caplog.text
