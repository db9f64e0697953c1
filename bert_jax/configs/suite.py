r"""The paper's evaluation in one command: fine-tune every task of a suite with a protocol.

  python -m bert_jax.main --config=configs/suite.py:glue --config.init_checkpoint=CKPT \
      --config.vocab_path=VOCAB --config.data_dir=glue_data --workdir=/tmp/glue

`:ARG` names a suite (glue, squad1, squad2, swag, conll, paper = all of them, embed) or a
comma-separated task list (`:cola,mrpc`); `--config.tasks=cola,rte` overrides it. Each
task's data sits in `data_dir/<directory>` as the downloads lay it out (the GLUE download
script's CoLA/, SST-2/, ..., diagnostic/; squad/ with train-v1.1.json ...; swag/;
conll2003/), or wherever `--config.task_dirs.<task>=DIR` says; `data_dir=tfds[:DIR]`
reads GLUE from a locally prepared TFDS copy. `embed` (contrastive fine-tuning into an
embedding model, configs/embed.py) trains on embed/train.jsonl (or .csv, .tsv, .parquet:
anchor, positive and optional negative columns), picks best/ on STS-B's dev.tsv (Spearman
of cosine similarity) and, when embed/beir/ holds a BEIR-layout directory, also reports
nDCG@10, Recall@100 and MRR@10 on its qrels/dev.tsv.

`protocol` picks the hyper-parameter grid of each task from PROTOCOLS below (data, not
code): `paper` (section 4 and appendix A.3 of the paper), `paper_grid` (the appendix's
grid), `fixed` (one setting for every task, no per-task tuning), or `grid` (`config.grid`,
yours). Every setting runs `seeds` times (`small_task_seeds` on the small GLUE tasks), each
in its own workdir under `runs/`; a rerun skips finished runs and resumes an interrupted
one. The report (report.md, report.json, report.png) gives per task the best run on dev
and the median, mean and spread over seeds of its setting; `submission/` holds the GLUE
server's files and the SQuAD predictions.
"""
import ml_collections

from bert_jax.configs import finetune

# The paper's GLUE protocol (section 4.1): batch 32, 3 epochs, lr chosen on dev.
_PAPER_GLUE = {"learning_rate": (5e-5, 4e-5, 3e-5, 2e-5), "global_batch_size": (32,),
               "num_epochs": (3,)}
# Protocol -> {task (or "*": every task not named) -> grid of fine-tuning settings}.
PROTOCOLS = {
    "paper": {
        **{t: _PAPER_GLUE for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli",
                                    "rte", "wnli")},
        # Section 4.2-4.4: the paper's own settings.
        "squad1": {"learning_rate": (5e-5,), "global_batch_size": (32,), "num_epochs": (3,)},
        "squad2": {"learning_rate": (5e-5,), "global_batch_size": (48,), "num_epochs": (2,)},
        "swag": {"learning_rate": (2e-5,), "global_batch_size": (16,), "num_epochs": (3,)},
        # Section 5.3 gives no NER setting: the GLUE one.
        "conll": _PAPER_GLUE,
        # Not in the paper: contrastive fine-tuning (configs/embed.py's defaults, those of
        # sentence-transformers' in-batch negatives recipes).
        "embed": {"learning_rate": (2e-5,), "global_batch_size": (64,), "num_epochs": (1,)},
    },
    # Appendix A.3: "the following range of possible values should work well across all tasks".
    "paper_grid": {"*": {"learning_rate": (5e-5, 3e-5, 2e-5), "global_batch_size": (16, 32),
                         "num_epochs": (2, 3, 4)}},
    # One setting for every task, at most 5 epochs: the "no per-task tuning" rule of
    # budget pre-training (Geiping & Goldstein 2023, "Cramming": lr 4e-5, batch 16, 5 epochs).
    "fixed": {"*": {"learning_rate": (4e-5,), "global_batch_size": (16,), "num_epochs": (5,)}},
}

GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
SUITES = {"glue": GLUE_TASKS, "squad1": ("squad1",), "squad2": ("squad2",), "swag": ("swag",),
          "conll": ("conll",), "paper": GLUE_TASKS + ("squad1", "squad2", "swag", "conll"),
          "embed": ("embed",)}
# The GLUE tasks the paper restarts several times for BERT-large ("small datasets").
SMALL_TASKS = ("cola", "mrpc", "stsb", "rte", "wnli")


def get_config(arg: str | None = "glue") -> ml_collections.ConfigDict:
  c = finetune.get_config()
  c.task = "suite"
  c.tasks = arg or "glue"  # a suite name (see SUITES) or a comma-separated task list
  c.protocol = "paper"  # paper | paper_grid | fixed | grid (= config.grid)
  c.grid = ml_collections.ConfigDict()  # protocol=grid: the settings every task runs
  c.grid.learning_rate = _PAPER_GLUE["learning_rate"]
  c.grid.global_batch_size = _PAPER_GLUE["global_batch_size"]
  c.grid.num_epochs = _PAPER_GLUE["num_epochs"]
  c.seeds = 1  # runs per setting (seeds seed, seed+1, ...)
  c.small_task_seeds = 0  # runs per setting on SMALL_TASKS; 0 = seeds (paper, BERT-large: 5)
  # How a task's setting is chosen: "best" = the setting of the best single run on dev
  # (the paper), "median" = the best median over seeds (robust to lucky seeds).
  c.select = "best"
  # Tasks that start from the chosen MNLI run's weights instead of init_checkpoint
  # (RoBERTa's practice, e.g. "rte,mrpc,stsb"); empty in the paper.
  c.init_from_mnli = ""
  # The suite over pre-training runs' saved steps (the paper's Figure 2, bert_jax/history.py):
  # "all" or "K1,K2,..." of each run init_checkpoint names (several: comma-separated).
  c.checkpoint_steps = ""
  c.data_dir = ""  # the directory holding every task's directory; tfds[:DIR] for GLUE via TFDS
  c.task_dirs = ml_collections.ConfigDict(
      {t: "" for t in GLUE_TASKS + ("ax", "squad1", "squad2", "swag", "conll", "embed")})
  c.max_seq_length = 0  # 0 = each task's own (128; SQuAD 384); else every task's
  c.submission = True  # GLUE test-set predictions (and AX) for the server, zipped
  c.retry_failed = False  # rerun runs recorded as failed (e.g. diverged to NaN)
  # Runs at a time, each on its own group of this host's devices (8 GPUs, 8 -> one run per
  # GPU); 1 = one run at a time on every device.
  c.parallel_runs = 1
  # c.compilation_cache_dir (configs/common.py): a rerun, or another suite on the same model,
  # compiles nothing.
  # The protocol sets these per run.
  for field in ("num_epochs", "global_batch_size"):
    del c[field]
  del c.opt["learning_rate"]
  # Adam with bias correction, as transformers' AdamW: what reproduces the figures users
  # compare with (transformers' on the same protocol, bench/RESULTS.md, issue 58: RTE from
  # all-MiniLM-L6-v2 56.1 vs 57.4, CoNLL-2003 from 4,000 sentences 50.3 vs 49.1 F1, and
  # CoLA). The paper's optimizer (False; configs/finetune.py's default) takes 3-6x larger
  # steps over the first hundreds of steps: 53.1 on that RTE, 78.0 on that CoNLL.
  c.opt.bias_correction = True
  finetune.add_packing(c)  # GLUE tasks only
  # Unpacked by default: the suite's many runs of a task (seeds, learning rates) then share one
  # compiled step per model shape, where packed rows would differ from run to run (the rows a
  # run's batches need); --config.packing=True packs them, a batch counting rows (as before).
  c.packing, c.packed_batch = False, "rows"
  return c
