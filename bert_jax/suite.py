r"""The fine-tuning suite: every task of a suite x every setting of a protocol x seeds, one report.

  python -m bert_jax.main --config=configs/suite.py:glue --config.init_checkpoint=CKPT \
      --config.vocab_path=VOCAB --config.data_dir=glue_data --workdir=/tmp/glue

The suite is a job like the others (config.task == "suite", bert_jax/configs/suite.py): it
plans the runs, checks every task's data before the first one, then runs each as the
fine-tuning job (bert_jax/finetune.py) in its own workdir `runs/<task>/<setting>/seed<k>`
and records `result.json` there once it has finished (or failed: a run that diverges is
reported as failed, the suite goes on). A rerun skips finished runs and resumes an
interrupted one from its checkpoint, so the report it writes is the same.

Per task it chooses a setting (the best run on dev, as the paper; or the best median
over seeds), evaluates the chosen run where the paper needs more (MNLI mismatched), writes
the GLUE server's test-set files from it (`submission/`, AX included) and copies its dev
predictions (SQuAD's in the official JSON format). The report comes last, written by
bert_jax/suite_report.py: `report.json`, `report.md`, `report.png` and the submission zip.

Runs of equal shapes share compiled programs through XLA's persistent compilation cache
(on by default in WORKDIR/xla_cache): the seeds of a setting compile once, and a rerun or
another suite on the same model compiles nothing.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
import time
import traceback
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np

from bert_jax import best_dir, checkpointing, finetune, finetuned, tasks
from bert_jax import trainer as trainer_lib
from bert_jax.configs import conll as conll_config
from bert_jax.configs import embed as embed_config
from bert_jax.configs import glue as glue_config
from bert_jax.configs import squad as squad_config
from bert_jax.configs import suite as suite_config
from bert_jax.configs import swag as swag_config
from bert_jax.suite_report import (METRICS, SUBMISSION_FILES, ZIP_NAME, build_report, dev_value,
                                   duration, spread, write_report)
from common import errors, fileio
from input_pipeline import glue
from input_pipeline.tokenizer import Tokenizer

TASKS = suite_config.GLUE_TASKS + ("squad1", "squad2", "swag", "conll", "embed")
# Each task's directory under config.data_dir, as the downloads lay them out (the GLUE
# download script's names; diagnostic/ holds AX).
DIRECTORIES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
               "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI", "ax": "diagnostic",
               "squad1": "squad", "squad2": "squad", "swag": "swag", "conll": "conll2003",
               "embed": "embed"}
SQUAD_FILES = {"squad1": ("train-v1.1.json", "dev-v1.1.json"),
               "squad2": ("train-v2.0.json", "dev-v2.0.json")}
AX_FILE = "diagnostic.tsv"
# Dev predictions of the chosen run copied to submission/ (SQuAD's in the official format).
DEV_PREDICTIONS = {"squad1": ("predictions.json",), "squad2": ("predictions.json", "null_odds.json"),
                   "swag": ("predictions.csv",), "conll": ("predictions.txt",),
                   "embed": ("dev_similarities.tsv",)}
# task=embed's training pairs in its directory: the first of these names found.
EMBED_TRAIN_FILES = ("train.jsonl", "train.csv", "train.tsv", "train.parquet")
RESULT_FILE = "result.json"
# Run-config fields that do not change a run's result (a rerun may change them).
_OPERATIONAL = ("max_steps_per_run", "log_every_steps", "checkpoint_every_steps",
                "keep_checkpoints", "keep_checkpoint_period", "async_checkpointing",
                "peak_flops_per_device", "mesh_shape", "logical_axis_rules", "eval_batch_size",
                "compilation_cache_dir")


@dataclasses.dataclass(frozen=True)
class Run:
  """One fine-tuning run of the suite."""
  task: str
  setting: str  # e.g. lr5e-05_b32_e3
  hparams: tuple[tuple[str, Any], ...]  # (field, value) the protocol sets
  seed: int
  dir: str  # relative to the suite workdir

  def describe(self) -> str:
    return f"{self.task} {self.setting} seed {self.seed}"


# ----------------------------------------------------------------------------
# Planning: tasks, protocol, settings, seeds.

def task_list(config) -> tuple[str, ...]:
  """The tasks config.tasks names: suites of suite_config.SUITES and tasks, comma-separated
  (e.g. `glue,squad1` or `cola,rte`)."""
  spec = str(config.tasks).strip()
  items = [t.strip() for t in spec.split(",") if t.strip()]
  unknown = [t for t in items if t not in TASKS and t not in suite_config.SUITES]
  if unknown or not items:
    raise errors.ConfigError(f"--config.tasks={spec!r}: unknown task{'s' if len(unknown) > 1 else ''} "
                      f"{', '.join(unknown) or '(none given)'}; name suites "
                      f"({', '.join(suite_config.SUITES)}) or tasks among {', '.join(TASKS)}.")
  tasks = [t for item in items for t in suite_config.SUITES.get(item, (item,))]
  return tuple(dict.fromkeys(tasks))


def grid(config, task: str) -> dict[str, tuple]:
  """The protocol's settings for `task`: {field: values}."""
  if config.protocol == "grid":
    table = {k: config.grid[k] for k in ("learning_rate", "global_batch_size", "num_epochs")}
    where = "--config.grid"
  elif config.protocol in suite_config.PROTOCOLS:
    protocol = suite_config.PROTOCOLS[config.protocol]
    table, where = protocol.get(task, protocol.get("*")), f"protocol {config.protocol!r}"
    if table is None:
      raise errors.ConfigError(f"protocol {config.protocol!r} has no setting for task {task}: add one "
                        "to PROTOCOLS in bert_jax/configs/suite.py, or use --config.protocol=grid.")
  else:
    raise errors.ConfigError(f"--config.protocol={config.protocol!r} is unknown: choose one of "
                      f"{', '.join(suite_config.PROTOCOLS)} or grid (your --config.grid).")
  out = {}
  for field in ("learning_rate", "global_batch_size", "num_epochs"):
    values = table.get(field, ())
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    if not values:
      raise errors.ConfigError(f"{where}.{field} holds no values (task {task}): give at least one, "
                        f"e.g. --config.grid.{field}=\"(2e-5,3e-5)\".")
    kind = float if field == "learning_rate" else int
    for v in values:
      if not isinstance(v, (int, float)) or v <= 0 or (kind is int and v != int(v)):
        raise errors.ConfigError(f"{where}.{field}={values}: every value must be a positive "
                          f"{'number' if kind is float else 'integer'}.")
    out[field] = tuple(kind(v) for v in values)
  return out


