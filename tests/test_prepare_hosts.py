"""Preparation split over hosts (input_pipeline/prepare_hosts.py): every host count gives
the arrays one machine writes; the ranges; waiting, reruns and the bad-record total."""
import json
import subprocess
import sys

import pytest

from common import errors
from input_pipeline import prepare
from input_pipeline import prepare_hosts
from input_pipeline import sources
from input_pipeline import store
from input_pipeline import testing
from tests import test_train_utils as tu

WORDS = "the cat sat on a mat . it was warm ! dogs ran far away ? yes no".split()


@pytest.fixture
def files(tmp_path):
  """Seven input files of different sizes and formats (text and JSON Lines)."""
  vocab = testing.write_vocab(str(tmp_path / "vocab" / "vocab.txt"), WORDS + ["[unused0]"])
  root = tmp_path / "in"
  root.mkdir()
  for i in range(7):
    docs = [" ".join(WORDS[(i + d + j) % len(WORDS)] for j in range(5 + 3 * d)) + "."
            for d in range(1 + (i * 3) % 5)]
    if i % 2:
      (root / f"part{i}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    else:
      (root / f"part{i}.txt").write_text("\n\n".join(docs) + "\n")
  return {"spec": f"{root}/*.txt,{root}/*.jsonl", "vocab": vocab, "root": tmp_path}


def _arrays(path):
  return {name: (path / name).read_bytes() for name in store.FILES}


CONTENT = ("documents", "sentences", "tokens", "unk_tokens", "empty_documents", "input_files",
           "input_bytes", "replaced_bytes", "raw_documents", "bad_records", "shard_documents",
           "num_shards", "token_dtype", "vocab", "input", "format", "text_field", "files")


@pytest.mark.parametrize("num_hosts", [1, 2, 3, 7, 9])
def test_any_host_count_gives_the_one_machine_corpus(files, num_hosts):
  root = files["root"]
  want = prepare.prepare_corpus(files["spec"], files["vocab"], str(root / "one"), num_shards=3,
                                num_workers=1, progress=False, fmt="paragraphs")
  out = root / f"hosts{num_hosts}"
  # Hosts in any order; host 0 (last here) merges once every share is there.
  for host in list(range(1, num_hosts)) + [0]:
    summary = prepare_hosts.prepare_share(
        files["spec"], files["vocab"], str(out), num_hosts=num_hosts, host_index=host,
        merge_timeout=5, num_shards=3, num_workers=1, progress=False, fmt="paragraphs")
    assert (summary is None) == (host != 0)
  assert _arrays(out) == _arrays(root / "one")
  assert {k: summary[k] for k in CONTENT} == {k: want[k] for k in CONTENT}
  assert summary["hosts"] == num_hosts
  assert not (out / prepare_hosts.HOSTS_DIR).exists()
  assert prepare.load_summary(str(out))["documents"] == want["documents"]


def test_ranges_are_contiguous_balanced_and_cover_every_file():
  assert prepare_hosts.ranges([10] * 6, 3) == [(0, 2), (2, 4), (4, 6)]
  assert prepare_hosts.ranges([100, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
  assert prepare_hosts.ranges([1, 1, 1, 1, 100], 2) == [(0, 4), (4, 5)]
  assert prepare_hosts.ranges([5, 5], 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
  for sizes in ([3, 0, 0, 9, 1, 1, 1, 50, 2], [0] * 9, [7]):
    for hosts in range(1, 12):
      r = prepare_hosts.ranges(sizes, hosts)
      assert len(r) == hosts and r[0][0] == 0 and r[-1][1] == len(sizes)
      assert all(a[1] == b[0] for a, b in zip(r, r[1:]))
      if len(sizes) >= hosts:
        assert all(stop > start for start, stop in r), (sizes, hosts, r)


def test_host_zero_waits_then_names_the_missing_hosts(files):
  out = files["root"] / "out"
  with pytest.raises(errors.UserError, match=r"Hosts \[1, 2\] of 3 have not finished"):
    prepare_hosts.prepare_share(files["spec"], files["vocab"], str(out), num_hosts=3,
                                host_index=0, merge_timeout=0.3, num_shards=2, num_workers=1,
                                progress=False)
  # A rerun skips the complete share (its summary stays untouched).
  part = prepare_hosts.part_dir(str(out), 0, 3)
  before = (out / "hosts" / "00000-of-00003" / prepare.SUMMARY_NAME).read_text()
  for host in (1, 2, 0):
    prepare_hosts.prepare_share(files["spec"], files["vocab"], str(out), num_hosts=3,
                                host_index=host, merge_timeout=5, num_shards=2, num_workers=1,
                                progress=False)
  assert not store.check_format(str(out), prepare.load_summary(str(out)))
  assert part.endswith("hosts/00000-of-00003") and before


def test_bad_records_count_for_the_whole_corpus(files):
  root = files["root"] / "in"
  for i in (1, 3):
    with open(root / f"part{i}.jsonl", "a", encoding="utf-8") as f:
      f.write(json.dumps({"text": None}) + "\n")
  out = files["root"] / "out"
  kwargs = dict(merge_timeout=5, num_shards=2, num_workers=1, progress=False, max_bad_records=1)
  for host in range(1, 7):  # one file a host: each skips its one bad record
    prepare_hosts.prepare_share(files["spec"], files["vocab"], str(out), num_hosts=7,
                                host_index=host, **kwargs)
  with pytest.raises(sources.BadRecordError, match="skipped 2 bad records in all"):
    prepare_hosts.prepare_share(files["spec"], files["vocab"], str(out), num_hosts=7,
                                host_index=0, **kwargs)


def test_builtin_corpus_is_refused():
  with pytest.raises(errors.UserError, match="reads input files"):
    prepare_hosts.input_files("default")


def test_cli_on_two_hosts(files):
  out = files["root"] / "cli"
  base = [sys.executable, "-m", "input_pipeline.prepare_hosts", f"--input={files['spec']}",
          f"--vocab={files['vocab']}", f"--output_dir={out}", "--num_hosts=2",
          "--num_workers=1", "--num_shards=2", "--format=paragraphs"]
  one = subprocess.run(base + ["--host_index=1"], cwd=tu.REPO, env=tu.env(1),
                       capture_output=True, text=True, timeout=300)
  assert one.returncode == 0, one.stderr[-3000:]
  assert "Host 1 prepared its share" in one.stdout
  zero = subprocess.run(base + ["--host_index=0"], cwd=tu.REPO, env=tu.env(1),
                        capture_output=True, text=True, timeout=300)
  assert zero.returncode == 0, zero.stderr[-3000:]
  assert "on 2 hosts" in zero.stdout
  bad = subprocess.run(base + ["--host_index=2"], cwd=tu.REPO, env=tu.env(1),
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2 and "--host_index=2 is not in [0, --num_hosts=2)" in bad.stderr
  assert "Traceback" not in bad.stderr, bad.stderr[-2000:]  # one line (issue 35, item 7)
