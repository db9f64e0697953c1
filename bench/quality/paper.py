"""The BERT paper's other experiments, one command each, at a scale this machine runs in minutes:

    python -m bench.quality.paper --table=6     # model size: held-out MLM perplexity and dev scores
    python -m bench.quality.paper --table=7     # CoNLL NER: fine-tuning vs feature-based choices
    python -m bench.quality.paper --table=8     # masking strategies ([MASK] / same / random)
    python -m bench.quality.paper --table=fig2  # dev score against pre-training steps, MLM vs LTR
    [--workdir=/tmp/bench_paper] [--steps=600] [--epochs=3] [--glue_dir=DIR]
    [--conll_dir=DIR] [--ner_lr=3e-4] [--bilstm_units=64] [--no_record]

Every row pre-trains what it needs with configs/tiny_pretrain.py on the built-in corpus
(its own vocabulary; --steps steps of batch 64, L=64; a row's model or data overrides on
top), then fine-tunes through the main job: the GLUE columns through the suite (the paper's
MNLI-m / MRPC / SST-2 when --glue_dir holds them, else CoLA 1.1 from ../shared/data, lr 1e-4
and 3e-4, 3 epochs, batch 32, L=64, the best run as the paper reports), the NER columns on
--conll_dir (CoNLL-2003's train.txt / valid.txt) or, without it, a tagging set made here from
the built-in corpus (code names and capitalised names in sentences of Python's documentation:
labelled "synthetic NER"). Each step lives in its own workdir under --workdir and is skipped
once finished (the main job and the suite resume; a rerun after kill -9 continues and writes
the same table). The table is printed in the paper's layout with the paper's numbers beside
ours (BERT-base/large scale: not comparable to a minutes-long run) and the command of each
row at the paper's scale, written to WORKDIR/table_<N>.md and appended to bench/results/quality.md
unless --no_record. Every input directory given is read before any pre-training (a wrong one:
one line, exit 2); a failing job ends the command with that job's own last line, exit 2.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import random
import re
import subprocess
import sys

from bench import harness

REPO = pathlib.Path(harness.REPO)
COLA = REPO.parent / "shared" / "data" / "cola" / "raw"
DIRECTORIES = {"mnli": "MNLI", "mrpc": "MRPC", "sst2": "SST-2"}  # as GLUE's download lays them out

# Table 6 (layers, hidden, heads) and, beside each, a tiny row of the same shape ratios.
TABLE6 = [((3, 768, 12), (1, 96, 4)), ((6, 768, 3), (2, 96, 1)), ((6, 768, 12), (2, 96, 4)),
          ((12, 768, 12), (4, 96, 4)), ((12, 1024, 16), (4, 128, 8)),
          ((24, 1024, 16), (8, 128, 8))]
PAPER6 = {(3, 768, 12): (5.84, 77.9, 79.8, 88.4), (6, 768, 3): (5.24, 80.6, 82.2, 90.7),
          (6, 768, 12): (4.68, 81.9, 84.8, 91.3), (12, 768, 12): (3.99, 84.4, 86.7, 92.9),
          (12, 1024, 16): (3.54, 85.7, 86.9, 93.3), (24, 1024, 16): (3.23, 86.6, 87.8, 93.7)}
TABLE7 = [("fine-tuning", None), ("embeddings", "embeddings"),
          ("second-to-last hidden", "second_to_last"), ("last hidden", "last"),
          ("weighted sum last four hidden", "sum_last4"), ("concat last four hidden", "concat_last4"),
          ("weighted sum all 12 layers", "sum_all")]
PAPER7 = {"fine-tuning": 96.4, "embeddings": 91.0, "second-to-last hidden": 95.6,
          "last hidden": 94.9, "weighted sum last four hidden": 95.9,
          "concat last four hidden": 96.1, "weighted sum all 12 layers": 95.5}
TABLE8 = [(0.8, 0.1, 0.1), (1.0, 0.0, 0.0), (0.8, 0.0, 0.2), (0.8, 0.2, 0.0), (0.0, 0.2, 0.8),
          (0.0, 0.0, 1.0)]
PAPER8 = {(0.8, 0.1, 0.1): (84.2, 95.4, 94.9), (1.0, 0.0, 0.0): (84.3, 94.9, 94.0),
          (0.8, 0.0, 0.2): (84.1, 95.2, 94.6), (0.8, 0.2, 0.0): (84.4, 95.2, 94.7),
          (0.0, 0.2, 0.8): (83.7, 94.8, 94.6), (0.0, 0.0, 1.0): (83.6, 94.9, 94.6)}
PAPER_SCALE = ("python -m bert_jax.main --config=configs/base_pretrain.py --workdir=RUN "
               "--config.build.corpus='books/*.txt,wiki/*.parquet'")


def _fail(message: str) -> None:
  """One line on stderr, exit 2 (what the jobs do with a user's error)."""
  print(f"bench.quality.paper: {message}", file=sys.stderr)
  raise SystemExit(2)


def _run(cmd: list[str], log: pathlib.Path) -> None:
  start = log.stat().st_size if log.exists() else 0
  with log.open("a") as f:
    proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, check=False)
  if proc.returncode:
    with log.open("rb") as f:
      f.seek(start)
      lines = [l for l in f.read().decode("utf-8", "replace").splitlines() if l.strip()]
    job = next((a for a in cmd if a.startswith("--config=")), cmd[-1])
    _fail(f"{job[len('--config='):]} failed (exit {proc.returncode}): "
          f"{lines[-1].strip() if lines else 'no output'} (whole log: {log})")


