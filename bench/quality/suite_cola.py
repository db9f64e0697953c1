"""CoLA fine-tuning sweep: bert_jax's fine-tuning suite vs transformers' `Trainer` (torch CPU).

    python -m bench.quality.suite_cola --workdir=/tmp/bench_suite_cola [--rounds=2] [--no_record]

transformers' Trainer needs accelerate (not among the project's dependencies): pip install
'accelerate>=1.1.0', or `pip install --no-deps --target=DIR accelerate` and PYTHONPATH=DIR.

Both systems start from the same small pre-trained checkpoint: tiny BERT pre-trained on
the built-in corpus (configs/tiny_pretrain.py, reused if WORKDIR/pretrain has it),
exported to a HuggingFace directory (`python -m bert_jax.convert --to=huggingface`,
WORKDIR/hf); each system initialises its own classifier head. Data: CoLA 1.1
(in_domain_train.tsv -> in_domain_dev.tsv) in ../shared/data/cola/raw.

The sweep (flags): learning rates 1e-4, 5e-5 x seeds 0, 1; 3 epochs, batch 32, L=64,
10% linear warmup then linear decay to 0, AdamW (weight decay 0.01, none on LayerNorm and
biases, eps 1e-6), clipping at 1.0, dropout 0.1; dev evaluated after every epoch, a run's
metric = its best epoch's dev MCC.

- bert_jax: one `python -m bert_jax.main --config=configs/suite.py:cola --config.protocol=grid
  ...` subprocess per round in a fresh workdir (empty XLA cache: compilation counted);
  MCCs from its report.json. Then the same command again in the same workdir with
  everything but the suite's XLA cache (xla_cache/) deleted: the sweep with the persistent
  compilation cache warm. Adam without bias correction (BERT's optimizer; the suite's default
  before issue 58, kept here so the tables stay comparable).
- transformers: one subprocess per round (this script with --worker=hf) running
  `Trainer` per run: AutoModelForSequenceClassification.from_pretrained(WORKDIR/hf), the
  standard torch AdamW (bias correction on; transformers' default fused kernel), torch's
  default thread count.

Wall-clock is the whole subprocess (Python start-up, imports, data, compilation, training,
evaluation). Rounds alternate the order (round 1 bert_jax first, round 2 transformers
first, ...). The machine may be shared: each subprocess waits (--max_wait_quiet) for other
processes to go under 0.2 core, and the CPU time others used during it is reported (with a
busy neighbour, torch's two OpenMP threads ran this model's step several times slower in a
quick check). Prints the tables; appends them to bench/results/quality.md unless --no_record.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import time

from bench import harness

REPO = pathlib.Path(harness.REPO)
DEFAULT_COLA = REPO.parent / "shared" / "data" / "cola" / "raw"
SUITE_CACHE = "xla_cache"  # bert_jax/configs/suite.py: compilation_cache_dir "" = WORKDIR/xla_cache
NAMES = {"bert_jax": "bert_jax", "hf": "transformers"}
TITLE = "## Fine-tuning suite vs transformers Trainer: CoLA sweep"  # and the date of the run


def job_env() -> dict[str, str]:
  """The subprocesses' environment: the repo first on the path, then the caller's
  PYTHONPATH (where accelerate may have been installed with pip --target)."""
  path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
  return dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3")


def _check(cmd: list[str], proc: subprocess.CompletedProcess) -> None:
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd)} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")


def _busy_seconds() -> float:
  """CPU-seconds the whole machine has been busy (all cores), from /proc/stat."""
  with open("/proc/stat") as f:
    ticks = [int(x) for x in f.readline().split()[1:9]]
  return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def timed(cmd: list[str]) -> dict:
  """Runs cmd to its end: wall-clock seconds, its CPU-seconds, and the CPU-seconds other
  processes used meanwhile (the machine is shared: a busy neighbour skews the timing)."""
  busy0, own0 = _busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True)
  seconds = time.perf_counter() - t0
  busy1, own1 = _busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
  _check(cmd, proc)
  cpu = (own1.ru_utime - own0.ru_utime) + (own1.ru_stime - own0.ru_stime)
  return {"proc": proc, "seconds": seconds, "cpu": cpu,
          "others_cpu": max(busy1 - busy0 - cpu, 0.0)}


def wait_quiet(max_wait: float, cores: float = 0.2, window: float = 5.0) -> float:
  """Waits (up to max_wait s) until other processes use under `cores` cores over `window` s;
  returns the cores they used in the last window."""
  deadline = time.time() + max_wait
  while True:
    b0 = _busy_seconds()
    time.sleep(window)
    used = (_busy_seconds() - b0) / window
    if used < cores or time.time() >= deadline:
      return used
    time.sleep(10)


# ----------------------------------------------------------------------------
# Setup: the shared checkpoint.

def prepare_checkpoint(workdir: pathlib.Path) -> pathlib.Path:
  """Pre-trains tiny BERT (a no-op once WORKDIR/pretrain has finished), exports it for
  HuggingFace to WORKDIR/hf; returns that directory."""
  pre, hf = workdir / "pretrain", workdir / "hf"
  code = ("from bert_jax import train; from bert_jax.configs import tiny_pretrain; "
          f"train.train_and_evaluate(tiny_pretrain.get_config(), {str(pre)!r})")
  t0 = time.time()
  cmd = [sys.executable, "-c", code]
  _check(cmd, subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True))
  print(f"pre-trained checkpoint in {pre} ({time.time() - t0:.0f} s)", flush=True)
  if not (hf / "model.safetensors").exists():
    cmd = [sys.executable, "-m", "bert_jax.convert", f"--input={pre}", f"--output={hf}",
           "--to=huggingface"]
    _check(cmd, subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True))
  return hf


# ----------------------------------------------------------------------------
# bert_jax: the fine-tuning suite.

def _tuple(values) -> str:
  return "(" + ",".join(f"{v:g}" for v in values) + ",)"


def suite_command(hf: pathlib.Path, cola_dir: str, workdir: pathlib.Path, args) -> list[str]:
  return [sys.executable, "-m", "bert_jax.main", "--config=configs/suite.py:cola",
          f"--config.init_checkpoint={hf}", f"--config.vocab_path={hf}",
          f"--config.task_dirs.cola={cola_dir}", "--config.protocol=grid",
          f"--config.grid.learning_rate={_tuple(args.learning_rates)}",
          f"--config.grid.global_batch_size={_tuple([args.batch])}",
          f"--config.grid.num_epochs={_tuple([args.epochs])}",
          f"--config.seeds={args.seeds}", f"--config.max_seq_length={args.max_seq_length}",
          "--config.opt.bias_correction=False", f"--workdir={workdir}"]


def _suite_mccs(workdir: pathlib.Path) -> dict[float, list[float]]:
  """{learning rate: per-seed best-epoch dev MCC} from the suite's report.json (which
  gives GLUE metrics x100) checked against each run's result.json (fractions)."""
  report = json.loads((workdir / "report.json").read_text())
  out = {}
  for setting in report["tasks"]["cola"]["settings"]:
    mccs = []
    for run in setting["runs"]:
      if run["status"] != "done":
        raise RuntimeError(f"bert_jax run {setting['name']} seed {run['seed']}: {run['status']}")
      mcc = run["dev"]["mcc"] / 100.0
      result = workdir / run.get("dir", "?") / "result.json"
      if result.exists():
        raw = json.loads(result.read_text())["dev"]["mcc"]
        if abs(raw - mcc) > 1e-6:
          raise RuntimeError(f"report.json's MCC {run['dev']['mcc']} vs result.json's {raw}")
      mccs.append(mcc)
    out[float(setting["hparams"]["learning_rate"])] = mccs
  return out


