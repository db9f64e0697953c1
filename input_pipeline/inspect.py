r"""Shows what the pre-training pipeline feeds the model, and its statistics.

  python -m input_pipeline.inspect --prepared_dir=/tmp/prepared [--vocab=/tmp/vocab] \
      [--max_seq_length=128 --max_predictions_per_seq=20 --num_batches=10 \
       --batch_size=32 --print_examples=3 --output=batches.npz]
  python -m input_pipeline.inspect --config=configs/tiny_pretrain.py --workdir=/tmp/bert_tiny

--config takes a config file whose `.data` is a data config (input_pipeline.pretrain.
default_data_config), with the usual overrides (`--config.data.max_seq_length=512`); the
other flags, when given, override its fields. With the config and --workdir of a training
run, what that run trains on: its data config with the paths inside the workdir resolved
as the job resolves them (vocabulary, prepared corpus), its seed and global batch size,
summed up first (L, P, the vocabulary, the corpus). Decoded examples mark each chosen
position as [shown→original] ("[MASK]→dog", "cat→dog" for a random replacement, "dog→dog"
when kept), with the segments and the NSP label. --output saves the exact feature arrays
of the batches to an .npz file.
"""
from absl import flags
from ml_collections import config_flags
import numpy as np

from common import errors
from common import fileio
from input_pipeline import data_config
from input_pipeline import documents
from input_pipeline import masking
from input_pipeline import mixture as mixture_lib
from input_pipeline import prepare
from input_pipeline import pretrain
from input_pipeline import tokenizer as tokenizer_lib

_OVERRIDES = ("prepared_dir", "mixture", "mixture_temperature", "tfrecord_pattern",
              "vocab_path", "max_seq_length",
              "max_predictions_per_seq", "masked_lm_prob", "nsp", "whole_word_masking",
              "lowercase")


def format_example(ex: dict, tok: tokenizer_lib.Tokenizer) -> str:
  """One example (feature dict without batch dimension) as readable text."""
  n = int(ex["input_mask"].sum())
  shown = tok.convert_ids_to_tokens(ex["input_ids"][:n])
  weights = ex["masked_lm_weights"] > 0
  for pos, original in zip(ex["masked_lm_positions"][weights], ex["masked_lm_ids"][weights]):
    shown[pos] = f"[{shown[pos]}→{tok.tokens[original]}]"
  segments = ex["segment_ids"][:n]
  a = " ".join(t for t, s in zip(shown, segments) if s == 0)
  b = " ".join(t for t, s in zip(shown, segments) if s == 1)
  label = "NotNext" if int(ex["next_sentence_labels"]) else "IsNext"
  lines = [f"  length {n}/{len(ex['input_ids'])}, {int(weights.sum())} predictions, "
           f"{label if b else 'single segment'}", f"  A: {a}"]
  if b:
    lines.append(f"  B: {b}")
  return "\n".join(lines)


def batch_statistics(batch: dict, tok: tokenizer_lib.Tokenizer) -> dict:
  """Masking, NSP and length statistics of stacked examples."""
  ids, mask = batch["input_ids"], batch["input_mask"]
  weights = batch["masked_lm_weights"] > 0
  rows = np.broadcast_to(np.arange(len(ids))[:, None], weights.shape)[weights]
  positions = batch["masked_lm_positions"][weights]
  shown, original = ids[rows, positions], batch["masked_lm_ids"][weights]
  restored = ids.copy()
  restored[rows, positions] = original
  candidates = int((~tok.is_special[restored] & (mask > 0)).sum())
  chosen = int(weights.sum())
  lengths = mask.sum(1)
  max_len, max_preds = ids.shape[1], weights.shape[1]
  return {
      "examples": len(ids),
      "mask_rate": chosen / max(candidates, 1),
      "masked_as_mask_token": float((shown == tok.mask_id).mean()) if chosen else 0.0,
      "masked_as_random_token": float(((shown != tok.mask_id) & (shown != original)).mean())
                                if chosen else 0.0,
      "masked_unchanged": float((shown == original).mean()) if chosen else 0.0,
      "predictions_per_example": chosen / len(ids),
      "examples_at_max_predictions": float((weights.sum(1) == max_preds).mean()),
      "not_next_fraction": float(batch["next_sentence_labels"].mean()),
      "mean_length": float(lengths.mean()),
      "short_fraction (< L/2)": float((lengths < max_len / 2).mean()),
      "padding_fraction": float(1 - mask.mean()),
  }


