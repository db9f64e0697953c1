r"""SQuAD fine-tuning: `configs/squad.py:v1` (v1.1) or `configs/squad.py:v2` (v2.0, no-answer).

  python -m bert_jax.main --config=configs/squad.py:v1 --config.init_checkpoint=DIR \
      --config.vocab_path=vocab.txt --config.train_file=train-v1.1.json \
      --config.eval_file=dev-v1.1.json --workdir=/tmp/squad

Writes predictions.json (+ null_odds.json for v2.0) and metrics.json (EM/F1; v2.0 also
HasAns/NoAns and the null threshold that maximises dev F1).
"""
import ml_collections

from bert_jax.configs import finetune


def get_config(arg: str | None = "v1") -> ml_collections.ConfigDict:
  c = finetune.get_config()
  c.task = "squad"
  c.train_file = ""  # train-v1.1.json / train-v2.0.json (full path)
  c.eval_file = ""  # dev-v1.1.json / dev-v2.0.json
  c.doc_stride = 128  # windows over long contexts
  c.max_query_length = 64
  # Longest predicted span in tokens (BERT's 30). It cuts real answers: the SQuAD 2.0 dev set
  # has 6 gold answers of 31-43 tokens. The evaluation log counts the gold answers it cuts
  # (metrics: answers_over_max_length = questions left with no reachable gold answer).
  c.max_answer_length = 30
  c.n_best_size = 20
  c.null_score_threshold = 0.0  # v2.0: predict "" when null score - best span > this
  c.version_2_with_negative = arg == "v2"
  # bilstm_units > 0 (finetune.py): a randomly initialised BiLSTM between the encoder and the
  # span classifier, as the paper's Table 5 adds to its left-to-right model ("+ BiLSTM").
  c.max_seq_length = 384
  c.global_batch_size = 32
  c.num_epochs = 2
  c.opt.learning_rate = 3e-5
  return c
