r"""GLUE fine-tuning: `configs/glue.py:<task>` (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli).

  python -m bert_jax.main --config=configs/glue.py:cola --config.init_checkpoint=DIR \
      --config.vocab_path=vocab.txt --config.data_dir=glue_data/CoLA --workdir=/tmp/cola

Data: the original GLUE TSV files of the task in `data_dir` (the CoLA 1.1 release's
in_domain_*.tsv names work too). Predictions go to `<workdir>/<Task>.tsv`, metrics to
`<workdir>/metrics.json`.
"""
import ml_collections

from bert_jax.configs import finetune


def get_config(arg: str | None = "cola") -> ml_collections.ConfigDict:
  c = finetune.get_config()
  c.task = "glue"
  c.glue_task = arg or "cola"  # cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli
  c.data_dir = ""  # the task's files (train.tsv, dev.tsv, ...); "tfds[:DIR]" = local TFDS glue/*
  c.tfds_name = ""  # with data_dir=tfds: the TFDS dataset ("" = glue/<glue_task>)
  c.eval_split = "dev"  # dev | dev_mismatched (MNLI)
  finetune.add_packing(c)
  if c.glue_task in ("rte", "mrpc", "stsb", "cola"):
    c.num_epochs = 3
  return c
