"""Converts a checkpoint between formats: any checkpoint bert_jax reads (a workdir of ours,
a bert_jax export, a HuggingFace directory, a Google TF checkpoint) -> a bert_jax export or
a HuggingFace directory, with the vocabulary the model was trained with.

    python -m bert_jax.convert --input=HF_DIR_OR_TF_CKPT --output=DIR            # -> bert_jax
    python -m bert_jax.convert --input=BERT_JAX_DIR_OR_WORKDIR --output=DIR --to=huggingface

Reading goes through bert_jax/loader.py (the one reader), the name tables are each family's
(bert_jax/models/); this module adds the vocabulary a checkpoint comes with and the CLI.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable

from absl import flags
from absl import logging
import jax
import numpy as np

from bert_jax import best_dir
from bert_jax import embed
from bert_jax import families
from bert_jax import formats
from bert_jax import heads
from bert_jax import loader
from common import errors
from common import fileio
from input_pipeline import tokenizer as tokenizer_lib

# ----------------------------------------------------------------------------
# Vocabularies: the one a checkpoint comes with, and the files an export carries.

TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json")


def vocabulary_of(vocab: str, cfg: Any) -> tokenizer_lib.Tokenizer:
  """The Tokenizer of `vocab`; one of another size than the model is refused (the modern
  encoders' embedding tables may be padded past their tokenizer: larger is fine there)."""
  tok = tokenizer_lib.Tokenizer.from_path(vocab)
  if not formats.vocabulary_fits(cfg, tok.vocab_size):
    raise formats.CheckpointMismatchError(
        f"The vocabulary {tok.path} has {tok.vocab_size} entries but the model "
        f"{cfg.vocab_size}: pass --vocab= the vocabulary the model was trained with.")
  return tok


def export_vocabulary(tok: tokenizer_lib.Tokenizer, out: str, *,
                      name_specials: bool = False) -> str:
  """Copies the vocabulary of `tok` into the export directory `out` as a HuggingFace model
  directory holds it (vocab.txt or spm.model, tokenizer_config.json and any tokenizer.json /
  special_tokens_map.json beside it), with a tokenizer.json written from `tok` where none
  came with it, so that AutoTokenizer.from_pretrained(out) (for any model type) and our
  Tokenizer read the same. `name_specials`: tokenizer_config.json names the special tokens
  (a model type whose tokenizer class does not default to BERT's). Returns the vocabulary
  file's name."""
  src, dst = fileio.path(tok.path), fileio.path(out)
  name = {"wordpiece": tokenizer_lib.WORDPIECE_FILE, "hf": tokenizer_lib.HF_TOKENIZER_FILE
          }.get(tok.kind, tokenizer_lib.SENTENCEPIECE_FILE)
  (dst / name).write_bytes(src.read_bytes())
  for extra in TOKENIZER_FILES:
    if (src.parent / extra).exists():
      (dst / extra).write_bytes((src.parent / extra).read_bytes())
  if not (dst / tokenizer_lib.HF_TOKENIZER_FILE).exists():
    (dst / tokenizer_lib.HF_TOKENIZER_FILE).write_text(tok.tokenizer_json())
  if not (dst / tokenizer_lib.CONFIG_NAME).exists():
    tokenizer_lib.write_tokenizer_config(os.fspath(dst), tok.kind, tok.lowercase)
  if name_specials or tok.kind == "sentencepiece":
    # Without BertTokenizer's defaults, transformers reads the special tokens from here.
    config = json.loads((dst / tokenizer_lib.CONFIG_NAME).read_text())
    named = {f"{k}_token": tok.tokens[i] for k, i in (
        ("cls", tok.cls_id), ("sep", tok.sep_id), ("pad", tok.pad_id), ("unk", tok.unk_id),
        ("mask", tok.mask_id))}
    if tok.kind == "sentencepiece":  # no slow class of transformers reads our spm.model
      named["tokenizer_class"] = "PreTrainedTokenizerFast"
    if any(k not in config for k in named):
      (dst / tokenizer_lib.CONFIG_NAME).write_text(json.dumps({**named, **config}, indent=2))
  return name


def export_sentence_transformers(path: str, cfg: Any, params: Any, tok: tokenizer_lib.Tokenizer,
                                 spec: embed.Spec) -> None:
  """A sentence-transformers directory at `path`: the encoder as transformers saves it, the
  tokenizer, and the modules that pool (and normalise) its last layer per `spec`."""
  family = families.of(cfg)
  family.export_hf(path, cfg, embed.encoder_params(params)[0], tok)
  export_vocabulary(tok, path, name_specials=family.names_specials)
  length = min(spec.max_seq_length or cfg.max_length, cfg.max_length)
  embed.write_spec(path, spec, cfg.hidden_size, length)


# ----------------------------------------------------------------------------
# A fine-tuned head: its kind, which its tree does not hold.

# A fine-tuning task (the `task` a run records in its best/) -> the kind of head it trains
# (formats.TASK_HEAD_CLASSES; bert_jax/tasks.py builds the heads).
TASK_HEAD_OF = {"glue": "sequence", "custom": "sequence", "conll": "token", "squad": "span",
                "swag": "choice"}


class UnsupportedExportError(errors.UserError, ValueError):
  """A head that transformers has no class for (a feature-based head, a family's missing one)."""


def task_head(path: str, params: Any, given: str | None = None) -> str | None:
  """The kind of the fine-tuned head (`classifier`) that `params`, read from `path`, hold
  (None: none, or an export that does not record it): the task a fine-tuning run recorded in
  its best/, the class a HuggingFace directory names, the kind an export recorded
  (formats.native_task_head), else `given` (--task_head), which must agree with a recorded
  kind and needs a head to apply to (UnsupportedExportError)."""
  if "classifier" not in params:
    if given:
      raise UnsupportedExportError(f"--task_head={given}: {path} holds no fine-tuned head (or "
                                   "--target left it out). Leave --task_head out.")
    return None
  root = fileio.path(path)
  record = best_dir.recorded_task(root) or best_dir.recorded_task(best_dir.of(root))
  if record and record.get("task") in TASK_HEAD_OF:
    kind = TASK_HEAD_OF[record["task"]]
  elif (root / formats.NATIVE_CONFIG).exists():
    kind = formats.native_task_head(path)
  else:
    try:
      config = fileio.read_json(root / "config.json", {})
    except (OSError, ValueError):
      config = {}
    classes = config.get("architectures") if isinstance(config, dict) else None
    kind = (formats.task_head_of_architecture(str(classes[0])) if classes else None) or "sequence"
  if given and kind and given != kind:
    raise UnsupportedExportError(f"--task_head={given}: {path} records a {kind} head. Leave "
                                 "--task_head out (it is for exports that record none).")
  return kind or given


def check_exportable(path: str, cfg: Any, params: Any, kind: str | None) -> None:
  """Refuses (UnsupportedExportError), before anything is written, a fine-tuned head that no
  transformers class holds: a feature-based one (the paper's Table 7: other layers than the
  last, a BiLSTM), or a kind the family's classes lack."""
  if kind is None:
    if "classifier" in params:
      raise UnsupportedExportError(
          f"{path} does not record the kind of its fine-tuned head (an export written before "
          "kinds were recorded): give it with --task_head=sequence|token|span|choice, or "
          "export the encoder alone (--target=encoder).")
    return
  root = fileio.path(path)
  how = heads.FeatureBased.of(best_dir.recorded_task(root)
                              or best_dir.recorded_task(best_dir.of(root)) or {})
  if how.features != "last" or how.bilstm_units:
    raise UnsupportedExportError(
        f"{path} was fine-tuned feature-based (features={how.features}, bilstm_units="
        f"{how.bilstm_units}): no transformers class holds that head. Export the encoder "
        "alone (--target=encoder), or keep the whole model with --to=bert_jax.")
  if kind not in families.of(cfg).task_heads:
    raise UnsupportedExportError(
        f"transformers has no {cfg.family} class for a {kind} head "
        f"(...{formats.TASK_HEAD_CLASSES[kind]}); it has one for "
        f"{', '.join(families.of(cfg).task_heads)}. Export the encoder alone "
        "(--target=encoder), or keep the whole model with --to=bert_jax.")


def _warn_random_pooler(family: families.Family, params: Any) -> None:
  """An encoder without its pooler goes out as transformers' base class (BertModel, ...),
  which then initialises `pooler.*` at random: said, with the way to load it without one."""
  h = formats.heads(params)
  if family.hf_pooler and not (h["pooler"] or h["mlm"] or h["nsp"]):
    logging.warning("The checkpoint has no pooler: transformers initialises the pooler of its "
                    "%s class at random (its pooler_output is noise). Load the export with "
                    "add_pooling_layer=False, or export a checkpoint that has one.",
                    family.name)


# ----------------------------------------------------------------------------
# The output directory: new or empty, or an old export that --overwrite replaces whole.

# What an export (any --to) writes at the top of its directory: a directory holding one of
# these is a model that --overwrite may replace.
EXPORT_FILES = (formats.NATIVE_CONFIG, formats.NATIVE_PARAMS, "config.json", "model.safetensors",
                "pytorch_model.bin", "modules.json", tokenizer_lib.WORDPIECE_FILE,
                tokenizer_lib.SENTENCEPIECE_FILE, *TOKENIZER_FILES)


class OutputExistsError(errors.UserError, FileExistsError):
  """--output holds files (another model's) that convert was not told to replace."""


def _listing(names: list[str]) -> str:
  return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _overlaps(a: str, b: str) -> bool:
  """Whether one of the paths is the other or lies inside it."""
  a, b = (fileio.path(p) if fileio.is_remote(p) else fileio.path(p).resolve() for p in (a, b))
  return a == b or a in b.parents or b in a.parents


def check_output(output: str, reads: Iterable[str], overwrite: bool) -> bool:
  """Whether `output` must be emptied before the export is written: it holds an old export
  and `overwrite` says replace it. Refused (OutputExistsError, before anything is read or
  deleted): a file; a non-empty directory without `overwrite`; with it, one that holds no
  export (nothing there is convert's to delete) or holds or lies in a path the export
  `reads` (the input, the vocabulary)."""
  out = fileio.path(output)
  if not out.exists():
    return False
  if not out.is_dir():
    raise OutputExistsError(f"--output={output} is a file: name a directory (new or empty).")
  names = sorted(p.name for p in out.iterdir())
  if not names:
    return False
  if not overwrite:
    raise OutputExistsError(
        f"--output={output} is not empty (it holds {_listing(names)}): convert writes a new "
        "or empty directory, so that two models' files never mix. Pass --overwrite to "
        "replace what it holds, or choose another --output.")
  clash = next((p for p in reads if _overlaps(output, p)), None)
  if clash is not None:
    raise OutputExistsError(f"--output={output} holds or lies in {clash}, which this export "
                            "reads: --overwrite would delete it first. Choose another --output.")
  if not set(names) & set(EXPORT_FILES) or "checkpoints" in names:
    raise OutputExistsError(
        f"--output={output} holds no model export (it holds {_listing(names)}): --overwrite "
        "replaces only what an earlier export wrote. Choose another --output, or empty it "
        "yourself.")
  return True


def _flags():
  """convert's flags, in their own FlagValues (absl syntax; importing adds no global flags)."""
  fv = flags.FlagValues()
  flags.DEFINE_string("input", None, "HuggingFace dir, TF checkpoint, bert_jax export dir, or "
                      "a workdir of ours (its newest checkpoint).", flag_values=fv)
  flags.DEFINE_string("output", None, "Directory to write.", flag_values=fv)
  flags.DEFINE_enum("to", "bert_jax", ["bert_jax", "huggingface", "sentence_transformers"],
                    "Format to write (sentence_transformers: the encoder, its tokenizer and the "
                    "pooling modules SentenceTransformer(dir) loads).", flag_values=fv)
  flags.DEFINE_enum("pooling", None, list(embed.POOLINGS), "sentence_transformers: how token "
                    "vectors become a text's (default: the input's own, e.g. what a "
                    "config.task=embed run trained with, else mean).", flag_values=fv)
  flags.DEFINE_bool("normalize", None, "sentence_transformers: L2-normalise (default: the "
                    "input's own, else not).", flag_values=fv)
  flags.DEFINE_string("vocab", None, "The vocabulary to put in the export (vocab.txt, a "
                      "SentencePiece model, or the directory holding it). Default: the input's "
                      "own (a HuggingFace or export directory's, the one a workdir recorded).",
                      flag_values=fv)
  flags.DEFINE_enum("target", "all", ["all", "pretraining", "encoder"], "'all' keeps every "
                    "head the checkpoint has: masked-LM, NSP, pooler, ELECTRA's discriminator and "
                    "generator, a fine-tuned task head (a fine-tuning run's best/ exports as "
                    "transformers' ...ForSequenceClassification, ...ForTokenClassification, "
                    "...ForQuestionAnswering or ...ForMultipleChoice of its task); 'pretraining' "
                    "leaves a fine-tuned head out; 'encoder' keeps the encoder and pooler only.",
                    flag_values=fv)
  flags.DEFINE_enum("task_head", None, list(formats.TASK_HEAD_CLASSES), "The kind of a "
                    "fine-tuned head, for an export that does not record it (written before "
                    "kinds were recorded); a fine-tuning run's best/ and newer exports record "
                    "their own.", flag_values=fv)
  flags.DEFINE_bool("overwrite", False, "Replace what --output holds (an earlier export: every "
                    "file of it is deleted first). Without it a non-empty --output is refused.",
                    flag_values=fv)
  return fv


def _to_sentence_transformers(args, vocab: str | None, replace: bool) -> None:
  """convert --to=sentence_transformers."""
  given = embed.read_spec(args.input) or embed.Spec()
  spec = embed.Spec(args.pooling or given.pooling,
                    given.normalize if args.normalize is None else args.normalize,
                    given.max_seq_length, given.similarity)
  cfg, params = loader.read(embed.transformer_dir(args.input), "encoder", require_mlm=False)
  tok = vocabulary_of(vocab, cfg)
  _clear(args.output, replace)
  export_sentence_transformers(args.output, cfg, params, tok, spec)
  print(f"Converted {args.input} -> {args.output} (sentence_transformers): {spec.pooling} "
        f"pooling{', normalised' if spec.normalize else ''}, {cfg.num_layers} layers, hidden "
        f"{cfg.hidden_size}, vocab {cfg.vocab_size}.")


def _clear(output: str, replace: bool) -> None:
  """Deletes the old export at `output` (check_output said to), once every check passed."""
  if replace:
    logging.info("--overwrite: deleting the earlier export in %s.", output)
    fileio.path(output).rmtree()


@errors.reported
def main(argv: Iterable[str] | None = None) -> None:
  """`argv`: the flags (without the program name; default sys.argv[1:])."""
  args = _flags()
  errors.parse_flags(args, ["convert"] + list(sys.argv[1:] if argv is None else argv), __doc__)
  errors.require_flags(args, "input", "output")
  vocab = args.vocab
  if vocab is None:
    try:
      vocab = loader.checkpoint_vocab(args.input)
    except formats.CheckpointNotFoundError as e:
      if args.to != "bert_jax":  # transformers needs the tokenizer files beside the weights
        raise formats.CheckpointNotFoundError(f"{e} A HuggingFace export holds its vocabulary.") from None
      logging.warning("%s The export holds no vocabulary: predict and fine-tuning then need "
                      "--vocab.", e)
  replace = check_output(args.output, [args.input] + ([vocab] if vocab else []), args.overwrite)
  if args.to == "sentence_transformers":
    _to_sentence_transformers(args, vocab, replace)
    return
  cfg, params = loader.read(args.input, args.target, require_mlm=False)
  tok = vocabulary_of(vocab, cfg) if vocab is not None else None  # before anything is written
  family = families.of(cfg)
  kind = task_head(args.input, params, args.task_head)
  if args.to == "huggingface":
    check_exportable(args.input, cfg, params, kind)
  _clear(args.output, replace)
  written = [args.output]
  if args.to == "huggingface":  # (a family may write a companion model beside it)
    written = family.export_hf(args.output, cfg, params, tok, task_head=kind or "sequence") or written
  else:
    formats.save_native(args.output, cfg, params, task_head=kind)
  if args.to == "huggingface" and kind is None:
    _warn_random_pooler(family, params)
  if tok is not None:
    for out in written:
      export_vocabulary(tok, out, name_specials=args.to == "huggingface" and family.names_specials)
  n = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(params))
  print(f"Converted {args.input} -> {args.output} ({args.to}): "
        f"{formats.describe_heads(formats.heads(params))}, "
        f"{n:,} parameters, {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
        f"vocab {cfg.vocab_size}.")


if __name__ == "__main__":
  main()
