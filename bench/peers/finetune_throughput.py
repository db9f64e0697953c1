"""Fine-tuning throughput on CoLA through the real entry point, for two checkouts side by side.

    python -m bench.peers.finetune_throughput [--other=/path/to/older/checkout] [--rounds=2]

Builds a MiniLM-sized BERT (6 layers, hidden 384, 12 heads; random weights, saved in the
native format that every version reads) and a word-level vocabulary of CoLA, then runs
`python -m bert_jax.main --config=configs/glue.py:cola` for --steps steps (one epoch of the
first steps x batch CoLA training sentences; L=64, batch 32,
dropout on, unpacked) from this checkout and, with --other, from another one (e.g. a
`git worktree` of an older commit), alternating rounds. Throughput is read from the log's
own timestamps between the first and last progress lines after the first (compilation
excluded): tokens/s = steps/s x batch x L. Appends the table to bench/results/peers.md unless
--no_record. Needs ../shared/data/cola (skips otherwise).
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile

from bench import harness

REPO = pathlib.Path(harness.REPO)
DEFAULT_COLA = REPO.parent / "shared" / "data" / "cola" / "raw"
STEP_LINE = re.compile(r"^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*\bstep (\d+)/\d+ \|")


def step_times(log: str) -> dict[int, float]:
  """step -> seconds since midnight of each progress line in a job's log."""
  times = {}
  for line in log.splitlines():
    m = STEP_LINE.match(line)
    if m:
      h, mi, sec, step = m.groups()
      times[int(step)] = int(h) * 3600 + int(mi) * 60 + float(sec)
  return times


def job_seconds_per_step(cmd: list[str], cwd, env: dict, first: int, last: int) -> dict:
  """Runs a training job `cmd`; its s/step from the timestamps of its progress lines at steps
  `first` and `last` (compilation and start-up before `first` excluded)."""
  proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
  times = step_times(proc.stderr)
  if first not in times or last not in times:
    raise RuntimeError(f"{' '.join(cmd)}\nno progress lines at steps {first} and {last} (rc "
                       f"{proc.returncode}):\n{proc.stderr[-3000:]}")
  elapsed = (times[last] - times[first]) % 86400  # across midnight too
  return {"s_per_step": elapsed / (last - first), "elapsed": elapsed}