def run_bert_jax(hf: pathlib.Path, cola_dir: str, workdir: pathlib.Path, args) -> dict:
  """The suite in a fresh workdir, then again there with only its XLA cache kept."""
  if workdir.exists():
    shutil.rmtree(workdir)
  cmd = suite_command(hf, cola_dir, workdir, args)
  fresh = timed(cmd)
  mccs = _suite_mccs(workdir)
  if not (workdir / SUITE_CACHE).is_dir():
    raise RuntimeError(f"{workdir / SUITE_CACHE} missing: the suite's cache directory moved?")
  for entry in workdir.iterdir():
    if entry.name != SUITE_CACHE:
      shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
  wait_quiet(args.max_wait_quiet)
  cached = timed(cmd)
  return {"seconds": fresh["seconds"], "cpu": fresh["cpu"], "others_cpu": fresh["others_cpu"],
          "mccs": mccs, "cached_seconds": cached["seconds"],
          "cached_others_cpu": cached["others_cpu"], "cached_mccs": _suite_mccs(workdir)}


# ----------------------------------------------------------------------------
# transformers: Trainer, one subprocess for the whole sweep.

def read_cola(path: str) -> tuple[list[str], list[int]]:
  """CoLA 1.1 TSV (no header): source, label, original mark, sentence."""
  sentences, labels = [], []
  with open(path, encoding="utf-8") as f:
    for line in f:
      cols = line.rstrip("\n").split("\t")
      if len(cols) >= 4:
        labels.append(int(cols[1]))
        sentences.append(cols[3])
  return sentences, labels


