r"""CoNLL-2003 NER fine-tuning (token classification, first WordPiece of each word).

  python -m bert_jax.main --config=configs/conll.py --config.init_checkpoint=DIR \
      --config.vocab_path=vocab.txt --config.data_dir=conll2003 --workdir=/tmp/ner

`data_dir` holds train.txt / valid.txt in CoNLL format (token POS chunk tag); set
--config.tag_scheme=iob1 for the original IOB1 tags.
"""
import ml_collections

from bert_jax.configs import finetune


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = finetune.get_config()
  c.task = "conll"
  c.data_dir = ""  # holds the files below
  c.train_file = "train.txt"
  c.eval_file = "valid.txt"
  c.tag_scheme = "iob2"  # iob1 | iob2
  c.opt.learning_rate = 5e-5
  return c
