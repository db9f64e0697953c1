r"""python -m bert_jax.main --config=configs/modern_pretrain.py:modernbert-tiny --workdir=/tmp/mb

Pre-trains (or, with --config.init_checkpoint, continues pre-training) a modern encoder:
ModernBERT's architecture (presets modernbert-*, ettin-*, mmbert-*) or EuroBERT's
(eurobert-*), bert_jax/models/modern.py. The argument is a preset of modern.PRESETS (default
modernbert-tiny: 3 layers, hidden 128, 16-token sliding windows). Masked LM only (no NSP),
packed rows (attention within each example). Without init_checkpoint or data paths it
trains on the built-in corpus with its own WordPiece vocabulary, like tiny_pretrain.py.

ModernBERT's recipe: 30% masking (held-out evaluation at 15%), StableAdamW, a
warmup-stable-decay schedule with a 1-sqrt decay over its last schedule.decay_steps (rerun
the workdir with --config.schedule.decay_start=STEP and a larger num_train_steps to cool
down from any checkpoint). A context-extension phase reruns the workdir with a longer
data.max_seq_length and a new model.rope_theta (and max_position_embeddings): the weights
carry over, the input iterator starts afresh for the new data config.
"""
import ml_collections
from ml_collections import config_dict

from bert_jax.configs import default


def model_config(preset: str) -> ml_collections.ConfigDict:
  """config.model of a modern family: a preset plus overrides (None keeps the preset's)."""
  m = ml_collections.ConfigDict()
  m.family = "eurobert" if preset.startswith("eurobert") else "modernbert"
  m.preset = preset
  for name in ("vocab_size", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
               "intermediate_size", "local_window", "global_every"):
    setattr(m, name, config_dict.placeholder(int))
  for name in ("rope_theta", "local_rope_theta"):
    setattr(m, name, config_dict.placeholder(float))
  m.max_position_embeddings = config_dict.placeholder(int)
  m.embedding_dropout_rate = 0.0
  m.attention_dropout_rate = 0.0
  m.mlp_dropout_rate = 0.0
  m.dtype = "bfloat16"
  m.param_dtype = "float32"
  m.remat = "none"
  m.scan_layers = False
  m.attention = "banded"  # banded (local layers: the band only) | dense | splash (TPU kernel)
  # Global layers over packed rows: only the block pairs sharing an example, within this
  # share of all pairs (a batch needing more runs dense); 0 = dense.
  m.global_block_budget = 0.0
  m.global_block = 128
  m.attention_impl = config_dict.placeholder(str)
  m.dropout_rng = "hash"
  return m


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  preset = arg or "modernbert-tiny"
  c = default.get_config()
  c.model = model_config(preset)
  c.data.nsp = False
  c.data.packing = True
  c.data.max_examples_per_row = 8
  c.data.masked_lm_prob = 0.3
  c.data.eval_masked_lm_prob = 0.15
  c.opt.name = "stableadamw"
  c.opt.b1, c.opt.b2, c.opt.eps = 0.9, 0.98, 1e-6
  c.opt.weight_decay = 1e-5
  c.opt.bias_correction = True
  c.schedule.kind = "wsd"
  c.schedule.decay_shape = "1-sqrt"
  tiny = preset.endswith("-tiny")
  if tiny:  # the built-in corpus on a CPU in minutes, as configs/tiny_pretrain.py
    c.model.dtype = "float32"
    c.build.corpus = "default"
    c.build.vocab_size = 4096
    c.build.num_shards = 4
    c.data.vocab_path = "vocab"
    c.data.prepared_dir = "prepared"
    c.data.max_seq_length = 128
    c.data.max_predictions_per_seq = 40  # 30% of 128
    c.data.eval_fraction = 0.2
    c.global_batch_size = 32
    c.num_train_steps = 600
    c.opt.learning_rate = 1e-3
    c.schedule.warmup_steps = 60
    c.schedule.decay_steps = 120  # the cooldown: the last 120 steps
    c.checkpoint_every_steps = 200
    c.keep_checkpoints = 2
    c.keep_checkpoint_period = 0
    c.log_every_steps = 50
    c.eval_every_steps = 200
    c.eval_steps = 4
    c.eval_batch_size = 64
  else:  # ModernBERT's first phase: 1024 tokens, lr 8e-4 (on TPU: --config.model.attention=splash)
    c.data.max_seq_length = 1024
    c.data.max_predictions_per_seq = 320  # 30% of 1024
    c.opt.learning_rate = 8e-4
    c.schedule.warmup_steps = 3000
    c.schedule.decay_steps = 50_000
  return c