def mcc(preds, labels) -> float:
  """Binary Matthews correlation (numpy; sklearn is not installed)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  p, t = np.asarray(preds) == 1, np.asarray(labels) == 1
  tp, tn = float(np.sum(p & t)), float(np.sum(~p & ~t))
  fp, fn = float(np.sum(p & ~t)), float(np.sum(~p & t))
  denom = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
  return (tp * tn - fp * fn) / denom if denom else 0.0


def hf_worker(args) -> None:
  """Every (lr, seed) run with transformers' Trainer; prints {"runs": [...]} as JSON."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  transformers.logging.set_verbosity_error()
  tok = transformers.AutoTokenizer.from_pretrained(args.hf)

  def dataset(split):
    sentences, labels = read_cola(os.path.join(args.cola_dir, f"in_domain_{split}.tsv"))
    enc = tok(sentences, padding="max_length", truncation=True, max_length=args.max_seq_length)
    return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
             "attention_mask": enc["attention_mask"][i], "labels": labels[i]}
            for i in range(len(labels))]

  train, dev = dataset("train"), dataset("dev")

  def compute_metrics(pred):
    return {"mcc": mcc(np.argmax(pred.predictions, -1), pred.label_ids)}

  runs = []
  for lr in args.learning_rates:
    for seed in range(args.seeds):
      t0 = time.perf_counter()
      transformers.set_seed(seed)  # before the head's initialisation, as Trainer(model_init=...)
      model = transformers.AutoModelForSequenceClassification.from_pretrained(
          args.hf, num_labels=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
      targs = transformers.TrainingArguments(
          output_dir=os.path.join(args.out, f"lr{lr:g}_seed{seed}"),
          per_device_train_batch_size=args.batch, per_device_eval_batch_size=64,
          learning_rate=lr, num_train_epochs=args.epochs, warmup_steps=0.1,
          lr_scheduler_type="linear", weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0,
          eval_strategy="epoch", save_strategy="no", seed=seed, report_to=[], use_cpu=True,
          dataloader_num_workers=0, disable_tqdm=True)
      trainer = transformers.Trainer(model=model, args=targs, train_dataset=train,
                                     eval_dataset=dev, compute_metrics=compute_metrics,
                                     data_collator=transformers.default_data_collator)
      trainer.train()
      epochs = [h["eval_mcc"] for h in trainer.state.log_history if "eval_mcc" in h]
      runs.append({"learning_rate": lr, "seed": seed, "mcc": max(epochs), "epochs": epochs,
                   "seconds": time.perf_counter() - t0})
  print(json.dumps({"runs": runs, "torch_threads": torch.get_num_threads(),
                    "optim": str(targs.optim)}))


def run_hf(hf: pathlib.Path, cola_dir: str, workdir: pathlib.Path, args) -> dict:
  if workdir.exists():
    shutil.rmtree(workdir)
  cmd = [sys.executable, "-m", "bench.quality.suite_cola", "--worker=hf", f"--hf={hf}",
         f"--cola_dir={cola_dir}", f"--out={workdir}",
         f"--learning_rates={','.join(f'{v:g}' for v in args.learning_rates)}",
         f"--seeds={args.seeds}", f"--epochs={args.epochs}", f"--batch={args.batch}",
         f"--max_seq_length={args.max_seq_length}"]
  res = timed(cmd)
  out = json.loads(res["proc"].stdout.strip().splitlines()[-1])
  mccs: dict[float, list[float]] = {}
  for r in out["runs"]:
    mccs.setdefault(float(r["learning_rate"]), []).append(r["mcc"])
  return {"seconds": res["seconds"], "cpu": res["cpu"], "others_cpu": res["others_cpu"],
          "mccs": mccs, "torch_threads": out["torch_threads"],
          "optim": out["optim"], "runs": out["runs"]}


# ----------------------------------------------------------------------------
# The table.

def _stats(values: list[float]) -> dict[str, float]:
  return {"median": statistics.median(values), "mean": statistics.fmean(values),
          "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def _fmt_mccs(values: list[float]) -> str:
  return ", ".join(f"{v:.4f}" for v in values)


def tables(rounds: list[dict], args) -> tuple[str, str, list[str]]:
  """The wall-clock table (per round), the MCC table (per setting and round), the verdicts."""
  times = ("| round | order | bert_jax s (fresh workdir) | transformers s | transformers / "
           "bert_jax | bert_jax rerun s (XLA cache warm) | transformers / bert_jax rerun | "
           "others' CPU-s during bert_jax / transformers / rerun |\n"
           "|---|---|---|---|---|---|---|---|\n")
  for i, r in enumerate(rounds, start=1):
    b, h = r["bert_jax"], r["hf"]
    times += (f"| {i} | {r['order']} | {b['seconds']:.1f} | {h['seconds']:.1f} | "
              f"{h['seconds'] / b['seconds']:.2f}x | {b['cached_seconds']:.1f} | "
              f"{h['seconds'] / b['cached_seconds']:.2f}x | {b['others_cpu']:.0f} / "
              f"{h['others_cpu']:.0f} / {b['cached_others_cpu']:.0f} |\n")
  ratios = [r["hf"]["seconds"] / r["bert_jax"]["seconds"] for r in rounds]
  med = lambda key, system="bert_jax": statistics.median(r[system][key] for r in rounds)
  cached_ratios = [r["hf"]["seconds"] / r["bert_jax"]["cached_seconds"] for r in rounds]
  times += (f"| median | | {med('seconds'):.1f} | {med('seconds', 'hf'):.1f} | "
            f"{statistics.median(ratios):.2f}x | {med('cached_seconds'):.1f} | "
            f"{statistics.median(cached_ratios):.2f}x | |\n")
  mcc_table = ("| lr | round | bert_jax MCC per seed | bert_jax median / mean / std | "
               "transformers MCC per seed | transformers median / mean / std | "
               "medians within the larger std |\n|---|---|---|---|---|---|---|\n")
  within = []
  for lr in args.learning_rates:
    for i, r in enumerate(rounds, start=1):
      b, h = r["bert_jax"]["mccs"][lr], r["hf"]["mccs"][lr]
      sb, sh = _stats(b), _stats(h)
      ok = abs(sb["median"] - sh["median"]) <= max(sb["std"], sh["std"])
      within.append(ok)
      mcc_table += (f"| {lr:g} | {i} | {_fmt_mccs(b)} | {sb['median']:.4f} / {sb['mean']:.4f} / "
                    f"{sb['std']:.4f} | {_fmt_mccs(h)} | {sh['median']:.4f} / {sh['mean']:.4f} / "
                    f"{sh['std']:.4f} | {'yes' if ok else 'no'} |\n")
  met = min(ratios) >= 1.3
  verdict = [f"speed (target >= 1.3x, compilation included): transformers / bert_jax = "
             f"{', '.join(f'{x:.2f}x' for x in ratios)} per round, "
             f"{'met in every round' if met else 'not met in every round'}",
             f"MCC (target: per-setting medians within the seed spread): "
             f"{sum(within)} of {len(within)} (setting, round) pairs within"]
  busy = [(i, system, r[system]["others_cpu"] / r[system]["seconds"])
          for i, r in enumerate(rounds, start=1) for system in ("bert_jax", "hf")]
  noisy = [f"round {i} {NAMES[system]} ({x:.2f} cores)" for i, system, x in busy if x > 0.1]
  if noisy:
    verdict.append("other processes used more than 0.1 core on average during " + ", ".join(noisy))
  return times, mcc_table, verdict


def main(argv=None) -> dict | None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", default="/tmp/bench_suite_cola")
  parser.add_argument("--cola_dir", default=str(DEFAULT_COLA))
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--learning_rates", default="1e-4,5e-5")
  parser.add_argument("--seeds", type=int, default=2, help="seeds 0 .. N-1 per learning rate")
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--max_seq_length", type=int, default=64)
  parser.add_argument("--max_wait_quiet", type=float, default=600,
                      help="seconds to wait before each subprocess for other processes to "
                           "use < 0.2 core (the machine may be shared)")
  parser.add_argument("--busy_limit", type=float, default=0.25,
                      help="repeat a measurement during which other processes averaged more "
                           "cores than this")
  parser.add_argument("--retries", type=int, default=2)
  parser.add_argument("--no_record", action="store_true", help="do not append to RESULTS.md")
  parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
  parser.add_argument("--hf", default="", help=argparse.SUPPRESS)
  parser.add_argument("--out", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  args.learning_rates = [float(v) for v in args.learning_rates.split(",") if v.strip()]
  if args.worker == "hf":
    return hf_worker(args)
  cola = os.path.abspath(args.cola_dir)
  if not all(os.path.isfile(os.path.join(cola, f"in_domain_{s}.tsv")) for s in ("train", "dev")):
    raise SystemExit(f"CoLA not found at {cola} (in_domain_train.tsv, in_domain_dev.tsv): "
                     "../shared/data is only on the project's machines.")
  if importlib.util.find_spec("accelerate") is None:
    raise SystemExit("transformers' Trainer needs accelerate>=1.1.0, which is not installed: "
                     "pip install 'accelerate>=1.1.0' (or pip install --no-deps "
                     "--target=DIR accelerate, then PYTHONPATH=DIR python -m "
                     "bench.quality.suite_cola ...).")
  workdir = pathlib.Path(args.workdir).resolve()
  hf = prepare_checkpoint(workdir)
  load_start, t_start = harness.load_average(), time.time()
  rounds, discarded = [], []
  for i in range(args.rounds):
    order = ("bert_jax", "hf") if i % 2 == 0 else ("hf", "bert_jax")
    r = {"order": " then ".join(NAMES[o] for o in order)}
    for system in order:
      r[system] = measure(system, hf, cola, workdir / f"round{i + 1}_{system}", args)
      discarded.extend((i + 1, system, d) for d in r[system]["discarded"])
    rounds.append(r)
  section = render(rounds, discarded, args, load_start, time.time() - t_start)
  harness.publish(__name__, section, record=not args.no_record)
  return {"rounds": rounds, "section": section}


def measure(system: str, hf: pathlib.Path, cola: str, workdir: pathlib.Path, args) -> dict:
  """One system's sweep once the machine is quiet; measured again (up to --retries times)
  when other processes used more than --busy_limit cores on average during it. The
  discarded attempts are kept in "discarded" (seconds, others' cores)."""
  run = run_bert_jax if system == "bert_jax" else run_hf
  discarded = []
  for attempt in range(args.retries + 1):
    quiet = wait_quiet(args.max_wait_quiet)
    out = run(hf, cola, workdir, args)
    busy = out["others_cpu"] / out["seconds"]
    extra = (f", rerun with the XLA cache {out['cached_seconds']:.1f} s"
             if system == "bert_jax" else f" ({out['torch_threads']} torch threads)")
    print(f"{workdir.name} attempt {attempt + 1}: {out['seconds']:.1f} s{extra}; MCC "
          f"{out['mccs']}; others {quiet:.2f} cores before, {busy:.2f} during (load {harness.load_average()})",
          flush=True)
    if busy <= args.busy_limit or attempt == args.retries:
      break
    discarded.append((out["seconds"], busy))
  out["discarded"] = discarded
  return out


def command(args) -> str:
  """The command line that reproduces this run (defaults left out)."""
  defaults = {"rounds": 2, "learning_rates": [1e-4, 5e-5], "seeds": 2, "epochs": 3, "batch": 32,
              "max_seq_length": 64, "max_wait_quiet": 600, "busy_limit": 0.25, "retries": 2}
  cmd = (f"PYTHONPATH={os.environ['PYTHONPATH']} " if os.environ.get("PYTHONPATH") else "")
  cmd += f"python -m bench.quality.suite_cola --workdir={args.workdir}"
  for key, default in defaults.items():
    value = getattr(args, key)
    if value != default:
      shown = ",".join(f"{v:g}" for v in value) if key == "learning_rates" else str(value)
      cmd += f" --{key}={shown}"
  return cmd


def render(rounds: list[dict], discarded: list, args, load_start: str, seconds: float) -> str:
  import accelerate  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  times, mcc_table, verdict = tables(rounds, args)
  hf0 = rounds[0]["hf"]
  cached_same = all(r["bert_jax"]["cached_mccs"] == r["bert_jax"]["mccs"] for r in rounds)
  n = len(args.learning_rates) * args.seeds
  return (
      f"\n{TITLE} ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d})\n\n"
      f"Command: `{command(args)}`  \n"
      f"Date: {datetime.datetime.now():%Y-%m-%d %H:%M}. Machine: {harness.machine()}; load "
      f"average (1/5/15 min) {load_start} at the start, {harness.load_average()} at the end ({seconds:.0f} s of "
      f"rounds); jax {jax.__version__}, torch {torch.__version__} "
      f"({hf0['torch_threads']} threads, torch's default), transformers "
      f"{transformers.__version__}, accelerate {accelerate.__version__}.  \n"
      f"Checkpoint: tiny BERT (2 layers, hidden 128, vocab 4096) pre-trained with "
      f"configs/tiny_pretrain.py, exported with `bert_jax.convert --to=huggingface`; both "
      f"systems start from that directory (new classifier head each). CoLA in-domain train "
      f"(8551) -> in-domain dev (527). Sweep: lr {', '.join(f'{v:g}' for v in args.learning_rates)}"
      f" x seeds 0-{args.seeds - 1} ({n} run{'s' if n > 1 else ''}), {args.epochs} epochs, "
      f"batch {args.batch}, L={args.max_seq_length}, 10% warmup + linear decay to 0, weight "
      f"decay 0.01 (not on LayerNorm/biases), eps 1e-6, clip 1.0, dropout 0.1, eval batch 64; "
      f"metric = the best epoch's dev MCC. bert_jax: the suite (`configs/suite.py:cola`, "
      f"protocol grid), Adam "
      f"without bias correction (BERT's optimizer), drops the last partial "
      f"batch (267 steps/epoch); transformers: `Trainer` with its standard AdamW "
      f"({hf0['optim']}, bias correction on), 268 steps/epoch. Wall-clock = the whole "
      f"subprocess of the sweep (start-up, imports, data, compilation, {n} runs with "
      f"evaluation); bert_jax in a fresh workdir (empty XLA cache), then rerun in that workdir "
      f"with only `xla_cache/` kept: the persistent compilation cache warm (its MCCs "
      f"{'identical to' if cached_same else 'DIFFER from'} the fresh run's). Each subprocess "
      f"starts once other processes use < 0.2 core (waiting up to {args.max_wait_quiet:.0f} s); "
      f"\"others' CPU-s\" = CPU time the rest of the machine used during it; a measurement "
      f"during which others averaged > {args.busy_limit:g} core is discarded and repeated (up "
      f"to {args.retries} times): "
      + (", ".join(f"round {i} {NAMES[sy]} {t:.1f} s ({b:.2f} cores busy)"
                   for i, sy, (t, b) in discarded) if discarded else "none") + " discarded.\n\n"
      f"{times}\n{mcc_table}\n"
      f"Targets: {'; '.join(verdict)}.\n")


if __name__ == "__main__":
  main()