# The inputs each table reads: "glue" (--glue_dir's MNLI, MRPC, SST-2, else CoLA from
# --cola_dir) and "conll" (--conll_dir, else a tagging set made here).
NEEDS = {"6": ("glue",), "7": ("conll",), "8": ("glue", "conll"), "fig2": ("glue",)}


def check_inputs(args, explicit_cola: bool) -> str | None:
  """Reads what the table will read from each input directory given, before any
  pre-training: a directory that does not hold it fails in one line (exit 2). Returns why
  the table is skipped (it needs GLUE data, none was given and the default CoLA is absent)."""
  sys.path.insert(0, str(REPO))
  from common import errors  # pylint: disable=g-import-not-at-top
  from input_pipeline import glue, tagging  # pylint: disable=g-import-not-at-top
  needs, flag = NEEDS[args.table], "--conll_dir"
  try:
    if "conll" in needs and args.conll_dir:
      for name in ("train.txt", "valid.txt"):
        tagging.read_conll(str(pathlib.Path(args.conll_dir) / name))
    flag = "--glue_dir"
    if "glue" in needs and args.glue_dir.startswith("tfds"):
      pass  # TFDS's GLUE (the suite's data_dir=tfds[:DIR]): read by the suite itself
    elif "glue" in needs and args.glue_dir:
      for task in glue_tasks(args)[0]:
        for split in ("train", "dev"):
          glue.read_glue(task, str(pathlib.Path(args.glue_dir) / DIRECTORIES[task]), split)
    elif "glue" in needs and (explicit_cola or pathlib.Path(args.cola_dir).exists()):
      flag = "--cola_dir"
      for split in ("train", "dev"):
        glue.read_glue("cola", args.cola_dir, split)
    elif "glue" in needs:
      return f"neither --glue_dir nor {args.cola_dir} (CoLA 1.1's raw files)"
  except (errors.UserError, OSError) as e:
    _fail(f"{flag}: {str(e).splitlines()[0]} (nothing was run)")
  return None


def pretrain(root: pathlib.Path, name: str, steps: int, flags: list[str],
             every: int | None = None) -> pathlib.Path:
  """A tiny pre-training run (resumed if it exists, a no-op once finished)."""
  work = root / "pretrain" / name
  every = every or steps
  _run([sys.executable, "-m", "bert_jax.main", "--config=configs/tiny_pretrain.py",
        f"--workdir={work}", f"--config.num_train_steps={steps}",
        f"--config.checkpoint_every_steps={every}", f"--config.eval_every_steps={every}",
        f"--config.keep_checkpoints={max(steps // every, 1) + 1}",
        f"--config.schedule.warmup_steps={max(steps // 10, 1)}"] + flags,
       root / f"pretrain_{name}.log")
  return work


def perplexity(run: pathlib.Path) -> float | None:
  evals = json.loads((run / "metrics.json").read_text()).get("eval", {}) if (
      run / "metrics.json").exists() else {}
  last = max(evals, key=int, default=None)
  return None if last is None else evals[last]["mlm_perplexity"]


