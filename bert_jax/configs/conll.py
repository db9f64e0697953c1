r"""CoNLL-2003 NER fine-tuning (token classification, first WordPiece of each word).

  python -m bert_jax.main --config=configs/conll.py --config.init_checkpoint=DIR \
      --config.vocab_path=vocab.txt --config.data_dir=conll2003 --workdir=/tmp/ner

`data_dir` holds train.txt / valid.txt in CoNLL format (token POS chunk tag); for the
original CoNLL-2003 release, --config.train_file=eng.train --config.eval_file=eng.testa (dev;
eng.testb is the test set). Its IOB1 tags (an entity starts with I-) train as IOB2 (the
default tag_scheme, auto: a no-op on IOB2 tags); iob2 keeps the tags as they are.

`configs/conll.py:features` is the paper's feature-based approach (Table 7): the encoder
frozen, the concatenation of its last four layers (`--config.features=` embeddings | last |
second_to_last | sum_last4 | concat_last4 | sum_all, the sums softmax-weighted and learned)
read by a two-layer BiLSTM of 768 units each way before the classifier.
"""
import ml_collections

from bert_jax.configs import finetune


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = finetune.get_config()
  c.task = "conll"
  c.data_dir = ""  # holds the files below
  c.train_file = "train.txt"
  c.eval_file = "valid.txt"
  c.tag_scheme = "auto"  # auto (= iob1: IOB1 tags converted, IOB2 kept) | iob1 | iob2
  c.opt.learning_rate = 5e-5
  if arg == "features":
    c.features, c.freeze_encoder, c.bilstm_units, c.bilstm_layers = "concat_last4", True, 768, 2
    c.opt.learning_rate = 1e-3  # a new BiLSTM head on frozen features learns at an LSTM's rate
  elif arg:
    raise ValueError(f"configs/conll.py:{arg}: the argument is 'features' or nothing.")
  return c
