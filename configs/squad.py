r"""SQuAD fine-tuning: `configs/squad.py:v1` (v1.1) or `configs/squad.py:v2` (v2.0, no-answer).

  python -m bert_jax.main --config=configs/squad.py:v1 --config.init_checkpoint=DIR \
      --config.vocab_path=vocab.txt --config.train_file=train-v1.1.json \
      --config.eval_file=dev-v1.1.json --workdir=/tmp/squad

Writes predictions.json (+ null_odds.json for v2.0) and metrics.json (EM/F1; v2.0 also
HasAns/NoAns and the null threshold that maximises dev F1).
"""
import ml_collections

from configs import finetune


def get_config(arg: str | None = "v1") -> ml_collections.ConfigDict:
  c = finetune.get_config()
  c.task = "squad"
  c.version_2_with_negative = arg == "v2"
  c.max_seq_length = 384
  c.global_batch_size = 32
  c.num_epochs = 2
  c.opt.learning_rate = 3e-5
  return c