def _flag_values() -> flags.FlagValues:
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "Config file with a `.data` field (a "
                                  "training config, or any config holding a data config).",
                                  flag_values=fv, lock_config=False)
  flags.DEFINE_string("workdir", None, "The training run's workdir: the config's relative "
                      "data paths (vocab_path, prepared_dir) are taken inside it, as the "
                      "job takes them.", flag_values=fv)
  flags.DEFINE_string("prepared_dir", None, "Prepared corpus directory.", flag_values=fv)
  flags.DEFINE_string("mixture", None, "Or several prepared corpora: 'DIR[:WEIGHT],...' "
                      "(input_pipeline/mixture.py).", flag_values=fv)
  flags.DEFINE_string("mixture_temperature", None, "The mixture's temperature schedule, "
                      "'T0[,K1:T1,...]'.", flag_values=fv)
  flags.DEFINE_string("tfrecord_pattern", None, "Or original BERT TFRecords.",
                      flag_values=fv)
  flags.DEFINE_string("vocab", None, "Vocabulary (default: the prepared one).",
                      flag_values=fv)
  flags.DEFINE_integer("max_seq_length", None, "L.", flag_values=fv)
  flags.DEFINE_integer("max_predictions_per_seq", None, "P.", flag_values=fv)
  flags.DEFINE_float("masked_lm_prob", None, "Masking rate.", flag_values=fv)
  flags.DEFINE_boolean("nsp", None, "Next-sentence pairs.", flag_values=fv)
  flags.DEFINE_boolean("whole_word_masking", None, "Whole-word masking.", flag_values=fv)
  flags.DEFINE_boolean("lowercase", None, "Override the vocabulary's casing (default: as "
                       "the files beside it say).", flag_values=fv)
  flags.DEFINE_enum("split", "train", list(documents.SPLITS), "Split.", flag_values=fv)
  flags.DEFINE_integer("seed", None, "Data seed (default: the config's `seed`, else 0).",
                       flag_values=fv)
  flags.DEFINE_integer("batch_size", None, "Examples per batch (default: the config's "
                       "`global_batch_size`, else 32).", flag_values=fv)
  flags.DEFINE_integer("num_batches", 10, "Batches to read.", flag_values=fv)
  flags.DEFINE_integer("print_examples", 3, "Examples to print decoded.", flag_values=fv)
  flags.DEFINE_string("output", None, "Save the batches' features to this .npz.",
                      flag_values=fv)
  return fv


def data_config_from_flags(fv: flags.FlagValues):
  """The data config the flags describe: the config's (its workdir paths resolved as the
  training job resolves them), or the defaults, then the explicit flags."""
  config = fv.config
  if config is not None and "data" not in config:
    raise errors.UserError(f"--config={fv['config'].config_filename} has no `data` field: "
                           "give a pre-training config (configs/*_pretrain.py, "
                           "configs/default.py).")
  cfg = config.data if config is not None else data_config.default_data_config()
  if config is not None and config.get("synthetic_data", False):
    raise errors.UserError("The config sets synthetic_data=True: its run trains on random "
                           "batches, not on a corpus; there is nothing to inspect.")
  if fv.workdir:
    cfg = data_config.resolve_paths(cfg, fv.workdir)
  else:
    relative = [f"data.{n}={cfg[n]!r}" for n in data_config.WORKDIR_PATHS
                if data_config.in_workdir(cfg[n], "WORKDIR") != cfg[n]  # Relative.
                and fv["vocab" if n == "vocab_path" else n].value is None]
    if config is not None and relative:
      raise errors.UserError(
          f"The config's {', '.join(relative)} lie in the training run's workdir: pass "
          "--workdir=WORKDIR (the job's --workdir), or the paths themselves "
          "(--prepared_dir, --vocab).")
  for name in _OVERRIDES:
    value = fv["vocab" if name == "vocab_path" else name].value
    if value is not None:
      cfg[name] = value
  return cfg


