"""bench/quality/suite_glue.py (issue 58 items 1-2): GLUE on real files, the suite vs transformers."""
import json
import math
import pathlib
import random

import pytest

from bench.quality import suite_glue

WORDS = ["a", "man", "is", "playing", "guitar", "the", "new", "movie", "awesome", "hello", "two",
         "dogs", "run", "in", "park", "woman", "cooks", "food", "cat", "sleeps"]


def _sentence(rng: random.Random) -> str:
  return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + " ."


def write_glue(root: pathlib.Path, train: int = 40, dev: int = 12) -> None:
  """RTE and STS-B in GLUE's layout (headers, tab-separated, test.tsv beside them)."""
  rng = random.Random(0)
  for task, n_rows in (("RTE", {"train": train, "dev": dev, "test": 4}),
                       ("STS-B", {"train": train, "dev": dev, "test": 4})):
    d = root / task
    d.mkdir(parents=True)
    for split, n in n_rows.items():
      rows = []
      for i in range(n):
        a, b = _sentence(rng), _sentence(rng)
        if task == "RTE":
          label = ["entailment", "not_entailment"][i % 2]
          rows.append(f"{i}\t{a}\t{b}" + ("" if split == "test" else f"\t{label}"))
        else:
          score = f"{rng.uniform(0, 5):.3f}"
          rows.append(f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}"
                      + ("" if split == "test" else f"\t{score}"))
      header = ("index\tsentence1\tsentence2" + ("" if split == "test" else "\tlabel")
                if task == "RTE" else "index\tgenre\tfilename\tyear\told_index\tsource1\t"
                "source2\tsentence1\tsentence2" + ("" if split == "test" else "\tscore"))
      (d / f"{split}.tsv").write_text(header + "\n" + "\n".join(rows) + "\n")


def random_bert_dir(tmp_path) -> str:
  transformers = pytest.importorskip("transformers")
  from tests import hf_parity  # pylint: disable=g-import-not-at-top
  config = transformers.BertConfig(vocab_size=5 + len(WORDS) + 1, hidden_size=32,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=48, max_position_embeddings=64)
  path, _ = hf_parity.hf_dir(tmp_path, transformers.BertModel, config, lambda n: "LayerNorm" in n)
  (pathlib.Path(path) / "vocab.txt").write_text(
      "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS) + "\n")
  (pathlib.Path(path) / "tokenizer_config.json").write_text(
      json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}))
  return path


def test_metric_tables_are_the_suites():
  from bert_jax import suite_report  # pylint: disable=g-import-not-at-top
  from input_pipeline import glue  # pylint: disable=g-import-not-at-top
  for task in suite_glue.SPECS:
    assert suite_glue.REPORT[task] == suite_report.METRICS[task]
    assert suite_glue.SELECT[task] == glue.GLUE[task].metrics[0]
    assert suite_glue.SPECS[task][5] == glue.GLUE[task].labels


def test_its_reader_reads_what_the_suite_reads(tmp_path):
  from input_pipeline import glue  # pylint: disable=g-import-not-at-top
  write_glue(tmp_path)
  for task, d in (("rte", "RTE"), ("stsb", "STS-B")):
    texts, gold = suite_glue.read_split(task, tmp_path / d, "train")
    ours = glue.read_glue(task, str(tmp_path / d), "train")
    assert [(e.text_a, e.text_b) for e in ours] == texts
    labels = glue.GLUE[task].labels
    assert [e.label if labels is None else labels.index(e.label) for e in ours] == gold


def test_without_data_it_skips_cleanly(tmp_path, capsys):
  assert suite_glue.main([f"--data_dir={tmp_path / 'absent'}", f"--workdir={tmp_path / 'w'}",
                          "--no_record"]) is None
  assert "skipped:" in capsys.readouterr().out and not (tmp_path / "w").exists()


@pytest.mark.slow  # five subprocesses (~1-2 min on 2 cores)
def test_smoke_rows_per_task_and_side(tmp_path, capsys):
  write_glue(tmp_path / "glue")
  out = suite_glue.main([f"--data_dir={tmp_path / 'glue'}", f"--workdir={tmp_path / 'w'}",
                         f"--hf={random_bert_dir(tmp_path)}", "--tasks=rte,stsb", "--seeds=1",
                         "--epochs=2", "--batch=8", "--max_seq_length=32",
                         "--max_train_examples=24", "--no_record"])
  text = capsys.readouterr().out
  results = out["results"]
  assert sorted(results) == sorted(f"{t}/{s}" for t in ("rte", "stsb")
                                   for s in ("bj_false", "bj_true", "hf"))
  for key, entry in results.items():
    assert entry["status"] == "done", (key, entry.get("error"))
    (run,) = entry["runs"]
    assert run["status"] == "done" and run["epoch"] in (1, 2)
    for metric in suite_glue.REPORT[key.split("/")[0]]:
      assert math.isfinite(run["dev"][metric]), (key, run)
  rows = [l for l in text.splitlines() if l.startswith(("| rte |", "| stsb |"))]
  assert len(rows) == 6 and all("| done |" in r for r in rows), text
  assert "first 24 train rows" in text and "Not run: cola, sst2, mrpc, wnli" in text


