"""bench/quality/embed_quality.py runs end to end (--smoke: 4 books, a 4-step encoder, one epoch)."""
import json
import subprocess
import sys

import pytest

from bench.quality import embed_quality
from tests import test_train_utils as tu


@pytest.mark.slow
def test_embed_quality_smoke(tmp_path):
  if not embed_quality.GUTENBERG.is_dir():
    pytest.skip("../shared/data/gutenberg is absent")
  proc = subprocess.run([sys.executable, "-m", "bench.quality.embed_quality", "--smoke", "--no_record",
                         f"--workdir={tmp_path}"], cwd=tu.REPO, env=tu.env(), capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [l for l in proc.stdout.splitlines() if l.startswith("| ")]
  # the header, then "before" and one row per seed (the |---| rule does not start with "| ")
  assert [r.split(" | ")[0] for r in rows[1:]] == [
      "| before (the encoder, mean pooling)", "| contrastive fine-tuning, seed 0",
      "| contrastive fine-tuning, seed 1"], proc.stdout
  if embed_quality.STSB_DEV.exists():  # each encoder's STS-B dev Spearman beside retrieval
    assert "STS-B dev Spearman" in rows[0], rows[0]
    assert all(-100 <= float(r.split(" | ")[4]) <= 100 for r in rows[1:]), rows
  assert (tmp_path / "data" / "beir" / "qrels" / "test.tsv").exists()
  first = json.loads((tmp_path / "data" / "train.jsonl").read_text().splitlines()[0])
  assert set(first) == {"anchor", "positive"} and first["anchor"] and first["positive"]