def glue_tasks(args) -> tuple[list[str], list[str]]:
  """(tasks, suite flags): the paper's when --glue_dir holds them, else CoLA."""
  if args.glue_dir:
    return ["mnli", "mrpc", "sst2"], [f"--config.data_dir={args.glue_dir}"]
  return ["cola"], [f"--config.task_dirs.cola={args.cola_dir}"]


def suite(root: pathlib.Path, name: str, run: pathlib.Path, args,
          extra: list[str] = ()) -> dict:
  tasks, flags = glue_tasks(args)
  work = root / "suite" / name
  _run([sys.executable, "-m", "bert_jax.main", f"--config=configs/suite.py:{','.join(tasks)}",
        f"--workdir={work}", f"--config.init_checkpoint={run}",
        f"--config.vocab_path={run / 'vocab'}", "--config.protocol=grid",
        "--config.grid.learning_rate=(1e-4,3e-4)", "--config.grid.global_batch_size=(32,)",
        f"--config.grid.num_epochs=({args.epochs},)", "--config.seeds=1",
        "--config.max_seq_length=64", "--config.submission=False",
        "--config.log_every_steps=0"] + flags + list(extra), root / f"suite_{name}.log")
  return work


def ner(root: pathlib.Path, name: str, run: pathlib.Path, args, features: str | None) -> float:
  """Best dev F1 (%) of NER on `run`: fine-tuned (features None) or feature-based."""
  work = root / "ner" / name
  config = "configs/conll.py" if features is None else "configs/conll.py:features"
  flags = [] if features is None else [f"--config.features={features}",
                                       f"--config.bilstm_units={args.bilstm_units}"]
  _run([sys.executable, "-m", "bert_jax.main", f"--config={config}", f"--workdir={work}",
        f"--config.init_checkpoint={run}", f"--config.vocab_path={run / 'vocab'}",
        f"--config.data_dir={conll_dir(root, args)}", "--config.max_seq_length=64",
        f"--config.num_epochs={args.epochs}", "--config.global_batch_size=32",
        "--config.log_every_steps=0"] + flags
       + ([f"--config.opt.learning_rate={args.ner_lr}"] if features is None else []),
       root / f"ner_{name}.log")
  return 100.0 * json.loads((work / "metrics.json").read_text())["best"]["f1"]


def conll_dir(root: pathlib.Path, args) -> pathlib.Path:
  """--conll_dir, or a tagging set made from the built-in corpus (once)."""
  if args.conll_dir:
    return pathlib.Path(args.conll_dir)
  out = root / "synthetic_ner"
  if not (out / "valid.txt").exists():
    make_synthetic_ner(out)
  return out


_CODE = re.compile(r"^[A-Za-z_][\w]*(?:[._][\w]+)+(?:\(\))?$|^\w+\(\)$")


def make_synthetic_ner(out: pathlib.Path, sentences: int = 3000, seed: int = 0) -> None:
  """CoNLL-format tagging of the built-in corpus's sentences: code names (os.path.join,
  read_text(), snake_case) B-/I-CODE, capitalised words inside a sentence B-/I-NAME."""
  sys.path.insert(0, str(REPO))
  from input_pipeline import corpus  # pylint: disable=g-import-not-at-top
  rng = random.Random(seed)
  picked = []
  for text in corpus.iter_texts("default", sentences=True, max_chars=2_000_000):
    words = text.split()
    if 6 <= len(words) <= 40 and any(_CODE.match(w.strip(",.;:")) for w in words):
      picked.append(words)  # sentences that name code: a tag in most of them
    if len(picked) >= sentences:
      break
  out.mkdir(parents=True, exist_ok=True)

  def tags(words):
    out_tags, prev = [], "O"
    for i, w in enumerate(words):
      kind = ("CODE" if _CODE.match(w.strip(",.;:")) else
              "NAME" if i > 0 and w[:1].isupper() and w[1:].islower() else None)
      tag = "O" if kind is None else (f"I-{kind}" if prev.endswith(kind) else f"B-{kind}")
      out_tags.append(tag)
      prev = tag
    return out_tags

  cut = len(picked) * 9 // 10
  for name, part in (("train.txt", picked[:cut]), ("valid.txt", picked[cut:])):
    tmp = out / f"{name}.tmp"  # whole or absent: conll_dir trusts a valid.txt that exists
    tmp.write_text("".join(
        "".join(f"{w} X X {t}\n" for w, t in zip(ws, tags(ws))) + "\n" for ws in part))
    tmp.replace(out / name)


