r"""Base fine-tuning configuration (the paper's defaults); the task configs add their fields.

  python -m bert_jax.main --config=configs/glue.py:cola --config.init_checkpoint=DIR \
      --config.vocab_path=vocab.txt --config.data_dir=glue_data/CoLA --workdir=/tmp/cola

`init_checkpoint`: a pre-training workdir of ours, a `python -m bert_jax.convert`
export, a HuggingFace BERT directory or a Google TF checkpoint. Only the small output
layer is new; all parameters are fine-tuned. The model's shape comes from the checkpoint;
`model` here holds what fine-tuning may change. Every field is read by the fine-tuning job
(tests/test_configs.py checks it); the task configs (glue.py, classify_custom.py, squad.py,
conll.py, swag.py) add the fields of their data.
"""
import ml_collections
from ml_collections import config_dict

from bert_jax.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = common.get_config()
  c.task = "glue"  # glue | custom | squad | conll | swag | embed
  # vocab.txt / SentencePiece model (or a HuggingFace model dir) of the checkpoint; "" = the
  # checkpoint's own (a HuggingFace / sentence-transformers directory's, the one its run recorded).
  c.vocab_path = ""
  # None: cased or uncased as the files beside the vocabulary say (a HuggingFace
  # tokenizer_config.json's do_lower_case, ...); True/False overrides them.
  c.lowercase = ml_collections.config_dict.placeholder(bool)

  c.model = ml_collections.ConfigDict()
  c.model.dtype = "float32"  # compute dtype
  # Dropout. BERT: hidden and attention (None: the paper's 0.1). ModernBERT/EuroBERT (the
  # checkpoint's family decides): embedding, attention, mlp and classifier (None: the
  # checkpoint's config.json, 0 in the published models); hidden_dropout_rate is BERT's.
  c.model.hidden_dropout_rate = ml_collections.config_dict.placeholder(float)
  c.model.attention_dropout_rate = ml_collections.config_dict.placeholder(float)
  c.model.embedding_dropout_rate = ml_collections.config_dict.placeholder(float)
  c.model.mlp_dropout_rate = ml_collections.config_dict.placeholder(float)
  c.model.classifier_dropout_rate = ml_collections.config_dict.placeholder(float)
  c.model.remat = "none"  # none | attention | dots | full (BERT-large, long L)
  c.model.scan_layers = False  # nn.scan over layers: compile time flat in depth

  # Feature-based (the paper's Table 7; every task, heads.FeatureBased): what the head reads
  # (last | embeddings | second_to_last | sum_last4 | concat_last4 | sum_all, the sums
  # softmax-weighted and learned), whether the encoder is frozen (no gradient, no optimizer
  # state), and bilstm_units > 0: bilstm_layers BiLSTMs (units each way) before the classifier.
  c.features = "last"
  c.freeze_encoder = False
  c.bilstm_units = 0
  c.bilstm_layers = 1
  # With freeze_encoder: run the encoder once per training example (without dropout, as the
  # paper extracts features) and train the head on the kept features; host memory holds them
  # all (examples x max_seq_length x the layers read x hidden, in model.dtype: logged).
  c.cache_features = False

  c.max_seq_length = 128
  c.global_batch_size = 32  # paper: 16 or 32
  c.eval_batch_size = 64
  c.num_epochs = 3  # paper: 2-4
  c.schedule.warmup_fraction = 0.1  # paper: 10% linear warmup, then linear decay to the end
  c.opt.learning_rate = 2e-5  # paper: 5e-5, 3e-5 or 2e-5
  c.opt.bias_correction = False
  c.checkpoint_every_steps = 1000  # plus one at every epoch end
  c.keep_checkpoints = 2  # the newest N (the best parameters are kept apart, in best/)
  c.keep_checkpoint_period = 0
  c.log_every_steps = 50
  return c


def add_packing(c: ml_collections.ConfigDict) -> None:
  """Sequence packing (classification): training examples share rows of max_seq_length
  (block-diagonal attention, positions and [CLS] per example), so short examples waste little
  compute on padding; the loss still averages over examples. Evaluation stays unpacked.

  packing unset (the default): each batch's examples are packed into the rows it needs
  (packed_batch "examples": the same batches, steps and hyperparameters as unpacked, the
  model trained the same) when the task classifies, the head reads the fine-tuned encoder
  (no features / freeze_encoder / BiLSTM) and the model is bidirectional; and only when that
  saves at least a tenth of the rows. True: packed as packed_batch says (an error where it
  cannot be); False: unpacked."""
  c.packing = config_dict.placeholder(bool)
  c.max_examples_per_row = 8
  # What global_batch_size counts when packing: "examples" (each batch of that many examples
  # packed into the rows it needs, the same batches as unpacked: the paper's batch sizes and
  # learning rates hold; its rows are the most any batch needs, counted at the start) or
  # "rows" (each epoch's examples packed, a batch that many rows: more examples a step).
  c.packed_batch = "examples"