def plan(config) -> list[Run]:
  """Every run of the suite, in order (MNLI first when other tasks start from it)."""
  tasks = task_list(config)
  mnli_first = _init_from_mnli(config, tasks)
  if mnli_first:
    tasks = ("mnli",) + tuple(t for t in tasks if t != "mnli")
  if config.select not in ("best", "median"):
    raise errors.ConfigError(f"--config.select={config.select!r}: choose best (the best run on dev, "
                      "as the paper) or median (the best median over seeds).")
  for field in ("seeds", "small_task_seeds"):
    if config[field] < (1 if field == "seeds" else 0):
      raise errors.ConfigError(f"--config.{field}={config[field]}: it must be at least "
                        f"{1 if field == 'seeds' else 0} (0 = seeds).")
  runs = []
  for task in tasks:
    g = grid(config, task)
    n = (config.small_task_seeds or config.seeds) if task in suite_config.SMALL_TASKS else config.seeds
    for lr in g["learning_rate"]:
      for batch in g["global_batch_size"]:
        for epochs in g["num_epochs"]:
          setting = f"lr{lr:g}_b{batch}_e{epochs}"
          hp = (("learning_rate", lr), ("global_batch_size", batch), ("num_epochs", epochs))
          for k in range(n):
            seed = config.seed + k
            runs.append(Run(task, setting, hp, seed, f"runs/{task}/{setting}/seed{seed}"))
  return runs


