"""bert_jax.fileio: the one path layer (local and gs:// paths)."""
import sys

import pytest

from bert_jax import fileio


def test_local_paths_become_absolute_and_remote_ones_stay(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert str(fileio.path("run")) == str(tmp_path / "run")
  assert str(fileio.path("gs://bucket/run")) == "gs://bucket/run"
  assert fileio.join("gs://bucket/run/", "vocab", "vocab.txt") == "gs://bucket/run/vocab/vocab.txt"


def test_gs_path_without_the_gcs_client_is_one_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "google.cloud.storage", None)  # import fails
  with pytest.raises(ImportError, match=r"gs://bucket/run .*google-cloud-storage.*pip install"):
    fileio.path("gs://bucket/run")


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
  from bert_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  vocab = tmp_path / "vocab"
  assert not data_lib._vocab_complete(str(vocab))  # pylint: disable=protected-access
  vocab.mkdir()
  (tmp_path / "vocab.tmp").mkdir()
  assert not data_lib._vocab_complete(str(vocab))  # pylint: disable=protected-access
  fileio.mark_complete(vocab)
  assert data_lib._vocab_complete(str(vocab))  # pylint: disable=protected-access
  (vocab / fileio.COMPLETE_MARKER).unlink()
  (tmp_path / "vocab.tmp").rmdir()
  assert data_lib._vocab_complete(str(vocab))  # pylint: disable=protected-access