def _summary(cfg, fv: flags.FlagValues) -> dict | None:
  """The prepared corpus's summary, with an error that says how to build it."""
  if cfg.tfrecord_pattern:
    return None
  if cfg.get("mixture"):  # the first corpus's: the mixture's vocabulary
    return prepare.load_summary(mixture_lib.parse_mixture(cfg.mixture)[0][0])
  if not cfg.prepared_dir:
    raise errors.UserError("No data: pass --prepared_dir (or --tfrecord_pattern), or a "
                           "training config and its --workdir.")
  try:
    return prepare.load_summary(cfg.prepared_dir)
  except FileNotFoundError as e:
    if fv.workdir:
      raise errors.UserError(
          f"{cfg.prepared_dir} is not a prepared corpus (yet): the run in {fv.workdir} "
          "builds its vocabulary and prepared corpus when it starts; start it first "
          "(python -m bert_jax.main with the same --config and --workdir).") from e
    raise errors.UserError(str(e)) from e


def describe(cfg, tok: tokenizer_lib.Tokenizer, summary: dict | None, *, split: str,
             seed: int, batch_size: int) -> str:
  """What the model is fed: the data, the vocabulary, L and P and the masking."""
  lines = []
  if cfg.get("mixture"):
    entries = mixture_lib.parse_mixture(cfg.mixture)
    lines.append(f"Mixture of {len(entries)} prepared corpora (temperature "
                 f"{cfg.get('mixture_temperature') or '1'}):")
    for path, weight in entries:
      s = prepare.load_summary(path)
      lines.append(f"  {path}: weight {weight if weight is not None else 'its tokens'}, "
                   f"{s['documents']:,} documents, {s['tokens']:,} tokens.")
  elif summary is not None:
    lines.append(f"Prepared corpus {cfg.prepared_dir}: {summary['documents']:,} documents, "
                 f"{summary['tokens']:,} tokens in {summary['num_shards']} shards (from "
                 f"{summary['input']!r}).")
  else:
    lines.append(f"TFRecords {cfg.tfrecord_pattern} (original BERT examples).")
  lines.append(f"Vocabulary {tok.path}: {tok.vocab_size:,} entries, {tok.kind}, "
               f"{'uncased' if tok.lowercase else 'cased'}.")
  lines.append(f"L (max_seq_length) = {cfg.max_seq_length}, P (max_predictions_per_seq) = "
               f"{cfg.max_predictions_per_seq}, masked_lm_prob = {cfg.masked_lm_prob}, "
               f"nsp = {cfg.nsp}, whole_word_masking = {cfg.whole_word_masking}, "
               f"mask_ratios ([MASK], same, random) = "
               f"{tuple(cfg.get('mask_ratios', masking.MASK_RATIOS))}.")
  lines.append(f"Split {split!r}, seed {seed}, {batch_size} examples per batch.")
  return "\n".join(lines)


def main(argv: list[str]) -> dict:
  fv = _flag_values()
  errors.parse_flags(fv, argv, __doc__)
  cfg = data_config_from_flags(fv)
  config = fv.config
  seed = fv.seed if fv.seed is not None else (config.get("seed", 0) if config else 0)
  batch_size = fv.batch_size or (config.get("global_batch_size", 32) if config else 32)
  summary = _summary(cfg, fv)
  if cfg.tfrecord_pattern:
    if not cfg.vocab_path:
      raise errors.UserError("--vocab is required with --tfrecord_pattern.")
    tok = tokenizer_lib.Tokenizer.from_path(cfg.vocab_path, cfg.lowercase)
  else:
    tok = pretrain.vocabulary_for(cfg, summary)
  print(describe(cfg, tok, summary, split=fv.split, seed=seed, batch_size=batch_size))
  if cfg.get("packing", False):
    print(f"data.packing: the run packs up to {cfg.max_examples_per_row} of these examples "
          "into each row; shown here unpacked.")
    cfg.packing = False
  print()
  it = pretrain.PretrainIterator(cfg, batch_size=batch_size, seed=seed, split=fv.split)
  batches = [next(it) for _ in range(fv.num_batches)]
  stacked = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  for i in range(min(fv.print_examples, len(stacked["input_ids"]))):
    print(f"Example {i}:\n{format_example({k: v[i] for k, v in stacked.items()}, tok)}\n")
  stats = batch_statistics(stacked, tok)
  stats.update({f"mixture_share/{name}": share for name, share in it.shares().items()})
  it.close()
  print("Statistics:")
  for k, v in stats.items():
    print(f"  {k:>30}: {v:.4f}" if isinstance(v, float) else f"  {k:>30}: {v}")
  if fv.output:
    with fileio.path(fv.output).open("wb") as f:
      np.savez(f, **stacked)
    print(f"Saved {len(batches)} batches to {fv.output}")
  return stats


if __name__ == "__main__":
  errors.run_tool(main)