def _metric(report_dir: pathlib.Path, task: str) -> float | None:
  report = json.loads((report_dir / "report.json").read_text())
  t = report["tasks"].get(task)
  return None if t is None else (t.get("dev") or {}).get(t["metric"])


def _f(v, d=1) -> str:
  return "-" if v is None else f"{v:.{d}f}"


def table6(root, args) -> list[str]:
  tasks, _ = glue_tasks(args)
  cols = " | ".join(f"{t} (ours)" for t in tasks)
  lines = [f"| #L | #H | #A | tiny #L/#H/#A | LM ppl (ours) | {cols} | paper: LM ppl / MNLI-m / MRPC / SST-2 |",
           "|---|---|---|---|---|" + "---|" * len(tasks) + "---|"]
  for paper, (layers, hidden, heads) in TABLE6:
    name = f"L{layers}_H{hidden}_A{heads}"
    run = pretrain(root, name, args.steps, [
        f"--config.model.num_layers={layers}", f"--config.model.hidden_size={hidden}",
        f"--config.model.num_heads={heads}", f"--config.model.intermediate_size={4 * hidden}"])
    work = suite(root, name, run, args)
    lines.append(f"| {paper[0]} | {paper[1]} | {paper[2]} | {layers}/{hidden}/{heads} | "
                 f"{_f(perplexity(run), 2)} | " + " | ".join(_f(_metric(work, t)) for t in tasks)
                 + " | " + " / ".join(map(str, PAPER6[paper])) + " |")
  return lines


def table7(root, args) -> list[str]:
  run = pretrain(root, "base", args.steps, ["--config.model.num_layers=4"])
  label = "CoNLL-2003 dev F1" if args.conll_dir else "synthetic NER dev F1"
  lines = [f"| system | {label} (ours) | paper (BERT-base, CoNLL-2003 dev F1) |", "|---|---|---|"]
  for name, features in TABLE7:
    f1 = ner(root, f"t7_{features or 'finetune'}", run, args, features)
    lines.append(f"| {name} | {f1:.1f} | {PAPER7[name]} |")
  return lines


def table8(root, args) -> list[str]:
  tasks, _ = glue_tasks(args)
  label = "NER" if args.conll_dir else "synthetic NER"
  lines = [f"| [MASK] | same | rnd | {' | '.join(tasks)} (ours) | {label} fine-tune | "
           f"{label} feature-based | paper: MNLI / NER fine-tune / NER feature-based |",
           "|---|---|---|" + "---|" * len(tasks) + "---|---|---|"]
  for ratios in TABLE8:
    name = "mask_" + "_".join(f"{int(100 * r)}" for r in ratios)
    run = pretrain(root, name, args.steps, ["--config.model.num_layers=4",
                                            f"--config.data.mask_ratios={tuple(ratios)}"])
    work = suite(root, name, run, args)
    fine, feat = ner(root, f"{name}_ft", run, args, None), ner(root, f"{name}_fb", run, args,
                                                                 "concat_last4")
    lines.append(" | ".join([f"| {int(100 * ratios[0])}%", f"{int(100 * ratios[1])}%",
                             f"{int(100 * ratios[2])}%"] + [_f(_metric(work, t)) for t in tasks]
                            + [f"{fine:.1f}", f"{feat:.1f}",
                               " / ".join(map(str, PAPER8[ratios])) + " |"]))
  return lines


