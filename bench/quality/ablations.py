"""The BERT paper's Table 5 (effect of the pre-training tasks) at tiny scale, through the
main job and the fine-tuning suite:

    python -m bench.quality.ablations --workdir=/tmp/bench_ablations [--steps=900] [--no_record]

Pre-trains configs/tiny_pretrain.py on the built-in corpus (its own vocabulary; same model,
steps, batch and schedule for every row) as
  - MLM + NSP  (BERT: --config.objective=mlm, data.nsp=True)
  - MLM only   ("No NSP": data.nsp=False)
  - LTR        ("LTR & No NSP": --config.objective=ltr, data.nsp=False; a left-to-right LM,
               left-only attention at fine-tuning too)
or, with --table=electra,
  - MLM only   (data.nsp=False), --steps steps
  - ELECTRA    (--config.objective=electra: the same network as the discriminator, ELECTRA's
               embedding width and gelu, a generator of 1/4 its width), as many steps as
               make the same pre-training FLOPs (objectives.Objective.flops of each step)
then fine-tunes each on CoLA (../shared/data/cola/raw: in_domain_train -> in_domain_dev)
and, when --sst2 names GLUE's SST-2 directory (train.tsv, dev.tsv; default
../shared/data/glue/SST-2), on SST-2 too, through `configs/suite.py` with one grid for all rows
(--lrs x 3 epochs, batch 32, --seeds seeds, the best run on dev reported as the paper does,
the median beside it). Prints the table (held-out pre-training numbers, CoLA dev MCC, SST-2
dev accuracy) and appends it to bench/results/quality.md unless --no_record. Skips when the CoLA
data is absent; without SST-2's the table has CoLA alone and says so.
"""
from __future__ import annotations

import argparse
import ast
import datetime
import json
import pathlib
import subprocess
import sys
import time

from bench import harness

REPO = pathlib.Path(harness.REPO)
COLA = REPO.parent / "shared" / "data" / "cola" / "raw"
SST2 = REPO.parent / "shared" / "data" / "glue" / "SST-2"
# The fine-tuning tasks of the table: (suite task, its name, its dev metric in report.json).
TASKS = (("cola", "CoLA", "mcc"), ("sst2", "SST-2", "accuracy"))
ROWS = {"MLM + NSP (BERT)": [],
        "No NSP (MLM only)": ["--config.data.nsp=False"],
        "LTR & No NSP": ["--config.objective=ltr", "--config.data.nsp=False"]}
SLUGS = {"MLM + NSP (BERT)": "mlm_nsp", "No NSP (MLM only)": "mlm_only", "LTR & No NSP": "ltr",
         "ELECTRA (replaced-token detection)": "electra"}
# The tiny config's network as an ELECTRA discriminator (configs/tiny_pretrain.py: 2 layers,
# hidden 128, 2 heads, feed-forward 512).
ELECTRA = ["--config.objective=electra", "--config.data.nsp=False", "--config.model.family=electra",
           "--config.model.preset=electra-small", "--config.model.num_layers=2",
           "--config.model.hidden_size=128", "--config.model.num_heads=2",
           "--config.model.intermediate_size=512", "--config.model.embedding_size=128"]
ELECTRA_ROWS = {"No NSP (MLM only)": ["--config.data.nsp=False"],
                "ELECTRA (replaced-token detection)": ELECTRA}


def step_flops(flags: list[str]) -> float:
  """Model FLOPs of one pre-training step of configs/tiny_pretrain.py with `flags` (the
  objective's count, as the job's MFU uses)."""
  from bert_jax import registry  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import tiny_pretrain  # pylint: disable=g-import-not-at-top
  config = tiny_pretrain.get_config()
  for flag in flags:
    key, value = flag.removeprefix("--config.").split("=", 1)
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    try:
      node[leaf] = ast.literal_eval(value)  # numbers and booleans, as the flag parser reads them
    except (ValueError, SyntaxError):
      node[leaf] = value  # a name
  model, objective, _ = registry.pretraining(config, config.build.vocab_size)
  data = config.data
  shapes = {"input_ids": (config.global_batch_size, data.max_seq_length),
            "masked_lm_positions": (config.global_batch_size, data.max_predictions_per_seq)}
  return float(objective.flops(model, shapes))


def _run(cmd: list[str], log: pathlib.Path) -> float:
  t = time.perf_counter()
  with log.open("w") as f:
    subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, check=True)
  return time.perf_counter() - t


def _last_eval(log: pathlib.Path) -> str:
  lines = [l for l in log.read_text().splitlines() if "eval at step" in l]
  if not lines:
    return "?"
  step, *scalars = lines[-1].split("eval at step", 1)[1].split("|")
  return f"step {step.strip()}: " + ", ".join(x.strip() for x in scalars)


