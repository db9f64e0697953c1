r"""python -m bert_jax.main --config=configs/tiny_pretrain.py --workdir=/tmp/bert_tiny

Pre-trains a tiny BERT from scratch on the built-in corpus, on a laptop CPU in minutes.
Trains its own WordPiece vocabulary on the built-in corpus (Python's standard-library
documentation), tokenizes the corpus into the workdir, and pre-trains BERT-tiny
(2 layers, hidden 128; L=64) with MLM + NSP, evaluating on held-out documents. Re-running
the command reuses the vocabulary, the prepared data and the latest checkpoint (a
no-op once finished; raise --config.num_train_steps to continue).
"""
import ml_collections

from bert_jax.configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = default.get_config()
  c.model.preset = "tiny"
  c.model.dtype = "float32"  # CPU: bfloat16 matmuls are no faster here
  c.model.max_position_embeddings = 128
  c.model.hidden_dropout_rate = 0.0  # tiny model, few steps: dropout only slows learning
  c.model.attention_dropout_rate = 0.0
  c.build.corpus = "default"
  c.build.vocab_size = 4096
  c.build.num_shards = 4
  c.data.vocab_path = "vocab"  # in the workdir
  c.data.prepared_dir = "prepared"  # in the workdir
  # Short sequences: twice the NSP pairs per token, and the corpus (~430k tokens) is small.
  c.data.max_seq_length = 64
  c.data.max_predictions_per_seq = 10
  # The corpus is sorted by module name and the first documents are held out: 20% keeps
  # the held-out set diverse (not only asyncio.*).
  c.data.eval_fraction = 0.2
  c.global_batch_size = 64
  c.num_train_steps = 900
  c.opt.learning_rate = 1e-3
  c.opt.bias_correction = True
  c.schedule.warmup_steps = 100
  c.schedule.decay_steps = 0  # decay to 0 at num_train_steps, whatever it is set to
  c.checkpoint_every_steps = 300
  c.keep_checkpoints = 2
  c.keep_checkpoint_period = 0
  c.log_every_steps = 50
  c.eval_every_steps = 300
  c.eval_steps = 8  # 8 x 128 held-out examples
  c.eval_batch_size = 128
  return c
