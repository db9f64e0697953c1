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


def _model() -> ml_collections.ConfigDict:
  """The model: a preset of bert_jax.models.bert.PRESETS; None fields keep the preset's value."""
  m = ml_collections.ConfigDict()
  m.family = "bert"  # bert_jax/registry.py FAMILIES
  m.preset = "base"  # tiny | mini | small | medium | base | large
  m.num_layers = config_dict.placeholder(int)
  m.hidden_size = config_dict.placeholder(int)  # intermediate follows at 4x if unset
  m.num_heads = config_dict.placeholder(int)
  m.intermediate_size = config_dict.placeholder(int)
  m.vocab_size = config_dict.placeholder(int)  # None: the vocabulary's size
  # ELECTRA: embeddings narrower than the hidden size, projected (None: the preset's)
  m.embedding_size = config_dict.placeholder(int)
  m.max_position_embeddings = 512  # phase 2 trains all 512 positions
  # None: the family's (BERT: 2 segment types and "gelu_tanh", the original TF BERT's;
  # RoBERTa: 1 and "gelu", exact erf as HuggingFace; ELECTRA: 2 and "gelu").
  m.type_vocab_size = config_dict.placeholder(int)
  m.hidden_act = config_dict.placeholder(str)
  m.hidden_dropout_rate = 0.1
  m.attention_dropout_rate = 0.1
  m.dtype = "bfloat16"  # compute dtype; master weights stay param_dtype
  m.param_dtype = "float32"  # master weights and optimizer state
  m.remat = "none"  # none | attention | dots | full: what the backward pass recomputes
  m.scan_layers = False  # nn.scan over layers: compile time flat in depth
  m.attention_impl = config_dict.placeholder(str)  # jax.nn.dot_product_attention impl
  # "fp8": the encoder layers' dense matmuls through FP8 (bert_jax/models/fp8.py; BERT, RoBERTa,
  # ELECTRA, DeBERTa); unset: in model.dtype
  m.matmul_dtype = config_dict.placeholder(str)
  m.dropout_rng = "hash"  # hash (cheap counter hash) | threefry (jax.random.bernoulli)
  return m


def _build() -> ml_collections.ConfigDict:
  """What the job builds into the workdir when data.vocab_path / data.prepared_dir are
  missing (relative paths are taken inside the workdir)."""
  b = ml_collections.ConfigDict()
  b.corpus = ""  # corpus spec to build from ("default" = built-in); "" = never build
  b.vocab_size = 30522  # vocabulary entries to train
  # wordpiece | sentencepiece | bpe (byte-level); "" = the model family's (its published
  # checkpoints': bert_jax/families.py vocab_kind)
  b.vocab_kind = ""
  b.max_chars = config_dict.placeholder(int)  # train the vocab on at most this text
  b.num_shards = 16  # prepared shards (>= the number of hosts)
  b.max_replaced_fraction = 0.01  # refuse a corpus file with more non-UTF-8 bytes
  b.text_field = "text"  # JSON field / Parquet or Arrow column / TFDS feature of the text
  b.max_bad_records = 0  # records without usable text to skip (counted) before failing
  return b


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
  # init_checkpoint with another vocabulary than data.vocab_path's: "none" refuses it; "fvt"
  # rebuilds its vocabulary-indexed rows for the new tokens (a shared token keeps its row, a
  # new one is the mean of its old pieces' rows: bert_jax/vocab_transfer.py); "random" draws
  # the new tokens' rows instead (the baseline FVT is measured against).
  c.vocab_transfer = "none"
  c.electra = ml_collections.ConfigDict()
  c.electra.generator_size = 0.25
  c.electra.discriminator_weight = 50.0

  c.model = _model()

  # Data: the pre-training input pipeline (input_pipeline/pretrain.py).
  c.data = data_config.default_data_config()
  c.data.max_seq_length = 128  # phase 1: 90% of steps at 128 tokens ...
  c.data.max_predictions_per_seq = 20  # ... with at most 20 masked positions
  # Build the vocabulary / prepared corpus into the workdir when data.vocab_path /
  # data.prepared_dir are missing (relative paths are taken inside the workdir).
  c.build = _build()
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
  # Also evaluate the weights a run starts from (step 0: a continued pre-training's baseline).
  c.eval_at_start = False
  return c
