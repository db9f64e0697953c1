"""The fine-tuning suite's report: what bert_jax/suite.py writes once its runs are done.

It owns the report's files, written from the suite's runs and each task's chosen setting:
`report.json` (the tasks with their settings, runs and spread over seeds, the paper's GLUE
score and rows), `report.md` (the same as tables, ours beside the paper's rows),
`report.png` (our dev numbers beside the paper's BERT-base and BERT-large rows) and the GLUE
submission zip (`submission/glue_submission.zip`), each replaced atomically by process 0;
the tables they read: the metrics the paper reports per task, the paper's rows, the GLUE
score's parts and the GLUE server's file names; and its numbers as it prints them (dev
metrics in %, the spread over seeds, durations), which the suite's choice and log share.
"""
from __future__ import annotations

import io
import json
import statistics
import zipfile
from typing import Any

from absl import logging
import jax
import numpy as np

from bert_jax import metrics as metrics_lib
from bert_jax import tasks
from bert_jax.configs import suite as suite_config
from common import fileio

# The metrics the paper reports per task (the first one chooses runs and settings); as the
# paper prints them: percentages.
METRICS = {"cola": ("mcc",), "sst2": ("accuracy",), "mrpc": ("f1", "accuracy"),
           "stsb": ("spearman", "pearson"), "qqp": ("f1", "accuracy"),
           "mnli": ("accuracy", "accuracy_mismatched"), "qnli": ("accuracy",),
           "rte": ("accuracy",), "wnli": ("accuracy",), "squad1": ("f1", "exact"),
           "squad2": ("f1", "exact"), "swag": ("accuracy",), "conll": ("f1",),
           "embed": ("spearman", "pearson") + tuple(f"beir_{m}" for m in tasks.BEIR_METRICS)}
_PERCENT_ALREADY = ("squad1", "squad2", "embed")  # their jobs report percentages
# The paper's rows (Devlin et al. 2019): GLUE test (Table 1), SQuAD v1.1 dev (Table 2),
# SQuAD v2.0 dev (Table 3, BERT-large only), SWAG dev (Table 4), CoNLL-2003 dev (Table 7).
REFERENCES = {
    "BERT-base": {"split": {"glue": "test", "other": "dev"},
                  "mnli": 84.6, "mnli_mm": 83.4, "qqp": 71.2, "qnli": 90.5, "sst2": 93.5,
                  "cola": 52.1, "stsb": 85.8, "mrpc": 88.9, "rte": 66.4, "glue_score": 79.6,
                  "squad1": 88.5, "swag": 81.6, "conll": 96.4},
    "BERT-large": {"split": {"glue": "test", "other": "dev"},
                   "mnli": 86.7, "mnli_mm": 85.9, "qqp": 72.1, "qnli": 92.7, "sst2": 94.9,
                   "cola": 60.5, "stsb": 86.5, "mrpc": 89.3, "rte": 70.1, "glue_score": 82.1,
                   "squad1": 90.9, "squad2": 81.9, "swag": 86.6, "conll": 96.6},
}
# The paper's GLUE score: the mean of these nine numbers (WNLI left out).
GLUE_SCORE_PARTS = (("mnli", "accuracy"), ("mnli", "accuracy_mismatched"), ("qqp", "f1"),
                    ("qnli", "accuracy"), ("sst2", "accuracy"), ("cola", "mcc"),
                    ("stsb", "spearman"), ("mrpc", "f1"), ("rte", "accuracy"))
