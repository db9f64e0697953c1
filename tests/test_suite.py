"""The fine-tuning suite (bert_jax/suite.py): the whole GLUE suite end to end on tiny files in
the download's formats, its report and submission, resume after kill -9, and bad inputs."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile

import ml_collections
import numpy as np
import pytest

from bert_jax import finetune, main, suite, suite_report
from bert_jax.configs import suite as suite_config
from bert_jax.metrics import NonFiniteLossError
from common import errors
from tests import suite_data
from tests import test_train_utils as tu

GLUE_LABELS = {"CoLA.tsv": {"0", "1"}, "SST-2.tsv": {"0", "1"}, "MRPC.tsv": {"0", "1"},
               "QQP.tsv": {"0", "1"}, "WNLI.tsv": {"0", "1"},
               "MNLI-m.tsv": set(suite_data.MNLI_LABELS), "MNLI-mm.tsv": set(suite_data.MNLI_LABELS),
               "AX.tsv": set(suite_data.MNLI_LABELS),
               "QNLI.tsv": {"entailment", "not_entailment"}, "RTE.tsv": {"entailment", "not_entailment"}}
TEST_FILE = {"CoLA.tsv": "CoLA/test.tsv", "SST-2.tsv": "SST-2/test.tsv", "MRPC.tsv": "MRPC/test.tsv",
             "STS-B.tsv": "STS-B/test.tsv", "QQP.tsv": "QQP/test.tsv", "MNLI-m.tsv": "MNLI/test_matched.tsv",
             "MNLI-mm.tsv": "MNLI/test_mismatched.tsv", "QNLI.tsv": "QNLI/test.tsv",
             "RTE.tsv": "RTE/test.tsv", "WNLI.tsv": "WNLI/test.tsv", "AX.tsv": "diagnostic/diagnostic.tsv"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  root = tmp_path_factory.mktemp("suite_inputs")
  suite_data.make_glue(root / "data")
  suite_data.make_squad2(root / "data")
  ckpt, vocab = suite_data.make_checkpoint(root / "model")
  return {"data": str(root / "data"), "ckpt": ckpt, "vocab": vocab}


def _config(inputs, tasks="glue", lrs=(1e-3, 5e-4), epochs=1, seeds=2, **overrides):
  c = suite_config.get_config(tasks)
  c.init_checkpoint, c.vocab_path, c.data_dir = inputs["ckpt"], inputs["vocab"], inputs["data"]
  c.protocol = "grid"
  c.grid.learning_rate, c.grid.global_batch_size, c.grid.num_epochs = lrs, (8,), (epochs,)
  c.seeds = seeds
  c.eval_batch_size = 8
  c.max_seq_length = 32
  c.log_every_steps = 0
  for key, value in overrides.items():
    assert key in c, key
    c[key] = value
  return c


def _flat(d, prefix=""):
  for k, v in d.items():
    if isinstance(v, ml_collections.ConfigDict):
      yield from _flat(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def _args(c) -> list[str]:
  """The command-line flags that turn configs/suite.py into config `c`."""
  base = dict(_flat(suite_config.get_config()))
  return [f"--config.{k}={v}" for k, v in _flat(c) if base.get(k) != v]


@pytest.fixture(scope="module")
def glue_run(inputs, tmp_path_factory):
  """The whole glue suite, 2 settings x 2 seeds, one epoch each."""
  work = tmp_path_factory.mktemp("glue_suite") / "w"
  report = main.run(_config(inputs), str(work))
  return work, report


def _strip_times(obj):
  if isinstance(obj, dict):
    return {k: _strip_times(v) for k, v in obj.items() if k != "seconds"}
  if isinstance(obj, list):
    return [_strip_times(v) for v in obj]
  return obj


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_glue_suite_reports_every_task_with_its_seed_spread(glue_run):
  work, report = glue_run
  saved = json.loads((work / "report.json").read_text())
  assert saved == json.loads(json.dumps(report, sort_keys=True))
  assert set(saved["tasks"]) == set(suite_config.GLUE_TASKS)
  for task, t in saved["tasks"].items():
    assert t["status"] == "done", task
    metric = suite.METRICS[task][0]
    assert [s["name"] for s in t["settings"]] == ["lr0.001_b8_e1", "lr0.0005_b8_e1"]
    for s in t["settings"]:
      values = [r["dev"][metric] for r in s["runs"]]
      assert len(values) == s["n"] == 2 and [r["seed"] for r in s["runs"]] == [0, 1]
      assert s["median"] == pytest.approx(np.median(values))
      assert s["mean"] == pytest.approx(np.mean(values))
      assert s["std"] == pytest.approx(np.std(values, ddof=1))
      for r in s["runs"]:  # the run's own best epoch, in percent
        best = json.loads((work / r["dir"] / finetune.METRICS_FILE).read_text())["best"]
        assert r["dev"][metric] == pytest.approx(100.0 * best[metric])
    # The chosen setting holds the best run over all settings (the paper's choice).
    best_value = max(r["dev"][metric] for s in t["settings"] for r in s["runs"])
    assert t["best_run"]["dev"][metric] == best_value == t["dev"][metric]
    chosen = next(s for s in t["settings"] if s["name"] == t["chosen"])
    assert t["best_run"] in chosen["runs"]
    assert t["spread"] == {k: chosen[k] for k in ("median", "mean", "std", "n")}
  mnli = saved["tasks"]["mnli"]
  assert 0 <= mnli["dev"]["accuracy_mismatched"] <= 100
  score = saved["glue_score"]
  parts = [saved["tasks"][t]["dev"][m] for t, m in suite_report.GLUE_SCORE_PARTS]
  assert score["score"] == pytest.approx(np.mean(parts)) and len(parts) == 9
  md = (work / "report.md").read_text()
  for task in suite_config.GLUE_TASKS:
    assert f"| {task} |" in md
  assert "| glue_score |" in md and "79.6" in md and "82.1" in md  # the paper's rows beside ours
  assert (work / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # 36 runs, 2 learning rates: one compiled train step per model shape (2, 1 and 3 labels).
  steps = [p for p in os.listdir(work / "xla_cache") if p.startswith("jit_scheduled_step-")]
  assert len(steps) == 3, steps


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_malformed_glue_rows_are_counted_in_the_report(glue_run):
  """QQP's train.tsv holds a row with columns missing: skipped as the original code does,
  and counted in report.json and report.md (issue 35 item 8)."""
  work, _ = glue_run
  saved = json.loads((work / "report.json").read_text())
  assert saved["tasks"]["qqp"]["skipped_rows"] == {"train.tsv": 1}
  assert [t for t, v in saved["tasks"].items() if "skipped_rows" in v] == ["qqp"]
  assert ("Malformed rows skipped (columns missing; the original BERT code skips them too): "
          "qqp train.tsv: 1.") in (work / "report.md").read_text()


@pytest.mark.slow  # (the default suite's time: ~12 minutes on 2 cores)
def test_a_second_suite_on_the_same_model_compiles_nothing(inputs, tmp_path):
  cache = tmp_path / "cache"
  main.run(_config(inputs, tasks="cola", seeds=1, compilation_cache_dir=str(cache)),
           str(tmp_path / "first"))
  compiled = sorted(os.listdir(cache))
  assert any(p.startswith("jit_scheduled_step-") for p in compiled)
  main.run(_config(inputs, tasks="cola", lrs=(2e-4,), epochs=2, seeds=2,
                   compilation_cache_dir=str(cache)), str(tmp_path / "second"))
  assert sorted(os.listdir(cache)) == compiled  # every program came from the cache


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_glue_submission_zip_holds_every_file_with_its_rows_and_labels(glue_run, inputs):
  work, report = glue_run
  z = zipfile.ZipFile(work / "submission" / suite.ZIP_NAME)
  assert sorted(z.namelist()) == sorted(TEST_FILE)
  assert report["submission"]["missing"] == []
  for name, source in TEST_FILE.items():
    rows = z.read(name).decode().splitlines()
    assert rows[0] == "index\tprediction"
    test_rows = (suite_data.AX_ROWS if name == "AX.tsv" else
                 suite_data.TEST_ROWS[{v: k for k, v in suite_data.DIRS.items()}[source.split("/")[0]]])
    assert len(rows) == 1 + test_rows, name
    ids = [r.split("\t")[0] for r in rows[1:]]
    gold_ids = [line.split("\t")[0] for line in
                open(os.path.join(inputs["data"], source)).read().splitlines()[1:]]
    assert ids == gold_ids, name
    preds = [r.split("\t")[1] for r in rows[1:]]
    if name == "STS-B.tsv":
      assert all(0.0 <= float(p) <= 5.0 for p in preds)
    else:
      assert set(preds) <= GLUE_LABELS[name], name


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_rerun_skips_finished_runs_and_writes_the_identical_report(glue_run, inputs, monkeypatch):
  work, _ = glue_run
  before = {p: (work / p).read_bytes() for p in ("report.json", "report.md",
                                                 f"submission/{suite.ZIP_NAME}")}

  def no_training(*_):
    raise AssertionError("a finished run was trained again")
  monkeypatch.setattr(finetune, "finetune", no_training)
  main.run(_config(inputs), str(work))
  for p, data in before.items():
    assert (work / p).read_bytes() == data, p


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_a_failed_run_is_reported_and_the_suite_goes_on(inputs, tmp_path, monkeypatch):
  real = finetune.finetune

  def diverge_on_cola(config, workdir, devices=None):
    if "/cola/" in workdir and config.opt.learning_rate == 1e-3:
      raise NonFiniteLossError("Non-finite values {'loss': nan} at training step 2")
    return real(config, workdir, devices)
  monkeypatch.setattr(finetune, "finetune", diverge_on_cola)
  work = tmp_path / "w"
  report = main.run(_config(inputs, tasks="cola,sst2", seeds=1), str(work))
  cola = report["tasks"]["cola"]
  failed = cola["settings"][0]["runs"][0]
  assert failed["status"] == "failed" and "NonFiniteLossError" in failed["error"]
  assert cola["status"] == "done" and cola["chosen"] == "lr0.0005_b8_e1"  # the other setting
  assert report["tasks"]["sst2"]["status"] == "done"
  assert "| cola | lr0.001_b8_e1 | 0 | failed |" in (work / "report.md").read_text()
  # Failed runs stay failed on a rerun; retry_failed runs them again.
  monkeypatch.setattr(finetune, "finetune", real)
  assert main.run(_config(inputs, tasks="cola,sst2", seeds=1), str(work))["tasks"]["cola"][
      "settings"][0]["runs"][0]["status"] == "failed"
  again = main.run(_config(inputs, tasks="cola,sst2", seeds=1, retry_failed=True), str(work))
  assert again["tasks"]["cola"]["settings"][0]["runs"][0]["status"] == "done"


@pytest.mark.slow  # (the default suite's time: ~12 minutes on 2 cores)
def test_squad2_suite_writes_the_official_prediction_json(inputs, tmp_path):
  work = tmp_path / "w"
  report = main.run(_config(inputs, tasks="squad2", lrs=(1e-3,), seeds=1, max_seq_length=128),
                    str(work))
  t = report["tasks"]["squad2"]
  assert t["status"] == "done" and set(t["dev"]) >= {"f1", "exact"}
  preds = json.loads((work / "submission" / "squad2_dev_predictions.json").read_text())
  assert sorted(preds) == [f"q{i}" for i in range(8)] + ["qx"]
  assert all(isinstance(v, str) for v in preds.values())
  assert (work / "submission" / "squad2_dev_null_odds.json").exists()
  assert "glue_score" not in report and not (work / "submission" / suite.ZIP_NAME).exists()


@pytest.mark.slow  # (the default suite's time: ~12 minutes on 2 cores)
def test_embed_suite_reports_sts_and_retrieval_with_its_seed_spread(inputs, tmp_path):
  work = tmp_path / "w"
  c = _config(inputs, tasks="embed", lrs=(1e-3,), seeds=2)
  c.task_dirs.embed = str(suite_data.make_embed(tmp_path / "data"))
  report = main.run(c, str(work))
  t = report["tasks"]["embed"]
  assert t["status"] == "done" and t["metric"] == "spearman" and t["spread"]["n"] == 2
  assert set(t["dev"]) >= {"spearman", "pearson", "beir_ndcg@10", "beir_recall@100",
                           "beir_mrr@10"}, t["dev"]
  run = json.loads((work / t["best_run"]["dir"] / "metrics.json").read_text())
  assert run["main_metric"] == "spearman"  # best/ and the suite choose on the same metric
  assert t["dev"]["spearman"] == pytest.approx(run["best"]["spearman"])
  assert (work / "submission" / "embed_dev_dev_similarities.tsv").read_text().startswith("line\t")
  markdown = (work / "report.md").read_text()
  assert re.search(r"\| embed \| spearman \| -?[0-9.]+ \(pearson", markdown), markdown
  assert "glue_score" not in report


@pytest.mark.slow  # (the default suite's time: ~12 minutes on 2 cores)
def test_tasks_start_from_the_chosen_mnli_run_when_asked(inputs, tmp_path):
  work = tmp_path / "w"
  report = main.run(_config(inputs, tasks="rte,mnli", lrs=(1e-3,), seeds=1, init_from_mnli="rte"),
                    str(work))
  mnli_dir = report["tasks"]["mnli"]["best_run"]["dir"]
  rte = json.loads(next((work / "runs" / "rte").rglob("result.json")).read_text())
  assert rte["config"]["init_checkpoint"] == str(work / mnli_dir / "best")
  assert list(report["tasks"]) == ["mnli", "rte"]  # MNLI runs first


# ----------------------------------------------------------------------------
# Bad input: one line naming the task and file, before any run starts.

@pytest.mark.parametrize("change,message", [
    (dict(tasks="glue,cola2"), "unknown task cola2"),
    (dict(protocol="papr"), "--config.protocol='papr' is unknown"),
    (dict(grid_lr=()), "grid.learning_rate holds no values"),
    (dict(select="mean"), "--config.select='mean'"),
    (dict(init_from_mnli="rte"), "needs mnli among the suite's tasks"),
    (dict(seeds=0), "--config.seeds=0"),
])
def test_bad_suite_config_is_refused_before_any_run(inputs, tmp_path, change, message):
  change = dict(change)
  lrs = change.pop("grid_lr", (1e-3,))
  tasks = change.pop("tasks", "cola,rte")
  c = _config(inputs, tasks=tasks, lrs=lrs, **change)
  with pytest.raises(errors.ConfigError, match=re.escape(message)):
    main.run(c, str(tmp_path / "w"))
  assert not (tmp_path / "w" / "runs").exists()


def test_missing_task_directory_or_bad_file_names_the_task_and_file(inputs, tmp_path):
  data = tmp_path / "data"
  shutil.copytree(inputs["data"], data)
  shutil.rmtree(data / "RTE")
  c = _config(dict(inputs, data=str(data)), tasks="cola,rte")
  with pytest.raises(errors.UserError, match=r"Task rte: .*RTE/train.tsv does not exist"):
    main.run(c, str(tmp_path / "w"))
  assert not (tmp_path / "w" / "runs").exists()
  shutil.copytree(inputs["data"] + "/RTE", data / "RTE")
  (data / "RTE" / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
  with pytest.raises(errors.UserError, match=r"Task rte: .*RTE/dev.tsv:2: label 'maybe'"):
    main.run(c, str(tmp_path / "w"))
  c.grid.global_batch_size = (8, 32)
  with pytest.raises(errors.UserError, match=r"Task cola: 24 training examples are fewer than one "
                                             r"batch of 32 \(--config.grid.global_batch_size\)"):
    main.run(c, str(tmp_path / "w"))


@pytest.mark.slow
def test_bad_input_after_finished_runs_is_one_line_and_loses_nothing(inputs, tmp_path):
  """The CLI: exit 2, one line naming the task and file; finished runs and their results stay."""
  data = tmp_path / "data"
  shutil.copytree(inputs["data"], data)
  work = tmp_path / "w"
  c = _config(dict(inputs, data=str(data)), tasks="cola", lrs=(1e-3,), seeds=1)
  main.run(c, str(work))
  finished = {p: p.read_bytes() for p in work.rglob("*") if p.is_file() and "xla_cache" not in str(p)}
  (data / "MRPC").rename(data / "MRPC_moved")
  c.tasks = "cola,mrpc"
  proc = subprocess.run([sys.executable, "-m", "bert_jax.main",
                         f"--config={tu.REPO / 'configs' / 'suite.py'}", f"--workdir={work}",
                         *_args(c)], capture_output=True, text=True, cwd=tu.REPO, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors_ = [l for l in proc.stderr.splitlines() if "error:" in l]
  assert len(errors_) == 1 and "Task mrpc:" in errors_[0] and "MRPC/train.tsv" in errors_[0], proc.stderr[-2000:]
  for p, data_ in finished.items():
    assert p.read_bytes() == data_, p
  # Another checkpoint on the same workdir: the finished runs are not reused for it.
  other, _ = suite_data.make_checkpoint(tmp_path / "other")
  c = _config(dict(inputs, data=str(data), ckpt=other), tasks="cola", lrs=(1e-3,), seeds=1)
  with pytest.raises(errors.ConfigError, match=r"finished with another config.*init_checkpoint"):
    main.run(c, str(work))
  for p, data_ in finished.items():
    assert p.read_bytes() == data_, p


@pytest.mark.slow  # (the default suite's time: ~12 minutes on 2 cores)
def test_parallel_runs_on_device_groups_match_runs_in_sequence(inputs, tmp_path):
  """parallel_runs=2 on 2 devices: two runs at a time, one device each; the report is that
  of the same runs one after another on a 1-device host."""
  c = _config(inputs, tasks="cola,sst2", seeds=2)
  sequence = _invoke(tmp_path / "sequence", c, devices=1)
  assert sequence.returncode == 0, sequence.stderr[-3000:]
  c.parallel_runs = 2
  parallel = _invoke(tmp_path / "parallel", c, devices=2)
  assert parallel.returncode == 0, parallel.stderr[-3000:]
  assert "2 runs at a time, each on 1 of this host's 2 devices" in parallel.stderr
  ref, got = (json.loads((tmp_path / w / "report.json").read_text()) for w in ("sequence", "parallel"))
  assert all(t["status"] == "done" for t in got["tasks"].values())
  assert _strip_times(got) == _strip_times(ref)


# ----------------------------------------------------------------------------
# kill -9 anywhere: in a run, between runs, while writing the report; the rerun's report
# is the one an uninterrupted suite writes.

_DRIVER = r"""
import os, runpy, signal, sys
point = os.environ["SUITE_KILL_AT"]
from bert_jax import finetune, suite
from common import fileio

