r"""Fine-tune on your own classification data (CSV / TSV with a header, or JSONL).

  python -m bert_jax.main --config=configs/classify_custom.py --config.init_checkpoint=DIR \
      --config.vocab_path=vocab.txt --config.train_file=train.csv --config.eval_file=dev.csv \
      --config.text_a_column=review --config.label_column=stars --workdir=/tmp/custom
"""
import ml_collections

from bert_jax.configs import finetune


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = finetune.get_config()
  c.task = "custom"
  c.train_file = ""  # full paths
  c.eval_file = ""
  c.text_a_column = "text"  # field names in the CSV/TSV header or JSONL records
  c.text_b_column = ""
  c.label_column = "label"
  # The classes, in order: --config.labels=neg,pos (or a tuple). A training or dev row with
  # another label is an error naming its file and line. () = the sorted labels of the
  # training file, each seen at least twice (a label seen once is an error: a typo would
  # silently add a class). The counts per label are logged.
  c.labels = ()
  finetune.add_packing(c)
  return c