# The GLUE server's file names; AX is predicted by the MNLI model.
SUBMISSION_FILES = {"cola": {"test": "CoLA.tsv"}, "sst2": {"test": "SST-2.tsv"},
                    "mrpc": {"test": "MRPC.tsv"}, "stsb": {"test": "STS-B.tsv"},
                    "qqp": {"test": "QQP.tsv"},
                    "mnli": {"test": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv", "ax": "AX.tsv"},
                    "qnli": {"test": "QNLI.tsv"}, "rte": {"test": "RTE.tsv"},
                    "wnli": {"test": "WNLI.tsv"}}
ZIP_NAME = "glue_submission.zip"


# ----------------------------------------------------------------------------
# The report.

def dev_value(result: dict, task: str, metric: str) -> float | None:
  """A run's dev `metric` from its result record, in % as the paper prints it (None: none)."""
  v = (result or {}).get("dev", {}).get(metric)
  if v is None:
    return None
  return float(v) if task in _PERCENT_ALREADY else 100.0 * float(v)


def spread(values: list[float]) -> dict[str, float]:
  """The spread over seeds of a setting's dev values: median, mean, std and their number."""
  if not values:
    return {"median": None, "mean": None, "std": None, "n": 0}
  return {"median": statistics.median(values), "mean": statistics.fmean(values),
          "std": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values)}


def glue_score(tasks: dict[str, dict]) -> dict[str, Any]:
  """The paper's GLUE score: the mean of MNLI-m, MNLI-mm, QQP F1, QNLI, SST-2, CoLA MCC,
  STS-B Spearman, MRPC F1 and RTE (WNLI left out); None unless all nine are there."""
  parts = {}
  for task, metric in GLUE_SCORE_PARTS:
    value = tasks.get(task, {}).get("dev", {}).get(metric)
    if task == "mnli" and metric == "accuracy_mismatched":
      value = tasks.get(task, {}).get("accuracy_mismatched")
    parts[f"{task}/{metric}"] = value
  have = [v for v in parts.values() if v is not None]
  return {"score": statistics.fmean(have) if len(have) == len(parts) else None,
          "parts": parts, "split": "dev"}


def build_report(config, runs: list, results: dict, chosen: dict,
                 inputs: dict[str, Any]) -> dict[str, Any]:
  """The report of the suite's `runs` (suite.Run), their `results` and each task's `chosen`
  setting, with each task's `inputs` (suite.TaskInputs)."""
  tasks = {}
  for task, c in chosen.items():
    entry = dict(c)
    if inputs[task].skipped_rows:
      entry["skipped_rows"] = dict(inputs[task].skipped_rows)
    if "accuracy_mismatched" in entry:
      entry.setdefault("dev", {})["accuracy_mismatched"] = entry["accuracy_mismatched"]
    chosen_setting = next((s for s in c["settings"] if s["name"] == c.get("chosen")), None)
    entry["spread"] = {k: chosen_setting[k] for k in ("median", "mean", "std", "n")} if chosen_setting else None
    entry["metrics"] = list(METRICS[task])
    entry["status"] = "done" if c.get("best_run") else "failed"
    entry["seconds"] = sum(s for s in (results[r].get("seconds") or 0.0 for r in runs
                                       if r.task == task and results.get(r)))
    tasks[task] = entry
  held_out = metrics_lib.held_out_perplexity(config.init_checkpoint) if config.init_checkpoint else None
  report = {"tasks_spec": str(config.tasks), "protocol": config.protocol, "select": config.select,
            "init_checkpoint": config.init_checkpoint,
            "init_mlm_perplexity": {"step": held_out[0], "value": held_out[1]} if held_out else None,
            "seeds": config.seeds,
            "bias_correction": bool(config.opt.get("bias_correction", False)),
            "small_task_seeds": config.small_task_seeds, "tasks": tasks,
            "references": REFERENCES}
  if any(t in suite_config.GLUE_TASKS for t in tasks):
    report["glue_score"] = glue_score(tasks)
  # The server takes a zip of every task's file (AX too): a suite of some GLUE tasks says
  # which it lacks.
  glue = any(t in SUBMISSION_FILES for t in tasks)
  files = sorted(n for t in SUBMISSION_FILES for n in SUBMISSION_FILES[t].values()) if glue else []
  report["submission"] = {"expected": files}
  return report


def duration(seconds: float) -> str:
  """`seconds` as the report and the suite's log print it: 1h02m, 3m05s or 42s."""
  seconds = int(round(seconds))
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
      f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _fmt(v, digits=1) -> str:
  return "-" if v is None else f"{v:.{digits}f}"


