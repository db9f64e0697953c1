"""bench/quality/ablations.py: the pre-training ablations (Table 5, ELECTRA vs masked LM) fine-tuned
through the suite on CoLA and, when its directory is there, SST-2."""
import argparse

import pytest

from bench.quality import ablations
from tests import suite_data

ROW = ("ELECTRA (replaced-token detection)", 3, "step 3: loss 1.0",
       {"cola": {"dev": {"mcc": 12.345}, "spread": {"median": 6.5},
                 "hparams": {"learning_rate": 3e-4}},
        "sst2": {"dev": {"accuracy": 81.25}, "spread": {"median": 80.0},
                 "hparams": {"learning_rate": 1e-4}}}, 10.0, 20.0)


def _args(**kw):
  args = argparse.Namespace(table="electra", workdir="/tmp/w", steps=3, lrs="1e-4",
                                      seeds=1, sst2="/nowhere/sst2")
  vars(args).update(kw)
  return args


def test_table_has_a_column_group_per_task_run():
  flops = {ROW[0]: 13.5e9}
  both = ablations._table(_args(), flops, [ROW], ["cola", "sst2"]).splitlines()
  assert "CoLA dev mcc and SST-2 dev accuracy through the suite" in both[3]
  assert both[5].count("(best) | median | chosen lr |") == 2
  assert both[7] == ("| ELECTRA (replaced-token detection) | 3 | 13.5 | step 3: loss 1.0 | "
                     "12.3 | 6.5 | 0.0003 | 81.2 | 80 | 0.0001 | 10 | 20 |")
  assert both[6].count("|---") == both[7].count(" | ") + 1 == 12
  cola = ablations._table(_args(), flops, [ROW], ["cola"]).splitlines()
  assert "SST-2 not run (/nowhere/sst2 is absent)" in cola[3]
  assert "SST-2" not in cola[5] and cola[7].endswith("| 12.3 | 6.5 | 0.0003 | 10 | 20 |")


@pytest.mark.slow  # two tiny pre-trainings and two suites (~minutes on 2 cores)
def test_electra_table_fine_tunes_on_cola_and_sst2(tmp_path, capsys):
  glue = suite_data.make_glue(tmp_path / "glue", n_train=40)  # the bench batches 32
  ablations.main(["--table=electra", f"--workdir={tmp_path / 'work'}", "--steps=2",
                  "--lrs=1e-3", "--seeds=1", f"--cola={glue / 'CoLA'}",
                  f"--sst2={glue / 'SST-2'}", "--no_record"])
  lines = capsys.readouterr().out.splitlines()
  rows = [l for l in lines if l.startswith("| No NSP") or l.startswith("| ELECTRA")]
  assert len(rows) == 2 and all(r.count(" | ") == 11 for r in rows), lines
  assert (tmp_path / "work" / "electra" / "cola_sst2" / "report.json").exists()
