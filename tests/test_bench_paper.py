"""bench/quality/paper.py (issue 36 item 5): the paper's Tables 6, 7, 8 and Figure 2, one command each."""
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.quality import paper
from input_pipeline import tagging


def test_the_synthetic_tagging_set_is_conll_with_both_entity_kinds(tmp_path):
  paper.make_synthetic_ner(tmp_path, sentences=200)
  train = tagging.read_conll(str(tmp_path / "train.txt"))
  dev = tagging.read_conll(str(tmp_path / "valid.txt"))
  assert len(train) == 180 and len(dev) == 20
  tags = {t for _, ts in train for t in ts}
  assert {"O", "B-CODE", "B-NAME"} <= tags and tags <= {"O", "B-CODE", "I-CODE", "B-NAME", "I-NAME"}
  assert all(any(t != "O" for t in ts) for _, ts in train[:50])  # sentences naming code


def test_without_data_it_skips_cleanly(tmp_path, capsys, monkeypatch):
  """No GLUE data given and CoLA absent from its default place (a fresh clone): skipped."""
  monkeypatch.setattr(paper, "COLA", tmp_path / "absent")
  paper.main(["--table=6", f"--workdir={tmp_path / 'w'}", "--no_record"])
  assert "skipped:" in capsys.readouterr().out and not (tmp_path / "w").exists()


@pytest.mark.parametrize("table,flag", [("6", "--glue_dir"), ("fig2", "--glue_dir"),
                                        ("6", "--cola_dir"), ("7", "--conll_dir"),
                                        ("8", "--conll_dir")])
def test_a_wrong_input_directory_is_one_line_before_any_pretraining(tmp_path, capsys, table,
                                                                      flag):
  """A mistyped --glue_dir / --conll_dir / --cola_dir: exit 2 and one line naming the
  missing file, before any pre-training (it pre-trained a row for minutes, then exited 1
  with its child's command line; a wrong --cola_dir alone was "skipped", exit 0)."""
  from tests import suite_data  # pylint: disable=g-import-not-at-top
  suite_data.make_glue(tmp_path / "glue")  # a real CoLA for the other flags
  typo = tmp_path / "typo"
  args = [f"--table={table}", f"--workdir={tmp_path / 'w'}", "--no_record",
          f"--cola_dir={tmp_path / 'glue' / 'CoLA'}", f"{flag}={typo}"]
  with pytest.raises(SystemExit) as exit_:
    paper.main(args)
  err = capsys.readouterr().err.strip()
  assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
  assert err.startswith(f"bench.quality.paper: {flag}: ") and str(typo) in err and "nothing was run" in err
  assert not (tmp_path / "w" / f"table_{table}" / "pretrain").exists()


def test_tfds_glue_is_left_to_the_suite(tmp_path):
  """--glue_dir=tfds[:DIR] is the suite's own TFDS source, not a directory of TSV files."""
  args = paper.argparse.Namespace(table="6", glue_dir="tfds", conll_dir="",
                                  cola_dir=str(tmp_path / "absent"))
  assert paper.check_inputs(args, explicit_cola=False) is None


def test_a_failing_job_ends_with_its_own_error_line_and_exit_2(tmp_path, capsys):
  fail = ("import sys; print('progress...'); "
          "print('ConfigError: --config.x=1: what to do.', file=sys.stderr); sys.exit(2)")
  log = tmp_path / "job.log"
  log.write_text("an earlier run's line\n")
  with pytest.raises(SystemExit) as exit_:
    paper._run([sys.executable, "-c", fail, "--config=configs/conll.py"], log)  # pylint: disable=protected-access
  err = capsys.readouterr().err.strip()
  assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
  assert "configs/conll.py failed (exit 2): ConfigError: --config.x=1: what to do." in err
  assert str(log) in err


@pytest.mark.slow
def test_table_7_end_to_end_and_a_rerun_or_a_kill_9_midway_writes_the_same_table(tmp_path, capsys):
  """From nothing: pre-training, the synthetic NER set, fine-tuning and the six feature-based
  rows; a rerun finds every step finished and writes the same table, and the command killed
  (-9, with the job it runs) during its third row then rerun writes the same table as the
  run that was never interrupted."""
  from tests import suite_data  # pylint: disable=g-import-not-at-top
  suite_data.make_glue(tmp_path / "glue")
  common = ["--table=7", "--steps=20", "--epochs=1", f"--cola_dir={tmp_path / 'glue' / 'CoLA'}",
            "--no_record"]
  args = common + [f"--workdir={tmp_path / 'w'}"]
  paper.main(args)
  first = (tmp_path / "w" / "table_7.md").read_text()
  rows = [l for l in first.splitlines() if l.startswith("| ") and "paper" not in l]
  assert [r.split(" | ")[0][2:] for r in rows] == [name for name, _ in paper.TABLE7]
  assert "| concat last four hidden | " in first and "| 96.1 |" in first
  paper.main(args)
  assert (tmp_path / "w" / "table_7.md").read_text().split("\n", 3)[3] == first.split("\n", 3)[3]

  killed = common + [f"--workdir={tmp_path / 'k'}"]
  proc = subprocess.Popen([sys.executable, "-m", "bench.quality.paper", *killed], cwd=paper.REPO,
                          start_new_session=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  third = tmp_path / "k" / "table_7" / "ner" / f"t7_{paper.TABLE7[2][1]}"
  deadline = time.time() + 900
  while not third.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.5)
  time.sleep(4)  # into the row's job: start-up, compilation or training
  assert proc.poll() is None, "the command ended before it could be killed"
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  assert not (tmp_path / "k" / "table_7.md").exists()
  paper.main(killed)
  table = lambda text: [l for l in text.splitlines() if l.startswith("| ")]
  assert table((tmp_path / "k" / "table_7.md").read_text()) == table(first)


def test_a_kill_while_writing_the_tagging_set_leaves_none_that_a_rerun_trusts(tmp_path,
                                                                              monkeypatch):
  """conll_dir trusts a synthetic set whose valid.txt exists: a kill while writing it must
  not leave a partial file there (a rerun would train and score on part of it)."""
  import pathlib  # pylint: disable=g-import-not-at-top
  write = pathlib.Path.write_text

  def killed_halfway(self, text, *a, **k):
    if "valid" in self.name:
      write(self, text[:len(text) // 2], *a, **k)
      raise KeyboardInterrupt("kill -9")
    return write(self, text, *a, **k)

  args = type("Args", (), {"conll_dir": ""})()
  monkeypatch.setattr(pathlib.Path, "write_text", killed_halfway)
  monkeypatch.setattr(paper, "make_synthetic_ner",
                      lambda out, sentences=3000, seed=0, f=paper.make_synthetic_ner: f(out, 200))
  with pytest.raises(KeyboardInterrupt):
    paper.conll_dir(tmp_path, args)
  monkeypatch.setattr(pathlib.Path, "write_text", write)
  out = paper.conll_dir(tmp_path, args)
  assert len(tagging.read_conll(str(out / "valid.txt"))) == 20