def kill():
  os.kill(os.getpid(), signal.SIGKILL)

if point == "in_run":  # after the 2nd run's first epoch is evaluated (its checkpoint not yet saved)
  evaluate = finetune._DevEvaluation.__call__
  def evaluated(self, step, state):
    evaluate(self, step, state)
    if "lr0.0005" in str(self.out_dir) and "/cola/" in str(self.out_dir):
      kill()
  finetune._DevEvaluation.__call__ = evaluated
elif point == "between_runs":  # the first run this invocation finishes has its result.json
  run_one = suite._run_one
  def ran(*args, **kwargs):
    result = run_one(*args, **kwargs)
    kill()
  suite._run_one = ran
elif point == "in_report":  # report.png and the zip written, report.md being written
  write = fileio.write_bytes_atomic
  def written(p, data):
    if str(p).endswith("report.md"):
      tmp = fileio.path(p).parent / ".report.md.tmp-x"
      tmp.write_bytes(data[: len(data) // 2])
      kill()
    write(p, data)
  fileio.write_bytes_atomic = written
sys.argv = ["bert_jax.main"] + sys.argv[1:]
runpy.run_module("bert_jax.main", run_name="__main__")
"""


def _invoke(work, c, point=None, devices=1):
  env = dict(tu.env(devices), SUITE_KILL_AT=point or "none", PYTHONPATH=str(tu.REPO))
  return subprocess.run([sys.executable, "-c", _DRIVER, f"--config={tu.REPO / 'configs' / 'suite.py'}",
                         f"--workdir={work}", *_args(c)], capture_output=True, text=True,
                        cwd=tu.REPO, env=env, timeout=600)


def _markdown_without_times(text):
  return re.sub(r"\| (\d+h\d+m|\d+m\d+s|\d+s|-) \|", "| T |", text)


@pytest.mark.slow  # ~110 s: the default suite keeps to its time (CI runs the slow tier)
def test_kill_9_at_three_points_then_rerun_gives_the_identical_report(inputs, tmp_path):
  c = _config(inputs, tasks="cola,mnli", epochs=2, seeds=1)
  reference = tmp_path / "reference"
  main.run(c, str(reference))
  work = tmp_path / "killed"
  for point in ("in_run", "between_runs", "in_report"):
    proc = _invoke(work, c, point)
    assert proc.returncode == -signal.SIGKILL, (point, proc.stderr[-3000:])
  assert not (work / "report.json").exists()  # killed before the report was complete
  proc = _invoke(work, c)
  assert proc.returncode == 0, proc.stderr[-3000:]
  ref, got = (json.loads((w / "report.json").read_text()) for w in (reference, work))
  assert _strip_times(got) == _strip_times(ref)
  assert _markdown_without_times((work / "report.md").read_text()) == _markdown_without_times(
      (reference / "report.md").read_text())
  assert (work / "submission" / suite.ZIP_NAME).read_bytes() == (
      reference / "submission" / suite.ZIP_NAME).read_bytes()
  # The interrupted run resumed from its checkpoint (two epochs in its history, as uninterrupted).
  for w in (reference, work):
    hist = json.loads((w / "runs/cola/lr0.0005_b8_e2/seed0" / finetune.METRICS_FILE).read_text())
    assert [e["epoch"] for e in hist["epochs"]] == [1, 2]


@pytest.mark.slow
def test_paper_protocol_on_real_cola_reports_mcc_with_its_seed_spread(shared_data_dir, tmp_path):
  """The paper's GLUE protocol (batch 32, 3 epochs, lr among 5e-5..2e-5) on CoLA 1.1 from a
  tiny random checkpoint, two seeds per setting."""
  cola = shared_data_dir / "cola" / "raw"
  from input_pipeline import glue  # pylint: disable=g-import-not-at-top
  texts = [e.text_a for e in glue.read_glue("cola", str(cola), "train") + glue.read_glue(
      "cola", str(cola), "dev")]
  ckpt, vocab = suite_data.make_checkpoint(tmp_path / "model", texts=texts)
  c = suite_config.get_config("cola")
  c.init_checkpoint, c.vocab_path, c.task_dirs.cola = ckpt, vocab, str(cola)
  c.seeds, c.log_every_steps = 2, 0
  report = main.run(c, str(tmp_path / "w"))
  t = report["tasks"]["cola"]
  assert [s["name"] for s in t["settings"]] == [f"lr{lr:g}_b32_e3" for lr in (5e-5, 4e-5, 3e-5, 2e-5)]
  assert all(s["n"] == 2 and s["std"] is not None for s in t["settings"])
  assert -100 <= t["dev"]["mcc"] <= 100 and t["spread"]["n"] == 2
  md = (tmp_path / "w" / "report.md").read_text()
  assert "| cola | mcc |" in md
  print(md)


def test_report_header_gives_the_init_checkpoints_held_out_perplexity(tmp_path):
  """Issue 36 item 3: the suite's report names the pre-training run's last held-out
  masked-LM perplexity (from its metrics.json) beside init_checkpoint."""
  from bert_jax import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  metrics_lib.record_eval(str(tmp_path), 100, {"mlm_loss": 1.543, "mlm_perplexity": 4.6787})
  metrics_lib.record_eval(str(tmp_path), 50, {"mlm_loss": 2.0, "mlm_perplexity": 7.389})
  c = suite_config.get_config("cola")
  c.init_checkpoint = str(tmp_path)
  report = suite.build_report(c, [], {}, {}, {})
  assert report["init_mlm_perplexity"] == {"step": 100, "value": 4.6787}
  assert (f"init_checkpoint: `{tmp_path}` (held-out masked-LM perplexity 4.68 at step 100); "
          "setting chosen by") in suite_report.render_markdown(report)
  c.init_checkpoint = str(tmp_path / "hf")  # a checkpoint without evaluations: no figure
  report = suite.build_report(c, [], {}, {}, {})
  assert report["init_mlm_perplexity"] is None
  assert f"init_checkpoint: `{tmp_path / 'hf'}`; setting chosen by" in suite_report.render_markdown(report)


def test_the_suite_corrects_adams_bias_by_default_and_the_report_says_which(tmp_path):
  """Issue 58 item 2, decided by bench/quality/suite_glue.py and bench/quality/suite_conll.py on the real
  files: the suite's default is AdamW with bias correction (what transformers' AdamW does,
  the numbers users compare with); the paper's optimizer stays a field, and the report's
  header names the one its runs used."""
  from bert_jax.configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  c = suite_config.get_config("cola")
  assert c.opt.bias_correction is True
  assert finetune_config.get_config().opt.bias_correction is False  # the job alone: the paper's
  c.init_checkpoint = str(tmp_path)
  md = suite_report.render_markdown(suite.build_report(c, [], {}, {}, {}))
  assert "Optimizer: AdamW with bias correction (transformers'); " in md, md
  c.opt.bias_correction = False
  md = suite_report.render_markdown(suite.build_report(c, [], {}, {}, {}))
  assert "Optimizer: AdamW without bias correction (the BERT paper's); " in md, md
