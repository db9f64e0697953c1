r"""python -m bert_jax.main --config=configs/default.py --workdir=/tmp/bert_default

Base configuration: BERT-base pre-training as in the paper, phase 1 (L=128, P=20).
Every knob of a pre-training run is one field here or in configs/common.py (the fields
every job shares); the other pre-training configs import this one and override a
few fields (configs/base_pretrain.py, large_pretrain.py, tiny_pretrain.py). Override anything on the command line, e.g.
`--config.opt.learning_rate=5e-5 --config.mesh_shape.fsdp=8`; unknown keys fail.
"""
import ml_collections
from ml_collections import config_dict

from bert_jax.configs import common
from input_pipeline import data_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = common.get_config()
  c.task = "pretrain"
  # What is optimised, with the model it needs (bert_jax/registry.py PRETRAINING): "mlm" =
  # masked LM, plus next-sentence prediction when data.nsp (BERT).
  c.objective = "mlm"
  # objective=electra (replaced-token detection; --config.model.family=electra): the
  # generator's width as a fraction of the discriminator's (hidden, heads, feed-forward; the
  # ELECTRA paper: 1/4 small, 1/3 base and large) and the weight of the discriminator's loss.
  c.electra = ml_collections.ConfigDict()
  c.electra.generator_size = 0.25
  c.electra.discriminator_weight = 50.0

  # Model: a preset of bert_jax.models.bert.PRESETS; None fields keep the preset's value.
  c.model = ml_collections.ConfigDict()
  c.model.family = "bert"  # bert_jax/registry.py FAMILIES
  c.model.preset = "base"  # tiny | mini | small | medium | base | large
  c.model.num_layers = config_dict.placeholder(int)
  c.model.hidden_size = config_dict.placeholder(int)  # intermediate follows at 4x if unset
  c.model.num_heads = config_dict.placeholder(int)
  c.model.intermediate_size = config_dict.placeholder(int)
  c.model.vocab_size = config_dict.placeholder(int)  # None: the vocabulary's size
  # ELECTRA: embeddings narrower than the hidden size, projected (None: the preset's)
  c.model.embedding_size = config_dict.placeholder(int)
  c.model.max_position_embeddings = 512  # phase 2 trains all 512 positions
  # None: the family's (BERT: 2 segment types and "gelu_tanh", the original TF BERT's;
  # RoBERTa: 1 and "gelu", exact erf as HuggingFace; ELECTRA: 2 and "gelu").
  c.model.type_vocab_size = config_dict.placeholder(int)
  c.model.hidden_act = config_dict.placeholder(str)
  c.model.hidden_dropout_rate = 0.1
  c.model.attention_dropout_rate = 0.1
  c.model.dtype = "bfloat16"  # compute dtype; master weights stay param_dtype
  c.model.param_dtype = "float32"  # master weights and optimizer state
  c.model.remat = "none"  # none | full | dots: recompute layer activations in backward
  c.model.scan_layers = False  # nn.scan over layers: compile time flat in depth
  c.model.attention_impl = config_dict.placeholder(str)  # jax.nn.dot_product_attention impl
  c.model.dropout_rng = "hash"  # hash (cheap counter hash) | threefry (jax.random.bernoulli)

  # Data: the pre-training input pipeline (input_pipeline/pretrain.py).
  c.data = data_config.default_data_config()
  c.data.max_seq_length = 128  # phase 1: 90% of steps at 128 tokens ...
  c.data.max_predictions_per_seq = 20  # ... with at most 20 masked positions
  # Build the vocabulary / prepared corpus into the workdir when data.vocab_path /
  # data.prepared_dir are missing (relative paths are taken inside the workdir).
  c.build = ml_collections.ConfigDict()
  c.build.corpus = ""  # corpus spec to build from ("default" = built-in); "" = never build
  c.build.vocab_size = 30522  # WordPiece entries to train
  c.build.vocab_kind = "wordpiece"  # wordpiece | sentencepiece
  c.build.max_chars = config_dict.placeholder(int)  # train the vocab on at most this text
  c.build.num_shards = 16  # prepared TFRecord files (>= the number of hosts)
  c.build.max_replaced_fraction = 0.01  # refuse a corpus file with more non-UTF-8 bytes
  c.build.text_field = "text"  # JSON field / Parquet or Arrow column / TFDS feature of the text
  c.build.max_bad_records = 0  # records without usable text to skip (counted) before failing
  c.synthetic_data = False  # random batches of the same shapes (benchmarks, tests)

  c.num_train_steps = 900_000  # the run stops here (phase 1 = 90% of the schedule)
  c.schedule.warmup_steps = 10_000
  c.schedule.decay_steps = 1_000_000  # the schedule's length (both phases); 0 = num_train_steps
  # kind "wsd" (warmup-stable-decay): decay_steps is the decay's length, starting at
  # decay_start (None: the last decay_steps of num_train_steps); rerun a workdir with a new
  # decay_start / num_train_steps to start the decay from any checkpoint.
  c.schedule.kind = "linear"  # linear (BERT) | wsd
  c.schedule.decay_shape = "linear"  # linear | 1-sqrt
  c.schedule.decay_start = config_dict.placeholder(int)

  # Held-out evaluation.
  c.eval_every_steps = 10_000  # 0 = only at the end
  c.eval_steps = 50  # held-out batches per evaluation (the same ones every time)
  return c
