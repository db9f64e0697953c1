"""CoLA from a small pre-trained checkpoint: pre-train tiny BERT (built-in corpus), fine-tune on CoLA.

    python -m bench.quality.cola --workdir=/tmp/bench_cola [--cola_dir=../shared/data/cola/raw]

Step 1 is the README's main job (configs/tiny_pretrain.py; reused if the workdir has it),
step 2 fine-tunes on CoLA (in-domain train -> in-domain dev) and reports Matthews
correlation per epoch; appends the result to bench/results/quality.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import time

from bert_jax import finetune, train
from bert_jax.configs import glue, tiny_pretrain

from bench import harness

DEFAULT_COLA = pathlib.Path(harness.REPO).parent / "shared" / "data" / "cola" / "raw"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--workdir", default="/tmp/bench_cola")
  parser.add_argument("--cola_dir", default=str(DEFAULT_COLA))
  parser.add_argument("--epochs", type=int, default=4)
  parser.add_argument("--learning_rate", type=float, default=5e-4)
  parser.add_argument("--max_seq_length", type=int, default=64)
  args = parser.parse_args(argv)
  if not os.path.isdir(args.cola_dir):
    raise SystemExit(f"CoLA not found at {args.cola_dir} (../shared/data is only on the project's machines).")
  pre_dir = os.path.join(args.workdir, "pretrain")
  t0 = time.time()
  train.train_and_evaluate(tiny_pretrain.get_config(), pre_dir)
  t1 = time.time()
  c = glue.get_config("cola")
  c.init_checkpoint, c.vocab_path, c.data_dir = pre_dir, os.path.join(pre_dir, "vocab"), args.cola_dir
  c.num_epochs, c.opt.learning_rate, c.max_seq_length = args.epochs, args.learning_rate, args.max_seq_length
  best = finetune.finetune(c, os.path.join(args.workdir, "cola"))
  t2 = time.time()
  line = (f"\n## CoLA from tiny pre-training ({datetime.date.today()})\n\n"
          f"Command: `python -m bench.quality.cola --epochs={args.epochs} --learning_rate={args.learning_rate} "
          f"--max_seq_length={args.max_seq_length}`  \nPre-training {t1 - t0:.0f} s, fine-tuning {t2 - t1:.0f} s "
          f"on {os.cpu_count()} CPU cores. Best in-domain dev: MCC {best['mcc']:.3f}, accuracy "
          f"{best['accuracy']:.3f} (epoch {best['epoch']}); majority-class baseline MCC 0.000, accuracy 0.693.\n")
  print(line)
  harness.append(__name__, line)


if __name__ == "__main__":
  main()
