r"""The fine-tuning suite over pre-training runs' saved steps (the paper's Figure 2).

  python -m bert_jax.main --config=configs/suite.py:mnli --config.init_checkpoint=RUN_MLM,RUN_LTR \
      --config.checkpoint_steps=all --config.data_dir=glue_data --workdir=/tmp/fig2

`checkpoint_steps`: `all` (every step a run saved) or `K1,K2,...`; `init_checkpoint`: one
pre-training workdir of ours, or several separated by commas (one line each in the plot).
Each (run, step) is a whole suite in WORKDIR/history/<run>/step<K> (bert_jax/suite.py:
resumable, kill -9 safe), all sharing one XLA cache; then WORKDIR/history.json, history.md
and history.png give each task's chosen dev metric (and the run's held-out masked-LM
perplexity at that step, when it evaluated there) against the step.
"""
from __future__ import annotations

import os
from typing import Any

from absl import logging
import ml_collections

from bert_jax import loader, suite, suite_report
from bert_jax import metrics as metrics_lib
from common import errors, fileio


def _runs(config) -> list[tuple[str, str]]:
  """(name, path) of each pre-training run init_checkpoint names (names unique)."""
  paths = [p.strip() for p in str(config.init_checkpoint or "").split(",") if p.strip()]
  if not paths:
    raise errors.ConfigError("--config.checkpoint_steps needs --config.init_checkpoint: one "
                             "pre-training workdir of ours, or several separated by commas.")
  names = [os.path.basename(p.rstrip("/")) or p for p in paths]
  if len(set(names)) != len(names):
    names = [f"run{i}_{n}" for i, n in enumerate(names)]
  return list(zip(names, paths))


def saved_steps(run: str) -> list[int]:
  """The steps a pre-training workdir of ours saved, oldest first."""
  directory = fileio.path(run) / "checkpoints"
  if not loader.is_run(run) or not directory.is_dir():
    raise errors.ConfigError(f"--config.init_checkpoint: {run} is not a pre-training workdir of "
                             "ours (no checkpoints/ with saved steps): --config.checkpoint_steps "
                             "reads a run's saved steps.")
  return sorted(int(p.name) for p in loader.step_dirs(directory) if (p / "state").exists())


def steps_of(run: str, spec: str) -> list[int]:
  """The steps `spec` ("all" or "K1,K2,...") names in `run`; a step it did not save is a
  ConfigError listing the saved ones."""
  saved = saved_steps(run)
  if str(spec).strip() == "all":
    if not saved:
      raise errors.ConfigError(f"--config.checkpoint_steps=all: {run} saved no step yet.")
    return saved
  try:
    wanted = [int(s) for s in str(spec).split(",") if s.strip()]
  except ValueError:
    raise errors.ConfigError(f"--config.checkpoint_steps={spec!r}: 'all' or steps such as "
                             "1000,2000.") from None
  missing = [s for s in wanted if s not in saved]
  if missing or not wanted:
    raise errors.ConfigError(f"--config.checkpoint_steps={spec!r}: {run} has no saved step "
                             f"{', '.join(map(str, missing)) or '(none given)'}; it saved "
                             f"{', '.join(map(str, saved)) or 'none'}.")
  return sorted(set(wanted))


def _step_config(config, run: str, step: int, vocab: str) -> ml_collections.ConfigDict:
  sub = ml_collections.ConfigDict(config.to_dict())
  sub.init_checkpoint = os.fspath(fileio.path(run) / "checkpoints" / str(step))
  sub.checkpoint_steps = ""
  sub.vocab_path = vocab
  return sub


