"""Peak memory of `bert_jax.predict` against the number of input lines.

    python -m bench.data.predict_memory                        # 1,000 and 10,000 lines
    python -m bench.data.predict_memory --lines=1000,10000 --other=/path/to/older/checkout
    python -m bench.data.predict_memory --smoke                # seconds
    python -m bench.data.predict_memory --modes=features       # features written to .npy

A ~1M-parameter BERT (vocab 4096, hidden 128, 2 layers, L=128) is written to a temp dir as
an export with its vocab.txt, plus a fine-tuned-classifier workdir (best/), and an input
file of N lines of ~20 words with one [MASK]. Each (mode, N) runs `python -m
bert_jax.predict` in a fresh process (fill_mask, classify, features) that prints its own peak RSS
(ru_maxrss) at exit; with --other, the same in that checkout (PYTHONPATH), alternating.
Memory should not grow with N (batches of --batch_size); the time is shown too. Appends
to bench/results/data.md unless --no_record (or --smoke).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from bench import harness

REPO = harness.REPO
WORDS = ("the of and to in is was for that with as on by he it at from his an were are "
         "which this be or had not but first one their its new after who they have her "
         "she two been other when there all during into school time may years more most").split()
_CHILD = ("import atexit, resource, runpy, sys\n"
          "atexit.register(lambda: print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF)"
          ".ru_maxrss, file=sys.stderr))\n"
          "sys.argv = ['predict'] + sys.argv[1:]\n"
          "runpy.run_module('bert_jax.predict', run_name='__main__')\n")


def _build(root: str) -> tuple[str, str]:
  """(export dir, fine-tuning workdir) of a ~1M-parameter model with a 4,096-entry vocab."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax import formats, heads  # pylint: disable=g-import-not-at-top
  from bert_jax.models import bert as model_lib  # pylint: disable=g-import-not-at-top
  tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
  tokens += [f"w{i}" for i in range(4096 - len(tokens))]
  cfg = model_lib.BertConfig(vocab_size=4096, hidden_size=128, num_layers=2, num_heads=2,
                             intermediate_size=512, max_position_embeddings=128)
  ids = jnp.ones((1, 4), jnp.int32)
  export = os.path.join(root, "export")
  params = nn.unbox(model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, ids, ids, ids))
  formats.save_native(export, cfg, jax.tree.map(np.asarray, params["params"]))
  with open(os.path.join(export, "vocab.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(tokens) + "\n")
  work = os.path.join(root, "ft")
  clf = nn.unbox(heads.BertForSequenceClassification(cfg, num_labels=2).init(
      jax.random.key(1), ids, ids, ids))["params"]
  formats.save_native(os.path.join(work, "best"), cfg, jax.tree.map(np.asarray, clf))
  with open(os.path.join(work, "best", "config.json"), "w", encoding="utf-8") as f:
    json.dump({"labels": ["neg", "pos"], "task": {"task": "custom", "max_seq_length": 128,
                                                  "vocab_path": export}}, f)
  return export, work


def _inputs(root: str, n: int) -> str:
  path = os.path.join(root, f"lines_{n}.txt")
  rng = __import__("random").Random(n)
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(n):
      words = [rng.choice(WORDS) for _ in range(20)]
      words[rng.randrange(20)] = "[MASK]"
      f.write(" ".join(words) + "\n")
  return path


def _run(checkout: str, args: list[str]) -> tuple[float, float]:
  """(peak RSS MB, seconds) of one predict process in `checkout`."""
  env = harness.child_env(checkout, JAX_PLATFORMS="cpu")
  t0 = time.perf_counter()
  kb = harness.run_child([sys.executable, "-c", _CHILD] + args, cwd=checkout, env=env,
                         mark="MAXRSS_KB ")
  return int(kb) / 1024, time.perf_counter() - t0


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--lines", default="1000,10000")
  parser.add_argument("--modes", default="fill_mask,classify")
  parser.add_argument("--other", default="", help="another checkout to measure alike")
  parser.add_argument("--smoke", action="store_true")
  parser.add_argument("--no_record", action="store_true")
  args = parser.parse_args()
  counts = [20, 100] if args.smoke else [int(x) for x in args.lines.split(",")]
  checkouts = [("this", REPO)] + ([("other", os.path.abspath(args.other))] if args.other else [])
  rows = []
  with tempfile.TemporaryDirectory() as root:
    export, work = _build(root)
    for mode in args.modes.split(","):
      for n in counts:
        for name, checkout in checkouts:
          flags = [f"--input_file={_inputs(root, n)}", f"--mode={mode}",
                   f"--vocab={os.path.join(export, 'vocab.txt')}",
                   f"--checkpoint={work if mode == 'classify' else export}"]
          if mode == "features":  # every token's last layer: N x 128 x 128 float32 written
            flags.append(f"--output={os.path.join(root, f'features_{n}_{name}.npy')}")
          mb, s = _run(checkout, flags)
          rows.append((mode, n, name, mb, s))
          print(f"{mode:10s} {n:>7,} lines  {name:6s}  peak RSS {mb:8,.0f} MB  {s:7.1f} s",
                flush=True)
  if args.smoke or args.no_record:
    return
  harness.record(
      __name__, "predict: peak memory vs input lines",
      "~1M-parameter model (vocab 4096, hidden 128, 2 layers), lines of ~20 words with one "
      "[MASK]; a fresh process per row.\n\n| mode | lines | checkout | peak RSS MB | s |\n"
      "|---|---|---|---|---|\n"
      + "".join(f"| {m} | {n:,} | {c} | {mb:,.0f} | {s:.1f} |\n" for m, n, c, mb, s in rows),
      command=harness.command("bench.data.predict_memory", None), machine=harness.machine())


if __name__ == "__main__":
  main()