def _finetune(pre: pathlib.Path, out: pathlib.Path, dirs: dict[str, pathlib.Path],
              args: argparse.Namespace, log: pathlib.Path) -> tuple[dict, float]:
  """The suite on `dirs`' tasks from the checkpoint in `pre`: (report.json's tasks, seconds)."""
  seconds = _run([sys.executable, "-m", "bert_jax.main", "--config=configs/suite.py",
                  f"--workdir={out}", f"--config.tasks={','.join(dirs)}",
                  f"--config.init_checkpoint={pre}", f"--config.vocab_path={pre / 'vocab'}",
                  *(f"--config.task_dirs.{task}={d}" for task, d in dirs.items()),
                  "--config.protocol=grid", f"--config.grid.learning_rate=({args.lrs},)",
                  "--config.grid.global_batch_size=(32,)", "--config.grid.num_epochs=(3,)",
                  f"--config.seeds={args.seeds}", "--config.max_seq_length=64",
                  "--config.submission=False"], log)
  return json.loads((out / "report.json").read_text())["tasks"], seconds


def _cells(result: dict, metric: str) -> str:
  """A task's table cells: its best dev score, the chosen setting's median and its lr."""
  median = (result.get("spread") or {}).get("median")
  return (f"{result['dev'][metric]:.3g} | {'-' if median is None else format(median, '.3g')} | "
          f"{(result.get('hparams') or {}).get('learning_rate')}")


def _table(args: argparse.Namespace, flops: dict, rows: list, names: list[str]) -> str:
  title = ("Table 5 at tiny scale: pre-training tasks ablation" if args.table == "5" else
           "ELECTRA vs masked LM at the same pre-training FLOPs, tiny scale")
  columns = [(t, n, m) for t, n, m in TASKS if t in names]
  scored = " and ".join(f"{n} dev {m}" for _, n, m in columns)
  lines = [f"## {title} ({datetime.date.today()})", "",
           f"Command: `python -m bench.quality.ablations --table={args.table} --workdir={args.workdir} "
           f"--steps={args.steps} --lrs={args.lrs} --seeds={args.seeds}`; machine: "
           f"{harness.machine()}.",
           f"Tiny BERT (configs/tiny_pretrain.py: 2 layers, hidden 128, L=64), batch 64 on the "
           f"built-in corpus; {scored} through the suite (lr {args.lrs} x 3 epochs, batch 32, "
           f"L=64, {args.seeds} seeds; best run, median of the chosen setting)"
           + ("." if "sst2" in names else f"; SST-2 not run ({args.sst2} is absent)."), "",
           "| pre-training | steps | model GFLOPs a step | held-out eval at the last step | "
           + "".join(f"{n} dev {m} (best) | median | chosen lr | " for _, n, m in columns)
           + "pre-train s | suite s |",
           "|---" * (6 + 3 * len(columns)) + "|"]
  for name, steps, ev, results, pre_s, ft_s in rows:
    lines.append(f"| {name} | {steps} | {flops[name] / 1e9:.1f} | {ev} | "
                 + "".join(_cells(results[t], m) + " | " for t, _, m in columns)
                 + f"{pre_s:.0f} | {ft_s:.0f} |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--table", choices=("5", "electra"), default="5")
  parser.add_argument("--cola", default=str(COLA), help="CoLA 1.1's raw files")
  parser.add_argument("--sst2", default=str(SST2), help="GLUE's SST-2 directory (skipped "
                      "when absent)")
  parser.add_argument("--workdir", default="/tmp/bench_ablations")
  parser.add_argument("--steps", type=int, default=900)
  parser.add_argument("--lrs", default="1e-4,3e-4,1e-3")
  parser.add_argument("--seeds", type=int, default=2)
  parser.add_argument("--no_record", action="store_true")
  args = parser.parse_args(argv)
  dirs = {"cola": pathlib.Path(args.cola), "sst2": pathlib.Path(args.sst2)}
  if not dirs["cola"].exists():
    print(f"skipped: {dirs['cola']} is absent (CoLA 1.1's raw files)")
    return
  dirs = {task: d for task, d in dirs.items() if d.exists()}
  root = pathlib.Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)
  table = ROWS if args.table == "5" else ELECTRA_ROWS
  flops = {name: step_flops(flags) for name, flags in table.items()}
  budget = args.steps * flops[next(iter(table))]  # the first row's steps set the FLOPs
  rows = []
  for name, flags in table.items():
    slug = SLUGS[name]
    steps = args.steps if args.table == "5" else max(1, round(budget / flops[name]))
    pre = root / slug / "pretrain"
    pre_s = _run([sys.executable, "-m", "bert_jax.main", "--config=configs/tiny_pretrain.py",
                  f"--workdir={pre}", f"--config.num_train_steps={steps}"] + flags,
                 root / f"{slug}_pretrain.log")
    results, ft_s = _finetune(pre, root / slug / "_".join(dirs), dirs, args,
                              root / f"{slug}_{'_'.join(dirs)}.log")
    rows.append((name, steps, _last_eval(root / f"{slug}_pretrain.log"), results, pre_s, ft_s))
  text = _table(args, flops, rows, list(dirs))
  print(text)
  if not args.no_record:
    harness.append(__name__, "\n" + text)


if __name__ == "__main__":
  main()
