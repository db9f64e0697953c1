r"""SWAG multiple-choice fine-tuning (one [CLS] score per choice, softmax over 4).

  python -m bert_jax.main --config=configs/swag.py --config.init_checkpoint=DIR \
      --config.vocab_path=vocab.txt --config.data_dir=swag --workdir=/tmp/swag
"""
import ml_collections

from bert_jax.configs import finetune


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = finetune.get_config()
  c.task = "swag"
  c.data_dir = ""  # holds the files below
  c.train_file = "train.csv"
  c.eval_file = "val.csv"
  c.global_batch_size = 16
  c.opt.learning_rate = 2e-5
  return c