@pytest.mark.slow
def test_a_stopped_side_resumes_and_more_seeds_run_only_the_new_ones(tmp_path, capsys):
  write_glue(tmp_path / "glue")
  common = [f"--data_dir={tmp_path / 'glue'}", f"--workdir={tmp_path / 'w'}",
            f"--hf={random_bert_dir(tmp_path)}", "--tasks=rte", "--epochs=1", "--batch=8",
            "--max_seq_length=32", "--max_train_examples=24", "--bias_correction=true",
            "--no_record"]
  first = suite_glue.main(common + ["--seeds=1"])["results"]
  # As a 2-seed run stopped by --deadline after seed 0 leaves it.
  path = tmp_path / "w" / "results.json"
  results = json.loads(path.read_text())
  for entry in results.values():
    entry.update(status="stopped at the deadline", protocol=dict(entry["protocol"], seeds=2))
  path.write_text(json.dumps(results))
  capsys.readouterr()
  second = suite_glue.main(common + ["--seeds=2"])["results"]
  for key in ("rte/bj_true", "rte/hf"):
    entry = second[key]
    assert entry["status"] == "done", (key, entry.get("error"))
    assert [r["seed"] for r in entry["runs"]] == [0, 1]
    assert entry["runs"][0] == first[key]["runs"][0], key  # kept, not run again
    assert entry["runs"][1]["status"] == "done"
    assert len(entry["parts"]) == 2 and entry["parts"][0] == first[key]["seconds"]
    assert entry["seconds"] == pytest.approx(sum(entry["parts"]))
  assert "--first_seed=1" in second["rte/hf"]["command"]
  rows = [l for l in capsys.readouterr().out.splitlines() if l.startswith("| rte |")]
  assert len(rows) == 2 and all("| done, resumed (" in r for r in rows), rows
  # A rerun with more seeds runs only the new one.
  third = suite_glue.main(common + ["--seeds=3"])["results"]
  for key in ("rte/bj_true", "rte/hf"):
    entry = third[key]
    assert entry["status"] == "done", (key, entry.get("error"))
    assert entry["runs"][:2] == second[key]["runs"] and entry["runs"][2]["seed"] == 2, key
    assert entry["parts"][:2] == second[key]["parts"] and len(entry["parts"]) == 3
  assert "--first_seed=2" in third["rte/hf"]["command"]
  assert entry["protocol"]["seeds"] == 3


@pytest.mark.parametrize("status, seeds, lr, resumed", [
    ("stopped at the deadline", 2, 5e-5, True),
    ("done", 1, 5e-5, True),  # more seeds: only the new ones run
    ("done", 2, 5e-5, False),  # the same protocol: kept, not run
    ("FAILED (rc 1)", 1, 5e-5, False),  # run whole again
    ("stopped at the deadline", 2, 1e-4, False),  # another protocol: run whole
    ("done", 3, 5e-5, False),  # fewer seeds asked: another protocol, run whole
])
def test_which_earlier_sides_are_resumed(tmp_path, monkeypatch, status, seeds, lr, resumed):
  write_glue(tmp_path / "glue")
  args = suite_glue.parse([f"--data_dir={tmp_path / 'glue'}", f"--workdir={tmp_path}",
                           "--tasks=rte", "--seeds=2", "--bias_correction=true"])
  old = {"status": status, "seconds": 5.0, "runs": [],
         "protocol": dict(suite_glue.protocol(args), seeds=seeds, learning_rate=lr)}
  suite_glue.save_results(tmp_path, {"rte/bj_true": old, "rte/hf": old})
  calls = {}

  def run_side(side, task, data, args, deadline, resume=None):
    calls[side] = resume
    return {"status": "done", "seconds": 1.0, "runs": []}
  monkeypatch.setattr(suite_glue, "run_side", run_side)
  suite_glue.measure(args, ["rte"])
  if status == "done" and seeds == 2 and lr == 5e-5:
    assert calls == {}
  else:
    assert calls == {s: old if resumed else None for s in ("bj_true", "hf")}