def figure2(root, args) -> list[str]:
  every = max(args.steps // 4, 1)
  runs = [pretrain(root, "fig2_mlm", args.steps, ["--config.data.nsp=False"], every),
          pretrain(root, "fig2_ltr", args.steps, ["--config.objective=ltr",
                                                  "--config.data.nsp=False"], every)]
  tasks, flags = glue_tasks(args)
  work = root / "suite" / "fig2"
  _run([sys.executable, "-m", "bert_jax.main", f"--config=configs/suite.py:{','.join(tasks)}",
        f"--workdir={work}", f"--config.init_checkpoint={runs[0]},{runs[1]}",
        f"--config.vocab_path={runs[0] / 'vocab'}", "--config.checkpoint_steps=all",
        "--config.protocol=grid", "--config.grid.learning_rate=(3e-4,)",
        "--config.grid.global_batch_size=(32,)", f"--config.grid.num_epochs=({args.epochs},)",
        "--config.seeds=1", "--config.max_seq_length=64", "--config.submission=False",
        "--config.log_every_steps=0"] + flags, root / "suite_fig2.log")
  history = json.loads((work / "history.json").read_text())
  lines = ["| pre-training | step | " + " | ".join(tasks) + " (ours) | held-out ppl |",
           "|---|---|" + "---|" * len(tasks) + "---|"]
  for name, run in history["runs"].items():
    for step, s in sorted(run["steps"].items(), key=lambda kv: int(kv[0])):
      lines.append(f"| {name} | {step} | " + " | ".join(_f(s["tasks"].get(t)) for t in tasks)
                   + f" | {_f(s['mlm_perplexity'], 2)} |")
  lines += ["", f"Plot: {work / 'history.png'}. The paper's Figure 2 plots BERT-base's MNLI "
            "dev accuracy after 200k to 1M pre-training steps, MLM and LTR; its text: almost "
            "1.0% more accuracy at 1M steps than at 500k, and the MLM model, though it "
            "converges slightly slower, above LTR in absolute accuracy almost immediately."]
  return lines


TABLES = {"6": ("Table 6: model size", table6), "7": ("Table 7: feature-based NER", table7),
          "8": ("Table 8: masking strategies", table8), "fig2": ("Figure 2: pre-training steps", figure2)}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--table", required=True, choices=sorted(TABLES))
  parser.add_argument("--workdir", default="/tmp/bench_paper")
  parser.add_argument("--steps", type=int, default=600)
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--bilstm_units", type=int, default=64, help="the paper: 768")
  parser.add_argument("--ner_lr", type=float, default=3e-4,
                      help="NER fine-tuning's rate (feature-based: configs/conll.py:features')")
  parser.add_argument("--glue_dir", default="", help="GLUE's directories (MNLI, MRPC, SST-2)")
  parser.add_argument("--cola_dir", default="", help=f"CoLA (default {COLA})")
  parser.add_argument("--conll_dir", default="", help="CoNLL-2003 train.txt / valid.txt")
  parser.add_argument("--no_record", action="store_true")
  args = parser.parse_args(argv)
  explicit_cola = bool(args.cola_dir)
  args.cola_dir = args.cola_dir or str(COLA)
  skipped = check_inputs(args, explicit_cola)
  if skipped:
    print(f"skipped: {skipped}")
    return
  root = pathlib.Path(args.workdir) / f"table_{args.table}"
  root.mkdir(parents=True, exist_ok=True)
  title, build = TABLES[args.table]
  rows = build(root, args)
  command = " ".join(["python -m bench.quality.paper"] + (argv if argv is not None else sys.argv[1:]))
  text = "\n".join([f"## {title}, at tiny scale ({datetime.date.today()})", "",
                    f"Command: `{command}`; machine: {harness.machine()}. Pre-training: "
                    f"configs/tiny_pretrain.py, {args.steps} steps of batch 64 on the built-in "
                    "corpus per row; fine-tuning as bench/quality/paper.py's docstring says. The "
                    "paper's columns are BERT-base/large after 1M steps of 128k-token batches: "
                    "beside ours for their layout, not comparable.", "", *rows, "",
                    f"At the paper's scale, each row's pre-training: `{PAPER_SCALE}` with the "
                    "row's flags (e.g. --config.model.num_layers=24 --config.model.hidden_size="
                    "1024 --config.model.num_heads=16; --config.data.mask_ratios='(0.8,0,0.2)'; "
                    "--config.objective=ltr --config.data.nsp=False), then the suite or "
                    "configs/conll.py[:features] on the real data."]) + "\n"
  (root.parent / f"table_{args.table}.md").write_text(text)
  print(text)
  if not args.no_record:
    harness.append(__name__, "\n" + text)


if __name__ == "__main__":
  main()