def _header(report: dict) -> list[str]:
  """The report's title, its checkpoint, how settings were chosen and the optimizer."""
  return [f"# Fine-tuning suite: {report['tasks_spec']} ({report['protocol']} protocol)", "",
          f"init_checkpoint: `{report['init_checkpoint']}`"
          + (f" (held-out masked-LM perplexity {report['init_mlm_perplexity']['value']:.2f} at "
             f"step {report['init_mlm_perplexity']['step']})" if report.get("init_mlm_perplexity")
             else "") + "; setting chosen by "
          f"{'the best single run' if report['select'] == 'best' else 'the best median over seeds'} "
          "on dev. Dev-set numbers in %.", "",
          "Optimizer: AdamW " + ("with bias correction (transformers'); "
                                  if report.get("bias_correction") else
                                  "without bias correction (the BERT paper's); ")
          + "--config.opt.bias_correction switches.", ""]


def render_markdown(report: dict) -> str:
  lines = _header(report) + [
      "| task | metric | best run | chosen setting | median | mean | std | seeds | epoch | time |",
      "|---|---|---|---|---|---|---|---|---|---|"]
  for task, t in report["tasks"].items():
    metric = t["metric"]
    if t["status"] != "done":
      errs = {r.get("error", r["status"]) for s in t["settings"] for r in s["runs"]}
      lines.append(f"| {task} | {metric} | FAILED ({'; '.join(sorted(errs))[:120]}) | | | | | | | |")
      continue
    others = ", ".join(f"{m} {_fmt(t['dev'].get(m))}" for m in t["metrics"][1:])
    sp = t["spread"]
    lines.append(
        f"| {task} | {metric} | {_fmt(t['dev'][metric])}" + (f" ({others})" if others else "")
        + f" | {t['chosen']} seed {t['best_run']['seed']} | {_fmt(sp['median'])} | {_fmt(sp['mean'])} "
        f"| {_fmt(sp['std'], 2)} | {sp['n']} | {t['best_run']['epoch']} | {duration(t['seconds'])} |")
  if "glue_score" in report:
    g = report["glue_score"]
    have = sum(v is not None for v in g["parts"].values())
    lines += ["", f"GLUE score (the paper's: mean of MNLI-m/mm, QQP F1, QNLI, SST-2, CoLA, "
                  f"STS-B Spearman, MRPC F1, RTE; dev): **{_fmt(g['score'])}**"
              if g["score"] is not None else
              f"GLUE score: needs the paper's nine GLUE numbers; this suite has {have}."]
  skipped = [f"{task} {name}: {n}" for task, t in report["tasks"].items()
             for name, n in t.get("skipped_rows", {}).items()]
  if skipped:
    lines += ["", "Malformed rows skipped (columns missing; the original BERT code skips them "
                  f"too): {', '.join(skipped)}."]
  lines += ["", "## Beside the paper", "",
            "The paper's rows are GLUE **test** scores (Table 1) and SQuAD/SWAG/CoNLL dev scores; ours are dev.",
            "", "| task | ours (dev) | BERT-base | BERT-large |", "|---|---|---|---|"]
  for key, ours in _comparison(report):
    base, large = REFERENCES["BERT-base"].get(key), REFERENCES["BERT-large"].get(key)
    lines.append(f"| {key} | {_fmt(ours)} | {_fmt(base)} | {_fmt(large)} |")
  lines += ["", "## Runs", "", "| task | setting | seed | status | metric | epoch | time |",
            "|---|---|---|---|---|---|---|"]
  for task, t in report["tasks"].items():
    for s in t["settings"]:
      for r in s["runs"]:
        lines.append(f"| {task} | {s['name']} | {r['seed']} | {r['status']} | "
                     f"{_fmt(r['dev'].get(t['metric']))} | {r.get('epoch') or '-'} | "
                     f"{duration(r['seconds']) if r.get('seconds') is not None else '-'} |")
  sub = report.get("submission", {})
  if sub.get("expected") and sub.get("present"):
    lines += ["", f"GLUE submission: `submission/{ZIP_NAME}` holds {len(sub['present'])} of "
                  f"the {len(sub['expected'])} files the server expects"
              + (f" (missing: {', '.join(sub['missing'])})" if sub.get("missing") else "") + "."]
  elif sub.get("expected"):
    lines += ["", "No GLUE submission: the tasks' test files were not found (expected "
                  f"{', '.join(sub['expected'])})."]
  return "\n".join(lines) + "\n"


