"""The pre-training data config (`config.data`): a module free of TensorFlow, so that
loading a config file imports nothing heavy (input_pipeline/pretrain.py reads it)."""
import ml_collections

from common import errors
from input_pipeline import mixture

# The data config's paths that a run takes inside its workdir when they are relative.
WORKDIR_PATHS = ("prepared_dir", "vocab_path")


def in_workdir(path: str, workdir: str) -> str:
  """A relative path (not "", not absolute, not gs://) is taken inside the workdir."""
  if not path or path.startswith("/") or "://" in path:
    return path
  return workdir.rstrip("/") + "/" + path


def resolve_paths(data_cfg: ml_collections.ConfigDict, workdir: str
                  ) -> ml_collections.ConfigDict:
  """A copy of the data config with its WORKDIR_PATHS resolved as a run in `workdir`
  resolves them (the main job's build step and `input_pipeline.inspect --workdir`)."""
  data_cfg = ml_collections.ConfigDict(data_cfg.to_dict())
  for name in WORKDIR_PATHS:
    data_cfg[name] = in_workdir(data_cfg[name], workdir)
  return data_cfg


def default_data_config() -> ml_collections.ConfigDict:
  """The data config (`config.data` of a training config)."""
  c = ml_collections.ConfigDict()
  c.prepared_dir = ""             # Output of `python -m input_pipeline.prepare`.
  # Or several prepared corpora mixed: "DIR[:WEIGHT],..." (no weight: its token count), and
  # a sampling temperature "T0[,K1:T1,...]" from step K on (input_pipeline/mixture.py).
  c.mixture = ""
  c.mixture_temperature = ""
  c.tfrecord_pattern = ""         # Or: original BERT TFRecords (globs), used when set.
  c.vocab_path = ""               # Vocab file/dir; "" = the one recorded by prepare.
  # None: as the vocab says (one built here: uncased WordPiece / SentencePiece, cased BPE).
  c.lowercase = ml_collections.config_dict.placeholder(bool)
  c.max_seq_length = 128          # L: tokens per example, [CLS] and [SEP]s included.
  c.max_predictions_per_seq = 20  # P: masked positions per example (76 at L=512).
  c.masked_lm_prob = 0.15         # Share of non-special tokens chosen for prediction.
  # A masking-rate schedule: from masked_lm_prob to masked_lm_prob_final (None = constant)
  # linearly over each host's first masked_lm_prob_blocks blocks of shuffle_block_docs.
  c.masked_lm_prob_final = ml_collections.config_dict.placeholder(float)
  c.masked_lm_prob_blocks = 0
  c.eval_masked_lm_prob = ml_collections.config_dict.placeholder(float)  # None: as training.
  c.short_seq_prob = 0.1          # Share of pairs with a random shorter target length.
  c.nsp = True                    # Next-sentence pairs; False: single segments.
  c.whole_word_masking = False    # Choose all pieces of a word together.
  # What the chosen tokens show: ([MASK], same, random) shares (BERT's Table 8 varies them).
  c.mask_ratios = (0.8, 0.1, 0.1)
  c.shuffle_block_docs = 256      # K: document pieces per block (shuffle unit, restore cost).
  c.doc_piece_tokens = 8192       # Longer documents are cut (at sentences) into pieces.
  c.eval_fraction = 0.01          # Share of documents held out for split="eval".
  c.shuffle_buffer = 10_000       # tfrecord_pattern only: shuffle buffer per epoch.
  c.prefetch_batches = 8          # Batches the iterator's thread prepares ahead.
  # Sequence packing: several examples per row (block-diagonal attention, positions and
  # NSP per example). Batches then count rows, and carry the features of PACKED_FEATURES.
  c.packing = False
  c.max_examples_per_row = 8      # E: examples (NSP slots) per packed row.
  c.max_predictions_per_row = ml_collections.config_dict.placeholder(int)  # None: P + E.
  return c


def min_seq_length(nsp: bool) -> int:
  """[CLS] A [SEP] (B [SEP]) with at least two tokens of text (one per NSP segment)."""
  return 5 if nsp else 4


def check(data_cfg: ml_collections.ConfigDict) -> None:
  """Values the pre-training data cannot work with, as a ConfigError naming the field."""
  bad = lambda field, why: errors.ConfigError(
      f"--config.data.{field}={data_cfg[field]}: {why}")
  low = min_seq_length(data_cfg.nsp)
  if data_cfg.max_seq_length < low:
    raise bad("max_seq_length", f"a sequence of {low} tokens at least is needed for "
              f"[CLS], [SEP]{' x2' if data_cfg.nsp else ''} and "
              f"{'one token of each NSP segment' if data_cfg.nsp else 'two tokens of text'} "
              "(BERT: 128, then 512).")
  for name in ("masked_lm_prob_final", "eval_masked_lm_prob"):
    value = data_cfg.get(name)
    if value is not None and not 0 < value <= 1:
      raise bad(name, "a share of tokens masked must be in (0, 1], e.g. 0.15.")
  if (data_cfg.get("masked_lm_prob_blocks") or 0) < 0:
    raise bad("masked_lm_prob_blocks", "blocks over which the masking rate moves: 0 or more.")
  if not 0 < data_cfg.masked_lm_prob <= 1:
    raise bad("masked_lm_prob", "the share of tokens masked for the masked-LM objective must "
              "be in (0, 1] (BERT: 0.15); 0 would pre-train with no masked-LM objective.")
  ratios = tuple(data_cfg.get("mask_ratios", (0.8, 0.1, 0.1)))
  if len(ratios) != 3 or any(not 0 <= r <= 1 for r in ratios) or abs(sum(ratios) - 1) > 1e-6:
    raise bad("mask_ratios", "three shares ([MASK], same, random), each in [0, 1], that sum "
              "to 1, e.g. (0.8, 0.1, 0.1) as BERT (the paper's Table 8: (1, 0, 0), "
              "(0.8, 0, 0.2), (0.8, 0.2, 0), (0, 0.2, 0.8), (0, 0, 1)).")
  if not 0 < data_cfg.max_predictions_per_seq <= data_cfg.max_seq_length:
    raise bad("max_predictions_per_seq", f"masked positions per example must be in 1.."
              f"{data_cfg.max_seq_length} (max_seq_length); BERT: 20 at L=128, 76 at L=512.")
  if not 0 <= data_cfg.short_seq_prob <= 1:
    raise bad("short_seq_prob", "a probability, in [0, 1] (BERT: 0.1).")
  if not 0 <= data_cfg.eval_fraction < 1:
    raise bad("eval_fraction", "the share of documents held out, in [0, 1).")
  if data_cfg.get("mixture"):
    mixture.parse_mixture(data_cfg.mixture)
    mixture.parse_temperature(data_cfg.get("mixture_temperature") or "")
    if data_cfg.prepared_dir or data_cfg.tfrecord_pattern:
      raise bad("mixture", "a mixture names its prepared corpora itself: leave "
                "data.prepared_dir and data.tfrecord_pattern empty.")
  if data_cfg.get("packing", False) and data_cfg.max_examples_per_row < 1:
    raise bad("max_examples_per_row", "examples per packed row: 1 or more.")