def _init_from_mnli(config, tasks) -> tuple[str, ...]:
  names = tuple(t.strip() for t in str(config.init_from_mnli or "").split(",") if t.strip())
  if not names:
    return ()
  bad = [t for t in names if t not in TASKS or t == "mnli"]
  if bad:
    raise errors.ConfigError(f"--config.init_from_mnli names {', '.join(bad)}: list fine-tuning tasks "
                      "other than mnli, e.g. rte,mrpc,stsb.")
  if "mnli" not in tasks:
    raise errors.ConfigError("--config.init_from_mnli needs mnli among the suite's tasks (its chosen "
                      "run's weights start the others).")
  return names


# ----------------------------------------------------------------------------
# Each run's fine-tuning config.

def task_dir(config, task: str) -> str:
  if config.task_dirs.get(task):
    return config.task_dirs[task]
  if not config.data_dir:
    raise errors.ConfigError(f"Task {task}: config.data_dir is not set: pass --config.data_dir=DIR (the "
                      f"directory holding {DIRECTORIES[task]}/ and the other tasks' directories), "
                      f"or --config.task_dirs.{task}=DIR.")
  if config.data_dir.startswith("tfds") and task in suite_config.GLUE_TASKS + ("ax",):
    return config.data_dir
  return fileio.join(config.data_dir, DIRECTORIES[task])


def run_config(config, run: Run, init_checkpoint: str | None = None) -> ml_collections.ConfigDict:
  """The fine-tuning config of one run: the task's own config, the suite's shared fields,
  the protocol's setting and the run's seed."""
  module, arg = {"squad1": (squad_config, "v1"), "squad2": (squad_config, "v2"),
                 "swag": (swag_config, None), "conll": (conll_config, None),
                 "embed": (embed_config, None)}.get(
                     run.task, (glue_config, run.task))
  c = module.get_config(arg)
  for key, value in config.items():
    if key in ("task", "data_dir") or key not in c:
      continue
    if key == "max_seq_length" and not value:
      continue  # the task's own
    if isinstance(value, ml_collections.ConfigDict):
      for sub, v in value.items():
        c[key][sub] = v
    else:
      c[key] = value
  directory = task_dir(config, run.task)
  if run.task in SQUAD_FILES:
    c.train_file, c.eval_file = (fileio.join(directory, f) for f in SQUAD_FILES[run.task])
  elif run.task == "embed":
    _embed_files(config, c, directory)
  else:
    c.data_dir = directory
  for field, value in run.hparams:
    if field == "learning_rate":
      c.opt.learning_rate = value
    else:
      c[field] = value
  c.seed = run.seed
  if init_checkpoint:
    c.init_checkpoint = init_checkpoint
  return c


def _embed_files(config, c: ml_collections.ConfigDict, directory: str) -> None:
  """task=embed's inputs: the pairs in `directory`, STS-B's dev.tsv (best/ chosen on its
  Spearman) and `directory`/beir when there (retrieval among the dev metrics)."""
  root = fileio.path(directory)
  c.train_file = next((str(root / n) for n in EMBED_TRAIN_FILES if (root / n).exists()),
                      str(root / EMBED_TRAIN_FILES[0]))  # (missing: the reader names it)
  c.eval_file = fileio.join(task_dir(config, "stsb"), "dev.tsv")
  c.beir_dir = str(root / "beir") if (root / "beir").is_dir() else ""
  c.best_metric = "spearman"


def _identity(c: ml_collections.ConfigDict) -> dict[str, Any]:
  """The fields of a run config that decide its result."""
  return {k: v for k, v in trainer_lib.json_config(c).items() if k not in _OPERATIONAL}


# ----------------------------------------------------------------------------
# Checks before the first run: every task's data, every finished run's config.

@dataclasses.dataclass
class TaskInputs:
  train_examples: int
  splits: dict[str, list] = dataclasses.field(default_factory=dict)  # extra GLUE splits found
  skipped_rows: dict[str, int] = dataclasses.field(default_factory=dict)  # file -> malformed rows


