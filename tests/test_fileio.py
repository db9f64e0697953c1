"""common.fileio: the one path layer (local and gs:// paths)."""
import os
import pathlib
import subprocess
import sys

import pytest

from common import fileio

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_local_paths_become_absolute_and_remote_ones_stay(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert str(fileio.path("run")) == str(tmp_path / "run")
  assert str(fileio.path("gs://bucket/run")) == "gs://bucket/run"
  assert fileio.join("gs://bucket/run/", "vocab", "vocab.txt") == "gs://bucket/run/vocab/vocab.txt"


def test_gs_path_without_the_gcs_client_is_one_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "google.cloud.storage", None)  # import fails
  with pytest.raises(ImportError, match=r"gs://bucket/run .*google-cloud-storage.*pip install"):
    fileio.path("gs://bucket/run")


@pytest.mark.parametrize("module,args", [
    ("bert_jax.main", ["--config=configs/tiny_pretrain.py", "--workdir=gs://bucket/run"]),
    ("bert_jax.predict", ["--checkpoint=gs://bucket/run", "--vocab={vocab}", "--text=a [MASK] b"]),
    ("bert_jax.convert", ["--input=gs://bucket/hf", "--output=/tmp/never"]),
])
def test_entry_points_report_a_missing_gcs_client_in_one_line(module, args, tmp_path):
  """The main job, predict and convert with a gs:// path and no google-cloud-storage: one line
  naming the pip command, exit status 2, no traceback."""
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\n")
  args = [a.format(vocab=vocab) for a in args]
  code = ("import runpy, sys; sys.modules['google.cloud.storage'] = None; "
          f"sys.argv = [{module!r}] + {args!r}; runpy.run_module({module!r}, run_name='__main__')")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=REPO)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert "error: gs://bucket/" in last and "pip install" in last, proc.stderr[-3000:]


def test_completion_marker_and_json(tmp_path):
  d = tmp_path / "out"
  assert fileio.read_json(d / "x.json", default={}) == {}
  fileio.write_json(d / "x.json", {"a": 1})
  assert fileio.read_json(d / "x.json") == {"a": 1}
  assert not fileio.is_complete(d)
  fileio.mark_complete(d)
  assert fileio.is_complete(d)


def test_vocabulary_build_is_complete_or_rebuilt(tmp_path):
  """A vocabulary dir built here counts once its marker is written; one left beside its
  `.tmp` source (a build killed mid-copy on GCS, where a rename is a copy then a delete)
  is rebuilt; one without either (a user's, or built by an atomic local rename) counts."""
  from input_pipeline import build  # pylint: disable=g-import-not-at-top
  vocab = tmp_path / "vocab"
  assert not build.vocab_complete(str(vocab))
  vocab.mkdir()
  (tmp_path / "vocab.tmp").mkdir()
  assert not build.vocab_complete(str(vocab))
  fileio.mark_complete(vocab)
  assert build.vocab_complete(str(vocab))
  (vocab / fileio.COMPLETE_MARKER).unlink()
  (tmp_path / "vocab.tmp").rmdir()
  assert build.vocab_complete(str(vocab))


def test_glob_matches_as_the_pattern_is_spelt(tmp_path, monkeypatch):
  for name in ("a/x1.txt", "a/x2.txt", "a/y.txt", "b/x3.txt", "b/sub/x4.txt"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text("t")
  monkeypatch.chdir(tmp_path)
  assert fileio.glob("a/x*.txt") == ["a/x1.txt", "a/x2.txt"]
  assert fileio.glob("*/x?.txt") == ["a/x1.txt", "a/x2.txt", "b/x3.txt"]
  assert fileio.glob(f"{tmp_path}/b/*") == [f"{tmp_path}/b/sub", f"{tmp_path}/b/x3.txt"]
  assert fileio.glob("a/y.txt") == ["a/y.txt"] and fileio.glob("a/none*") == []


def test_a_manifest_write_cut_short_leaves_no_manifest(tmp_path, monkeypatch):
  """A process killed while writing a checkpoint's MANIFEST.json must not leave a partial
  one: the next run would call the checkpoint damaged and (being the only one) refuse to
  resume. Cut short, the step is unverified (no manifest), as before the write began."""
  (tmp_path / "state").mkdir()
  (tmp_path / "state" / "a.bin").write_bytes(b"x" * 1000)
  real = fileio.epath.Path.write_text

  def dies_halfway(self, text, *args, **kwargs):
    real(self, text[:len(text) // 2], *args, **kwargs)
    raise KeyboardInterrupt("killed")

  monkeypatch.setattr(fileio.epath.Path, "write_text", dies_halfway)
  with pytest.raises(KeyboardInterrupt):
    fileio.write_manifest(tmp_path)
  monkeypatch.undo()
  assert fileio.verify_manifest(tmp_path) is None
  fileio.write_manifest(tmp_path)  # a later complete write is read back intact
  assert fileio.verify_manifest(tmp_path) == []