def run_history(config, workdir: str) -> dict[str, Any] | None:
  """Runs the suite from every (run, step) config.checkpoint_steps names, then writes the
  history report; None when stopped early (a rerun continues)."""
  runs = _runs(config)
  plan = [(name, run, step) for name, run in runs for step in steps_of(run, config.checkpoint_steps)]
  vocab = {run: config.vocab_path or loader.checkpoint_vocab(run) for _, run in runs}
  fileio.path(workdir).mkdir(parents=True, exist_ok=True)
  logging.info("history: %d suites (%s), outputs in %s/history", len(plan),
               ", ".join(f"{n}: steps {','.join(str(s) for m, _, s in plan if m == n)}"
                         for n, _ in runs), workdir)
  reports = {}
  for name, run, step in plan:
    sub_dir = fileio.join(workdir, "history", name, f"step{step}")
    report = suite.run_suite(_step_config(config, run, step, vocab[run]), sub_dir)
    if report is None:
      logging.info("history: stopped in %s; rerun the same command to continue.", sub_dir)
      return None
    reports[name, step] = report
  history = build_history(runs, reports)
  write_history(history, workdir)
  logging.info("history: report in %s (history.md, history.json, history.png); the suites "
               "under %s/history", workdir, workdir)
  return history


def build_history(runs: list[tuple[str, str]], reports: dict) -> dict[str, Any]:
  out = {"runs": {}}
  for name, run in runs:
    steps = {}
    for (n, step), report in sorted(reports.items(), key=lambda kv: (kv[0][0], kv[0][1])):
      if n != name:
        continue
      held_out = _perplexity_at(run, step)
      steps[str(step)] = {
          "mlm_perplexity": held_out,
          "tasks": {task: (t.get("dev") or {}).get(t["metric"]) for task, t in report["tasks"].items()},
          "metric": {task: t["metric"] for task, t in report["tasks"].items()}}
    out["runs"][name] = {"path": run, "steps": steps}
  return out


def _perplexity_at(run: str, step: int) -> float | None:
  evals = (fileio.read_json(fileio.path(run) / metrics_lib.EVAL_FILE, {}) or {}).get("eval") or {}
  return (evals.get(str(step)) or {}).get("mlm_perplexity")


def render_markdown(history: dict) -> str:
  lines = ["# Fine-tuning against pre-training steps", "",
           "Each cell: the suite's chosen dev metric (%) fine-tuned from that saved step; ppl: "
           "the run's held-out masked-LM perplexity there (when it evaluated at that step).", ""]
  for name, run in history["runs"].items():
    tasks = sorted({t for s in run["steps"].values() for t in s["tasks"]})
    metric = {t: next(s["metric"][t] for s in run["steps"].values() if t in s["metric"]) for t in tasks}
    lines += [f"## {name} (`{run['path']}`)", "",
              "| step | ppl | " + " | ".join(f"{t} {metric[t]}" for t in tasks) + " |",
              "|---|---|" + "---|" * len(tasks)]
    for step, s in sorted(run["steps"].items(), key=lambda kv: int(kv[0])):
      ppl = s["mlm_perplexity"]
      lines.append(f"| {step} | {'-' if ppl is None else f'{ppl:.2f}'} | "
                   + " | ".join("-" if s["tasks"].get(t) is None else f"{s['tasks'][t]:.1f}"
                                for t in tasks) + " |")
    lines.append("")
  return "\n".join(lines)


def render_plot(history: dict) -> bytes | None:
  """A PNG per task: the metric against the step, one line per pre-training run."""
  plt = suite_report.pyplot("history.png")
  if plt is None:
    return None
  tasks = sorted({t for r in history["runs"].values() for s in r["steps"].values() for t in s["tasks"]})
  fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(4.2 * max(len(tasks), 1), 3.4),
                           squeeze=False)
  for ax, task in zip(axes[0], tasks):
    for name, run in history["runs"].items():
      points = sorted((int(k), s["tasks"].get(task)) for k, s in run["steps"].items())
      points = [(k, v) for k, v in points if v is not None]
      ax.plot([k for k, _ in points], [v for _, v in points], marker="o", label=name)
    ax.set_xlabel("pre-training step")
    ax.set_ylabel(f"{task} dev (%)")
    ax.legend(fontsize=8)
  return suite_report.png_bytes(plt, fig)


def write_history(history: dict, workdir: str) -> None:
  root = fileio.path(workdir)
  fileio.write_json(root / "history.json", history)
  fileio.write_text_atomic(root / "history.md", render_markdown(history))
  png = render_plot(history)
  if png is not None:
    fileio.write_bytes_atomic(root / "history.png", png)
