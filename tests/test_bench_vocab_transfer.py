"""bench/quality/vocab_transfer.py (issue 60 item 4): continued pre-training with a new
vocabulary, FVT vs random rows vs the old vocabulary, on books and GLUE files made here."""
import pathlib

import pytest

from bench.quality import vocab_transfer as bench


def test_without_data_it_skips_cleanly(tmp_path, capsys):
  assert bench.main([f"--books={tmp_path / 'absent' / '*.txt'}", f"--glue={tmp_path / 'glue'}",
                     f"--workdir={tmp_path / 'w'}", "--no_record"]) is None
  assert "skipped:" in capsys.readouterr().out and not (tmp_path / "w").exists()


def test_a_glue_training_set_is_cut_to_its_first_rows(tmp_path):
  for task, header in (("CoLA", ""), ("SST-2", "sentence\tlabel\n")):
    d = tmp_path / task
    d.mkdir()
    (d / "train.tsv").write_text(header + "".join(f"row {i}\t{i % 2}\n" for i in range(10)))
    (d / "dev.tsv").write_text(header + "dev\t1\n")
    out = bench.cut(tmp_path / "cut", d, 3)
    lines = (out / "train.tsv").read_text().splitlines()
    assert lines == ([header.strip()] if header else []) + [f"row {i}\t{i % 2}" for i in range(3)]
    assert (out / "dev.tsv").read_text() == (d / "dev.tsv").read_text()


def _glue(root: pathlib.Path) -> pathlib.Path:
  words = "the old man and the sea was a good book to read".split()
  for task, header, n in (("CoLA", "", 48), ("SST-2", "sentence\tlabel\n", 48)):
    d = root / task
    d.mkdir(parents=True)
    for split in ("train", "dev"):
      rows = [" ".join(words[(i + j) % len(words)] for j in range(6)) for i in range(n)]
      body = "".join((f"src\t{i % 2}\t\t{r}\n" if task == "CoLA" else f"{r}\t{i % 2}\n")
                     for i, r in enumerate(rows))
      (d / f"{split}.tsv").write_text(header + body)
  return root


@pytest.mark.slow  # six short jobs of a tiny random ModernBERT (~3-5 min on 2 cores)
def test_smoke_table_of_the_random_modernbert(tmp_path, capsys):
  from input_pipeline import corpus  # pylint: disable=g-import-not-at-top
  books = tmp_path / "books"
  books.mkdir()
  for i, text in enumerate(corpus.iter_texts("default", max_chars=600_000)):
    (books / f"pg1{i:03d}.txt").write_text(text)
  bench.main([f"--books={books / 'pg*.txt'}", f"--glue={_glue(tmp_path / 'glue')}",
              f"--workdir={tmp_path / 'w'}", "--models=modernbert", "--smoke"])
  text = capsys.readouterr().out
  rows = [l for l in text.splitlines() if l.startswith("| ModernBERT (random weights) |")]
  assert [r.split(" | ")[1] for r in rows] == list(bench.ARMS), text
  for r in rows:
    cells = r.split(" | ")
    assert cells[2] != "-" and cells[4] != "-" and cells[5] != "-" and cells[6] != "-", r
  assert "tokens shared with the old vocabulary" in text