def check(config, runs: list[Run], workdir: str) -> dict[str, TaskInputs]:
  """Reads every task's files (train, dev, and the test files the submission needs) and
  checks each run's config, before any run starts: a missing directory or file, a file in
  the wrong format or a config that cannot work is one ConfigError naming the task and
  file. Also refuses finished runs whose config differs from this command's."""
  inputs = {}
  for task in dict.fromkeys(r.task for r in runs):
    first = next(r for r in runs if r.task == task)
    c = run_config(config, first)
    try:
      finetune.check_config(c)
      inputs[task] = _read_task(config, task, c)
    except errors.UserError as e:
      raise errors.ConfigError(f"Task {task}: {e}") from None
    batch = max(grid(config, task)["global_batch_size"])
    if inputs[task].train_examples < batch:
      where = "--config.grid.global_batch_size" if config.protocol == "grid" else \
          f"protocol {config.protocol}"
      raise errors.ConfigError(f"Task {task}: {inputs[task].train_examples} training examples are fewer "
                        f"than one batch of {batch} ({where}): use smaller batches.")
  from_mnli = _init_from_mnli(config, tuple(inputs))
  for run in runs:
    saved = fileio.read_json(fileio.path(workdir) / run.dir / RESULT_FILE)
    if saved and "config" in saved:
      now = _identity(run_config(config, run))
      before = saved["config"]
      # (A task started from the chosen MNLI run has that run's best/ as init_checkpoint.)
      differ = [d for d in checkpointing.config_changes(before, now)
                if not (d.startswith("init_checkpoint:") and run.task in from_mnli)]
      if differ:
        fields = "; ".join(differ[:5])
        raise errors.ConfigError(f"{run.dir} finished with another config than this command's ({fields}); "
                          "nothing was changed. Rerun with the suite's own config (saved in each "
                          "run's result.json), or use another --workdir.")
  return inputs


def _read_task(config, task: str, c) -> TaskInputs:
  """Reads the task's files with the fine-tuning readers (a format error names file and
  line); returns the training-set size and the extra GLUE splits found."""
  train, _ = tasks.TASKS[c.task].read(c)  # the task's own reader, as fine-tuning reads it
  inputs = TaskInputs(len(train), skipped_rows=_skipped_rows(task_dir(config, task)))
  if task in suite_config.GLUE_TASKS:
    read = lambda split: tasks.glue_split(c, split)
    found = {}
    wanted = ["dev_mismatched"] if task == "mnli" else []
    if config.submission:
      wanted += [s for s in SUBMISSION_FILES.get(task, {}) if s != "ax"]
    for split in wanted:
      try:
        found[split] = read(split)
      except glue.MissingDataError as e:
        if split == "dev_mismatched":
          raise
        logging.warning("Task %s: %s No %s file for the GLUE submission.", task, e,
                        SUBMISSION_FILES[task][split])
    if task == "mnli" and config.submission:
      ax = _read_ax(config)
      if ax is not None:
        found["ax"] = ax
    inputs.splits = found
  return inputs


def _skipped_rows(directory: str) -> dict[str, int]:
  """The malformed GLUE rows skipped in the task's files (as the original code skips them),
  by file name: the report says how many."""
  prefix = directory.rstrip("/") + "/"
  return {p[len(prefix):]: n for p, n in sorted(glue.skipped_rows().items())
          if n and p.startswith(prefix)}


def _read_ax(config) -> list | None:
  """The GLUE diagnostic set (AX), predicted by the MNLI model; None (a warning) if absent."""
  directory = task_dir(config, "ax")
  if directory.startswith("tfds"):
    try:
      return glue.read_tfds_glue("mnli", "test", directory.partition(":")[2] or None, "glue/ax")
    except glue.MissingDataError as e:
      logging.warning("%s No AX.tsv for the GLUE submission.", e)
      return None
  path = fileio.join(directory, AX_FILE)
  if not fileio.path(path).exists():
    logging.warning("%s does not exist (the GLUE diagnostic set, set --config.task_dirs.ax): no "
                    "AX.tsv for the GLUE submission.", path)
    return None
  return glue.read_glue_file("mnli", path, "test")


