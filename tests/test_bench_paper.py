"""bench/paper.py (issue 36 item 5): the paper's Tables 6, 7, 8 and Figure 2, one command each."""
import pytest

from bench import paper
from input_pipeline import tagging


def test_the_synthetic_tagging_set_is_conll_with_both_entity_kinds(tmp_path):
  paper.make_synthetic_ner(tmp_path, sentences=200)
  train = tagging.read_conll(str(tmp_path / "train.txt"))
  dev = tagging.read_conll(str(tmp_path / "valid.txt"))
  assert len(train) == 180 and len(dev) == 20
  tags = {t for _, ts in train for t in ts}
  assert {"O", "B-CODE", "B-NAME"} <= tags and tags <= {"O", "B-CODE", "I-CODE", "B-NAME", "I-NAME"}
  assert all(any(t != "O" for t in ts) for _, ts in train[:50])  # sentences naming code


def test_without_data_it_skips_cleanly(tmp_path, capsys):
  paper.main(["--table=6", f"--cola_dir={tmp_path / 'absent'}", f"--workdir={tmp_path / 'w'}",
              "--no_record"])
  assert "skipped:" in capsys.readouterr().out and not (tmp_path / "w").exists()


@pytest.mark.slow
def test_table_7_end_to_end_and_a_rerun_writes_the_same_table(tmp_path, capsys):
  """From nothing: pre-training, the synthetic NER set, fine-tuning and the six feature-based
  rows; a rerun finds every step finished and writes the same table."""
  from tests import suite_data  # pylint: disable=g-import-not-at-top
  suite_data.make_glue(tmp_path / "glue")
  args = ["--table=7", "--steps=20", "--epochs=1", f"--workdir={tmp_path / 'w'}",
          f"--cola_dir={tmp_path / 'glue' / 'CoLA'}", "--no_record"]
  paper.main(args)
  first = (tmp_path / "w" / "table_7.md").read_text()
  rows = [l for l in first.splitlines() if l.startswith("| ") and "paper" not in l]
  assert [r.split(" | ")[0][2:] for r in rows] == [name for name, _ in paper.TABLE7]
  assert "| concat last four hidden | " in first and "| 96.1 |" in first
  paper.main(args)
  assert (tmp_path / "w" / "table_7.md").read_text().split("\n", 3)[3] == first.split("\n", 3)[3]