def make_checkpoint(root: pathlib.Path, cola_dir: str) -> tuple[str, str]:
  """A random MiniLM-sized native checkpoint and a word-level vocabulary of CoLA."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax import formats  # pylint: disable=g-import-not-at-top
  from bert_jax.models import bert as model_lib  # pylint: disable=g-import-not-at-top
  words = set()
  for name in ("in_domain_train.tsv", "in_domain_dev.tsv"):
    for line in open(os.path.join(cola_dir, name), encoding="utf-8"):
      words.update(re.findall(r"\w+|[^\w\s]", line.split("\t")[-1].lower()))
  chars = {c for w in words for c in w}
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words) + sorted(
      f"##{c}" for c in chars)
  (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
  (root / "tokenizer_config.json").write_text('{"do_lower_case": true}')
  cfg = model_lib.BertConfig(vocab_size=len(vocab), hidden_size=384, num_layers=6, num_heads=12,
                             intermediate_size=1536, max_position_embeddings=512)
  ids = jnp.ones((1, 8), jnp.int32)
  params = nn.unbox(model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, ids, ids, ids))["params"]
  formats.save_native(str(root / "ckpt"), cfg, params)
  return str(root / "ckpt"), str(root)


def subset(cola_dir: str, out: pathlib.Path, train_rows: int, dev_rows: int) -> str:
  """The first rows of CoLA's in-domain train and dev files: exactly the steps measured, in
  one epoch, for every version (older ones have no max_steps_per_run for fine-tuning)."""
  out.mkdir(parents=True, exist_ok=True)
  for name, n in (("in_domain_train.tsv", train_rows), ("in_domain_dev.tsv", dev_rows)):
    lines = open(os.path.join(cola_dir, name), encoding="utf-8").read().splitlines(keepends=True)
    (out / name).write_text("".join(lines[:n]))
  return str(out)


def run_once(repo: pathlib.Path, ckpt: str, vocab: str, cola_dir: str, workdir: str,
             steps: int, log_every: int, batch: int, seq_len: int) -> dict:
  args = [sys.executable, "-m", "bert_jax.main", "--config=configs/glue.py:cola",
          f"--workdir={workdir}", f"--config.init_checkpoint={ckpt}", f"--config.vocab_path={vocab}",
          f"--config.data_dir={cola_dir}", f"--config.max_seq_length={seq_len}",
          f"--config.global_batch_size={batch}", f"--config.log_every_steps={log_every}",
          "--config.num_epochs=1", "--config.checkpoint_every_steps=100000",
          "--config.packing=False"]  # unpacked, as the docstring says (the job packs by default)
  env = dict(os.environ, PYTHONPATH=str(repo), TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=3600)
  times = step_times(proc.stderr)
  done = sorted(s for s in times if s <= steps)
  if len(done) < 3:
    raise RuntimeError(f"{repo}: too few progress lines (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
  first, last = done[1], done[-1]  # the first line includes compilation
  steps_per_s = (last - first) / (times[last] - times[first])
  return {"steps_per_s": steps_per_s, "tokens_per_s": steps_per_s * batch * seq_len}


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--other", default="", help="another checkout to compare with")
  parser.add_argument("--other_label", default="other")
  parser.add_argument("--cola_dir", default=str(DEFAULT_COLA))
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--log_every", type=int, default=5)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq_len", type=int, default=64)
  parser.add_argument("--no_record", action="store_true")
  args = parser.parse_args(argv)
  if not os.path.isdir(args.cola_dir):
    print(f"CoLA not found at {args.cola_dir}: skipped (../shared/data is only on the project's machines).")
    return []
  checkouts = [("this checkout", REPO)] + ([(args.other_label, pathlib.Path(args.other))] if args.other else [])
  rows = {label: [] for label, _ in checkouts}
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    ckpt, vocab = make_checkpoint(tmp, args.cola_dir)
    cola = subset(args.cola_dir, tmp / "cola", args.batch * args.steps, 64)
    for r in range(args.rounds):
      for label, repo in (checkouts if r % 2 == 0 else checkouts[::-1]):
        out = run_once(repo, ckpt, vocab, cola, str(tmp / f"run_{label}_{r}".replace(" ", "_")),
                       args.steps, args.log_every, args.batch, args.seq_len)
        rows[label].append(out["tokens_per_s"])
        print(f"round {r + 1} {label}: {out['tokens_per_s']:,.0f} tokens/s ({out['steps_per_s']:.3f} steps/s)",
              flush=True)
  summary = [{"checkout": label, "tokens_per_s": statistics.median(v), "runs": v} for label, v in rows.items()]
  cpu = platform.processor() or platform.machine()
  try:
    cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  table = (f"\n## Fine-tuning throughput, CoLA ({datetime.date.today()})\n\n"
           f"Command: `python -m bench.peers.finetune_throughput --rounds={args.rounds} --steps={args.steps}"
           f"{' --other=<checkout>' if args.other else ''}`; MiniLM-sized BERT (6 layers, hidden 384), "
           f"L={args.seq_len}, batch {args.batch}, fp32, dropout on, unpacked; {os.cpu_count()} cores, {cpu}.\n\n"
           "| checkout | tokens/s (median) | runs |\n|---|---|---|\n"
           + "".join(f"| {s['checkout']} | {s['tokens_per_s']:,.0f} | "
                     f"{', '.join(f'{x:,.0f}' for x in s['runs'])} |\n" for s in summary))
  harness.publish(__name__, table, record=not args.no_record)
  return summary


if __name__ == "__main__":
  main()