# ----------------------------------------------------------------------------
# Running.

class _Progress:
  """One line per run start and end, with the suite's ETA from the steps still to go."""

  def __init__(self, runs: list[Run], inputs: dict[str, TaskInputs], todo: list[Run]):
    self.total, self.steps = len(runs), {}
    for r in runs:
      hp = dict(r.hparams)
      self.steps[r] = max(inputs[r.task].train_examples // hp["global_batch_size"], 1) * hp["num_epochs"]
    self.left = {r: self.steps[r] for r in todo}
    self.seconds = self.steps_done = 0.0
    self.index = {r: i + 1 for i, r in enumerate(runs)}

  def start(self, run: Run) -> None:
    logging.info("suite: run %d/%d start: %s (%d steps)", self.index[run], self.total,
                 run.describe(), self.steps[run])

  def end(self, run: Run, result: dict, seconds: float) -> None:
    self.seconds += seconds
    self.steps_done += self.steps[run]
    self.left.pop(run, None)
    metric = METRICS[run.task][0]
    what = (f"{metric} {dev_value(result, run.task, metric):.2f}" if result["status"] == "done"
            else f"FAILED ({result['error'].splitlines()[0][:200]})")
    eta = ""
    if self.left and self.steps_done:
      eta = f"; ETA {duration(sum(self.left.values()) * self.seconds / self.steps_done)} " \
            f"({len(self.left)} runs left)"
    logging.info("suite: run %d/%d end: %s: %s in %s%s", self.index[run], self.total,
                 run.describe(), what, duration(seconds), eta)


def _run_one(config, run: Run, workdir: str, init_checkpoint: str | None,
             devices=None) -> dict | None:
  """Fine-tunes one run (on `devices`, default all); returns its result record, or None when
  it stopped early (SIGTERM, max_steps_per_run): the suite then stops and a rerun continues it."""
  out = fileio.path(workdir) / run.dir
  c = run_config(config, run, init_checkpoint)
  if devices is not None:  # side by side, saves are synchronous: two asynchronous Orbax
    c.async_checkpointing = False  # saves from two threads raced in testing
  start = time.time()
  record = {"task": run.task, "setting": run.setting, "hparams": dict(run.hparams),
            "seed": run.seed, "config": _identity(c)}
  try:
    finetune.finetune(c, str(out), devices)
  except (errors.UserError, KeyboardInterrupt):
    raise
  except Exception as e:  # pylint: disable=broad-except  (a failed run is reported, not fatal)
    logging.error("suite: %s failed:\n%s", run.describe(), traceback.format_exc())
    record.update(status="failed", error=f"{type(e).__name__}: {e}", dev={},
                  seconds=time.time() - start)
    if jax.process_index() == 0:
      fileio.write_json(out / RESULT_FILE, record)
    return record
  saved = fileio.read_json(out / finetune.METRICS_FILE, {})
  if len(saved.get("epochs", [])) < c.num_epochs:
    return None  # stopped before its last epoch
  best = dict(saved["best"])
  record.update(status="done", epoch=best.pop("epoch"), step=best.pop("step"), dev=best,
                seconds=time.time() - start)
  if jax.process_index() == 0:
    fileio.write_json(out / RESULT_FILE, record)
  return record


def run_suite(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any] | None:
  """Runs the suite in `workdir` (holding its lock; main.run takes it); returns the report,
  or None when stopped early (a rerun continues)."""
  fileio.path(workdir).mkdir(parents=True, exist_ok=True)
  runs = plan(config)
  inputs = check(config, runs, workdir)
  results = {r: fileio.read_json(fileio.path(workdir) / r.dir / RESULT_FILE) for r in runs}
  todo = [r for r in runs if not results[r] or (config.retry_failed and results[r]["status"] != "done")]
  logging.info("suite: %d tasks (%s), protocol %s: %d runs, %d finished before, %d to run; "
               "outputs in %s", len(inputs), ", ".join(inputs), config.protocol, len(runs),
               len(runs) - len(todo), len(todo), workdir)
  progress = _Progress(runs, inputs, todo)
  groups = device_groups(config.parallel_runs)
  mnli_init = _init_from_mnli(config, tuple(inputs))
  chosen: dict[str, dict] = {}
  for task in inputs:
    task_runs = [r for r in runs if r.task == task]
    init = None
    if task in mnli_init:
      best = chosen.get("mnli", {}).get("best_run")
      if best is None:
        logging.error("suite: task %s starts from the chosen MNLI run, and no MNLI run finished.", task)
      init = str(best_dir.of(fileio.join(workdir, best["dir"]))) if best else None
    pending = [r for r in task_runs if r in todo]
    if task in mnli_init and init is None:
      for run in pending:
        results[run] = {"task": task, "setting": run.setting, "hparams": dict(run.hparams),
                        "seed": run.seed, "status": "failed", "dev": {}, "seconds": 0.0,
                        "error": "no finished MNLI run to start from"}
      pending = []
    stopped = _run_all(config, pending, workdir, init, groups, progress, results)
    if stopped:
      logging.info("suite: %s stopped before its end; rerun the same command to continue. "
                   "Outputs so far in %s", ", ".join(r.describe() for r in stopped), workdir)
      return None
    chosen[task] = choose(config, task, [(r, results[r]) for r in task_runs])
    if chosen[task].get("best_run"):
      chosen[task].update(_finalize(config, task, chosen[task], inputs[task], workdir))
  report = build_report(config, runs, results, chosen, inputs)
  write_report(report, workdir)
  logging.info("suite: report in %s (report.md, report.json, report.png)%s; runs under %s/runs; "
               "TensorBoard: tensorboard --logdir=%s/runs", workdir,
               f", GLUE submission in {workdir}/submission/{ZIP_NAME}"
               if report.get("submission", {}).get("zip") else "", workdir, workdir)
  return report


def device_groups(n: int) -> list[list | None]:
  """`n` disjoint groups of this host's devices, one run on each at a time ([None]: one run
  at a time on every device)."""
  if n < 1:
    raise errors.ConfigError(f"--config.parallel_runs={n}: at least 1 (runs at a time).")
  if n == 1:
    return [None]
  if jax.process_count() > 1:
    raise errors.ConfigError("--config.parallel_runs > 1 splits one host's devices into groups; with "
                      f"{jax.process_count()} processes every run spans all hosts: set it to 1.")
  devices = jax.local_devices()
  if len(devices) < n:
    raise errors.ConfigError(f"--config.parallel_runs={n}: this host has {len(devices)} devices; at "
                      "most one run per device.")
  size = len(devices) // n
  if len(devices) % n:
    logging.warning("suite: %d devices in %d groups of %d: %d devices stay idle.", len(devices),
                    n, size, len(devices) % n)
  logging.info("suite: %d runs at a time, each on %d of this host's %d devices.", n, size,
               len(devices))
  return [devices[i * size:(i + 1) * size] for i in range(n)]


def _run_all(config, runs: list[Run], workdir: str, init, groups, progress, results) -> list[Run]:
  """Runs `runs`, one per device group at a time (in order on one group); records their
  results; returns the runs that stopped early (SIGTERM, max_steps_per_run)."""
  free = queue.Queue()
  for g in groups:
    free.put(g)
  lock = threading.Lock()
  stopped = []

  def one(run: Run) -> None:
    devices = free.get()
    try:
      if stopped:
        return
      with lock:
        progress.start(run)
      t0 = time.time()
      result = _run_one(config, run, workdir, init, devices)
      with lock:
        if result is None:
          stopped.append(run)
        else:
          results[run] = result
          progress.end(run, result, time.time() - t0)
    finally:
      free.put(devices)

  if len(groups) == 1:
    for run in runs:
      one(run)
      if stopped:
        break
  else:
    with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
      for future in [pool.submit(one, run) for run in runs]:
        future.result()  # a UserError of one run ends the suite, as in sequence
  return stopped


# ----------------------------------------------------------------------------
# Choosing a setting per task, and what the chosen run gives beyond its dev metrics.

def choose(config, task: str, runs: list[tuple[Run, dict | None]]) -> dict[str, Any]:
  """The task's settings with their runs and spread over seeds, the chosen setting and its
  best run (config.select: the best single run, or the best median)."""
  metric = METRICS[task][0]
  settings = []
  for name in dict.fromkeys(r.setting for r, _ in runs):
    members = [(r, res) for r, res in runs if r.setting == name]
    rows = [{"seed": r.seed, "dir": r.dir, "status": (res or {}).get("status", "missing"),
             "dev": {m: dev_value(res, task, m) for m in (res or {}).get("dev", {})
                     if isinstance(res["dev"][m], (int, float))},
             "epoch": (res or {}).get("epoch"), "seconds": (res or {}).get("seconds"),
             **({"error": res["error"]} if res and res.get("error") else {})}
            for r, res in members]
    values = [row["dev"][metric] for row in rows if row["status"] == "done"]
    settings.append({"name": name, "hparams": dict(members[0][0].hparams), "runs": rows,
                     **spread(values)})
  done = [s for s in settings if s["n"]]
  out = {"metric": metric, "settings": settings}
  if not done:
    return out
  key = (lambda s: s["median"]) if config.select == "median" else (
      lambda s: max(r["dev"][metric] for r in s["runs"] if r["status"] == "done"))
  best_setting = max(done, key=key)  # the first of equals: the protocol's order
  best_run = max((r for r in best_setting["runs"] if r["status"] == "done"),
                 key=lambda r: r["dev"][metric])
  out.update(chosen=best_setting["name"], hparams=best_setting["hparams"], best_run=best_run,
             dev=dict(best_run["dev"]))
  return out


def _finalize(config, task: str, chosen: dict, inputs: TaskInputs, workdir: str) -> dict:
  """MNLI mismatched dev accuracy, the GLUE test-set files and the dev predictions of the
  chosen run; kept in tasks/<task>.json and reused while the chosen run stays the same."""
  root = fileio.path(workdir)
  run_dir = chosen["best_run"]["dir"]
  cache_path = root / "tasks" / f"{task}.json"
  cached = fileio.read_json(cache_path, {})
  if cached.get("run") == run_dir and all((root / f).exists() for f in cached.get("files", [])):
    return cached["extra"]
  extra: dict[str, Any] = {}
  files = []
  sub = root / "submission"
  sub.mkdir(parents=True, exist_ok=True)
  if task in suite_config.GLUE_TASKS and (inputs.splits or task == "mnli"):
    cfg, params, saved, labels = finetuned.load(str(root / run_dir))
    tok = Tokenizer.from_path(saved["vocab_path"], saved.get("lowercase"))
    for split, examples in inputs.splits.items():
      feats = glue.encode_examples(examples, tok, saved["max_seq_length"], labels)
      logits = finetuned.classifier_logits(cfg, params, feats, config.eval_batch_size, saved)
      if split == "dev_mismatched":
        extra["accuracy_mismatched"] = 100.0 * float(np.mean(np.argmax(logits, -1) == feats["labels"]))
        continue
      name = SUBMISSION_FILES[task][split]
      if labels is None:  # STS-B: scores on the task's 0-5 scale
        rows = [f"{ex.guid}\t{float(np.clip(l[0], 0.0, 5.0)):.3f}\n" for ex, l in zip(examples, logits)]
      else:
        rows = [f"{ex.guid}\t{labels[int(np.argmax(l))]}\n" for ex, l in zip(examples, logits)]
      if jax.process_index() == 0:
        fileio.write_text_atomic(sub / name, "index\tprediction\n" + "".join(rows))
      files.append(f"submission/{name}")
  for name in DEV_PREDICTIONS.get(task, ()):
    source = root / run_dir / name
    if source.exists():
      target = f"{task}_dev_{name}"
      if jax.process_index() == 0:
        fileio.write_text_atomic(sub / target, source.read_text())
      files.append(f"submission/{target}")
  if jax.process_index() == 0:
    fileio.write_json(cache_path, {"run": run_dir, "files": files, "extra": extra})
  return extra