def _comparison(report: dict) -> list[tuple[str, float | None]]:
  """(reference key, our number) for the tasks the suite ran."""
  out = []
  for task, t in report["tasks"].items():
    key = task
    if key not in REFERENCES["BERT-large"]:
      continue  # not a task of the paper (embed)
    out.append((key, t.get("dev", {}).get(t["metric"])))
    if task == "mnli":
      out.append(("mnli_mm", t.get("dev", {}).get("accuracy_mismatched")))
  if report.get("glue_score", {}).get("score") is not None:
    out.append(("glue_score", report["glue_score"]["score"]))
  return out


def pyplot(name: str):
  """matplotlib.pyplot on the Agg backend, or None (said) when matplotlib is not installed:
  no `name` then."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning("matplotlib is not installed: no %s (pip install matplotlib).", name)
    return None
  return plt


def png_bytes(plt, fig) -> bytes:
  """The figure as PNG bytes (no software tag: the same plot gives the same bytes), closed."""
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
  plt.close(fig)
  return buf.getvalue()


def render_plot(report: dict) -> bytes | None:
  """A PNG: our dev numbers beside the paper's BERT-base and BERT-large rows."""
  plt = pyplot("report.png")
  if plt is None:
    return None
  rows = _comparison(report)
  fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(rows) + 1.5), 3.6))
  x = np.arange(len(rows))
  glue_rows = any(k in suite_config.GLUE_TASKS for k, _ in rows)
  other_rows = any(k not in suite_config.GLUE_TASKS + ("mnli_mm", "glue_score") for k, _ in rows)
  split = "GLUE test, others dev" if glue_rows and other_rows else "test" if glue_rows else "dev"
  series = [("ours (dev)", [v for _, v in rows])] + [
      (f"{name} (paper, {split})", [REFERENCES[name].get(k) for k, _ in rows])
      for name in ("BERT-base", "BERT-large")]
  width = 0.27
  for i, (label, values) in enumerate(series):
    ax.bar(x + (i - 1) * width, [np.nan if v is None else v for v in values], width, label=label)
  ax.set_xticks(x, [k for k, _ in rows], rotation=30, ha="right")
  ax.set_ylabel("score (%)")
  ax.set_title(f"{report['tasks_spec']}, {report['protocol']} protocol")
  ax.legend(fontsize=8)
  return png_bytes(plt, fig)


def _zip(root, names: list[str]) -> bytes:
  """The submission zip: the files at its top level, fixed timestamps (same bytes each time)."""
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
    for name in names:
      info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
      info.compress_type = zipfile.ZIP_DEFLATED
      z.writestr(info, (root / "submission" / name).read_bytes())
  return buf.getvalue()


def write_report(report: dict, workdir: str) -> None:
  """report.json, report.md, report.png and the submission zip, each replaced atomically
  (process 0)."""
  if jax.process_index() != 0:
    return
  root = fileio.path(workdir)
  sub = report["submission"]
  sub["present"] = [n for n in sub["expected"] if (root / "submission" / n).exists()]
  sub["missing"] = [n for n in sub["expected"] if n not in sub["present"]]
  if sub["present"]:
    fileio.write_bytes_atomic(root / "submission" / ZIP_NAME, _zip(root, sub["present"]))
    sub["zip"] = f"submission/{ZIP_NAME}"
    if sub["missing"]:
      logging.warning("suite: the GLUE submission lacks %s (the server expects all %d files).",
                      ", ".join(sub["missing"]), len(sub["expected"]))
  png = render_plot(report)
  if png is not None:
    fileio.write_bytes_atomic(root / "report.png", png)
  fileio.write_text_atomic(root / "report.md", render_markdown(report))
  fileio.write_text_atomic(root / "report.json", json.dumps(report, indent=1, sort_keys=True))
