r"""Inference: fill-mask and features from a pre-trained checkpoint; classify / QA / tag
with a fine-tuned one (the `workdir` of a fine-tuning run: its `best/` parameters).

    python -m bert_jax.predict --checkpoint=DIR --vocab=vocab.txt --mode=fill_mask \
        --text="The capital of France is [MASK]."
    python -m bert_jax.predict --checkpoint=DIR --vocab=vocab.txt --mode=features \
        --input_file=texts.txt --layers=-1,-2 --output=features.npy

    python -m bert_jax.predict --checkpoint=FINETUNE_WORKDIR --vocab=vocab.txt --mode=classify \
        --text="The book was good." [--text_pair=...]
    python -m bert_jax.predict --checkpoint=FINETUNE_WORKDIR --vocab=vocab.txt --mode=qa \
        --question="Who?" --context="..."
    python -m bert_jax.predict --checkpoint=FINETUNE_WORKDIR --vocab=vocab.txt --mode=tag --text="EU rejects it"

For fill_mask / features, `--checkpoint` is anything `bert_jax.convert.load_pretrained` reads (a bert_jax
export, a HuggingFace directory, a Google TF checkpoint) or a bert_jax training
workdir.
"""
from __future__ import annotations

import json
import sys
from typing import Sequence

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from bert_jax import convert
from bert_jax import errors
from bert_jax import fileio
from bert_jax import heads
from bert_jax import model as model_lib
from input_pipeline import features, glue, squad, tagging
from input_pipeline.tokenizer import Tokenizer

MASK_TEXT = "[MASK]"


class PredictError(errors.UserError, ValueError):
  """An input predict cannot use (a layer the model lacks, a mode the checkpoint cannot do)."""


def load_checkpoint(path: str, target: str = "pretraining"):
  """(BertConfig, unrolled params) for inference from any supported checkpoint."""
  cfg, params, _ = convert.load_params(path, target=target)
  return _unrolled(cfg, params)


def _unrolled(cfg, params):
  if convert._is_scanned(params):  # pylint: disable=protected-access
    params = convert.unstack_layers(params, cfg.num_layers)
  return cfg.replace(scan_layers=False, remat="none"), params


def encode_with_masks(tokenizer, text: str, max_len: int) -> list[int]:
  """[CLS] text [SEP], with each literal "[MASK]" becoming the mask id."""
  parts = text.split(MASK_TEXT)
  pieces = tokenizer.encode_batch(parts)
  ids = [tokenizer.cls_id]
  for i, piece in enumerate(pieces):
    if i:
      ids.append(tokenizer.mask_id)
    ids += list(piece)
  ids = ids[:max_len - 1] + [tokenizer.sep_id]
  return ids


def _pad(rows: Sequence[Sequence[int]], length: int):
  ids = np.zeros((len(rows), length), np.int32)
  mask = np.zeros_like(ids)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  return ids, mask


def fill_mask(cfg, params, tokenizer, texts: Sequence[str], top_k: int = 5, max_len: int = 128):
  """For each text, for each [MASK]: the top_k (token, probability)."""
  rows = [encode_with_masks(tokenizer, t, min(max_len, cfg.max_position_embeddings)) for t in texts]
  length = max(len(r) for r in rows)
  ids, mask = _pad(rows, length)
  positions = [[j for j, t in enumerate(r) if t == tokenizer.mask_id] for r in rows]
  if not any(positions):
    raise PredictError(f"No {MASK_TEXT} in the input: write e.g. 'Paris is the {MASK_TEXT} of France.'")
  p = max(len(x) for x in positions)
  pos = np.zeros((len(rows), p), np.int32)
  for i, x in enumerate(positions):
    pos[i, :len(x)] = x
  h = convert.heads(params)
  if not h["mlm"]:
    raise PredictError("The checkpoint has no masked-LM head (cls.predictions.*): fill-mask needs a "
                       "BertForMaskedLM or BertForPreTraining checkpoint, not an encoder-only one.")
  if h["pooler"] and not h["nsp"]:  # a pooler without the NSP head: unused by the MLM model
    params = {**params, "bert": {k: v for k, v in params["bert"].items() if k != "pooler"}}
  module = model_lib.BertForPreTraining(cfg, nsp=h["nsp"])
  out = jax.jit(lambda prm, a, b, c: module.apply({"params": prm}, a, jnp.zeros_like(a), b, c))(
      params, ids, mask, pos)
  probs = np.asarray(jax.nn.softmax(out["mlm_logits"], -1))
  results = []
  for i, x in enumerate(positions):
    per_mask = []
    for k in range(len(x)):
      best = np.argsort(probs[i, k])[::-1][:top_k]
      per_mask.append([(tokenizer.convert_ids_to_tokens([b])[0], float(probs[i, k, b])) for b in best])
    results.append(per_mask)
  return results


def parse_layers(text: str) -> list[int]:
  """--layers: comma-separated layer indices (negative count from the top)."""
  try:
    layers = [int(x) for x in text.split(",")]
  except ValueError:
    raise PredictError(f"--layers={text}: expected comma-separated integers, e.g. -1,-2 (the last "
                       "two layers) or 0 (the first).") from None
  return layers


def check_layers(layers: Sequence[int], num_layers: int, given: str | None = None) -> None:
  """Every index names one of the model's `num_layers` layers; else a PredictError saying
  which index and how many layers there are."""
  for layer in layers:
    if not -num_layers <= layer < num_layers:
      raise PredictError(
          f"--layers={given or ','.join(map(str, layers))}: layer {layer} is out of range: the model "
          f"has {num_layers} layers (0..{num_layers - 1}, or -1..-{num_layers} counting from the "
          "last).")


def extract_features(cfg, params, tokenizer, texts: Sequence[str], layers: Sequence[int] = (-1,),
                     max_len: int = 128, pooled: bool = False, batch_size: int = 32):
  """Hidden states [N, L, len(layers), D] of the chosen layers (or pooled [N, D])."""
  check_layers(layers, cfg.num_layers)
  max_len = min(max_len, cfg.max_position_embeddings)
  rows = [features.encode_pair(tokenizer, list(r)[:max_len - 2])[0]
          for r in tokenizer.encode_batch(list(texts))]
  ids, mask = _pad(rows, max_len)
  encoder_params = params["bert"] if "bert" in params else params
  if pooled and "pooler" not in encoder_params:
    raise PredictError("The checkpoint has no pooler (e.g. a BertForMaskedLM checkpoint): "
                       "--pooled is not available; take a layer's [CLS] vector instead.")
  module = model_lib.BertModel(cfg, add_pooler="pooler" in encoder_params)

  @jax.jit
  def run(a, b):
    (seq, pool), state = module.apply(
        {"params": encoder_params}, a, jnp.zeros_like(a), b, capture_intermediates=
        lambda mdl, _: isinstance(mdl, model_lib.EncoderLayer))
    hidden = [state["intermediates"]["encoder"][f"layer_{i}"]["__call__"][0] for i in range(cfg.num_layers)]
    return (pool if pooled else None), jnp.stack([hidden[l] for l in layers], axis=2)

  outs = []
  for s in range(0, len(rows), batch_size):
    pool, hidden = run(ids[s:s + batch_size], mask[s:s + batch_size])
    outs.append(np.asarray(pool if pooled else hidden))
  return np.concatenate(outs), mask


def _flags():
  """predict's flags, in their own FlagValues (absl syntax; importing adds no global flags)."""
  fv = flags.FlagValues()
  flags.DEFINE_string("checkpoint", None, "A checkpoint (fill_mask, features) or a fine-tuning "
                      "workdir (classify, qa, tag).", flag_values=fv)
  flags.DEFINE_string("vocab", None, "vocab.txt or SentencePiece model the model was trained "
                      "with, or the directory holding it (e.g. the HuggingFace model directory).",
                      flag_values=fv)
  flags.DEFINE_bool("lowercase", None, "Override the vocabulary's casing (--lowercase / "
                    "--nolowercase; default: as the files beside it say, e.g. do_lower_case "
                    "in a HuggingFace tokenizer_config.json).", flag_values=fv)
  flags.DEFINE_enum("mode", "fill_mask", ["fill_mask", "features", "classify", "qa", "tag"],
                    "What to predict.", flag_values=fv)
  flags.DEFINE_multi_string("text", [], "Input text (repeatable).", flag_values=fv)
  flags.DEFINE_multi_string("text_pair", [], "classify: second segment per --text.",
                            flag_values=fv)
  flags.DEFINE_string("question", None, "qa: the question.", flag_values=fv)
  flags.DEFINE_string("context", None, "qa: the passage holding the answer.", flag_values=fv)
  flags.DEFINE_string("input_file", None, "One text per line.", flag_values=fv)
  flags.DEFINE_integer("top_k", 5, "fill_mask: candidates per [MASK].", flag_values=fv)
  flags.DEFINE_string("layers", "-1", "features: comma-separated layer indices.", flag_values=fv)
  flags.DEFINE_bool("pooled", False, "features: write the pooled output instead.",
                    flag_values=fv)
  flags.DEFINE_integer("max_seq_length", 128, "Tokens per input (longer ones are cut).",
                       flag_values=fv)
  flags.DEFINE_string("output", None, "features: .npy path to write (default features.npy).",
                      flag_values=fv)
  return fv


@errors.reported
def main(argv: Sequence[str] | None = None) -> None:
  """`argv`: the flags (without the program name; default sys.argv[1:])."""
  args = _flags()
  errors.parse_flags(args, ["predict"] + list(sys.argv[1:] if argv is None else argv), __doc__)
  errors.require_flags(args, "checkpoint", "vocab")
  texts = list(args.text)
  if args.input_file:
    data = fileio.path(args.input_file).read_bytes().decode("utf-8", errors="replace")
    texts += [line.rstrip("\r") for line in data.split("\n") if line.strip()]
  tokenizer = Tokenizer.from_path(args.vocab, args.lowercase)
  if args.mode in ("classify", "qa", "tag"):
    cfg, params, task, labels = load_finetuned(args.checkpoint)
    _check_vocab(cfg, tokenizer)
    if args.mode == "qa":
      if not (args.question and args.context):
        raise PredictError("--mode=qa needs --question and --context.")
      print(json.dumps({"question": args.question, "answer": answer(cfg, params, task, tokenizer, args.question, args.context)}))
      return
    if not texts:
      raise PredictError("Give --text (repeatable) or --input_file.")
    if args.mode == "classify":
      for text, (label, p, _) in zip(texts, classify(cfg, params, task, labels, tokenizer, texts, args.text_pair or None)):
        print(json.dumps({"text": text, "prediction": label, "probability": p}))
    else:
      for text in texts:
        print(" ".join(f"{w}/{t}" for w, t in tag(cfg, params, task, labels, tokenizer, text)))
    return
  if not texts:
    raise PredictError("Give --text (repeatable) or --input_file.")
  if args.mode == "fill_mask":
    cfg, params = load_checkpoint(args.checkpoint, "pretraining")
    _check_vocab(cfg, tokenizer)
    for text, per_mask in zip(texts, fill_mask(cfg, params, tokenizer, texts, args.top_k, args.max_seq_length)):
      print(text)
      for k, cands in enumerate(per_mask):
        print(f"  [MASK] #{k + 1}: " + ", ".join(f"{t} ({p:.3f})" for t, p in cands))
  else:
    layers = parse_layers(args.layers)
    cfg, params = load_checkpoint(args.checkpoint, "encoder")
    _check_vocab(cfg, tokenizer)
    check_layers(layers, cfg.num_layers, args.layers)
    feats, mask = extract_features(cfg, params, tokenizer, texts, layers, args.max_seq_length, args.pooled)
    out = args.output or "features.npy"
    for name, array in ((out, feats), (out.removesuffix(".npy") + "_mask.npy", mask)):
      with fileio.path(name).open("wb") as f:
        np.save(f, array)
    print(json.dumps({"output": out, "shape": list(feats.shape), "layers": layers, "pooled": args.pooled}))


def load_finetuned(workdir: str):
  """(BertConfig, params, saved task config, labels) from a fine-tuning run's best/."""
  best = fileio.path(workdir) / "best"
  if not fileio.path(workdir).exists():
    raise convert.CheckpointNotFoundError(
        f"{workdir} does not exist: --checkpoint must be the workdir of a fine-tuning run.")
  if not (best / "config.json").exists():
    raise convert.CheckpointNotFoundError(
        f"{best}/config.json not found: --checkpoint must be the workdir of a fine-tuning run (it "
        "keeps its best parameters in best/).")
  saved = json.loads((best / "config.json").read_text())
  if (best / convert.NATIVE_CONFIG).exists():  # the export format
    cfg, params = convert.read_native(str(best))
  else:  # best/ of older versions: Orbax params, the BertConfig in config.json
    with ocp.StandardCheckpointer() as ckptr:
      params = jax.tree.map(np.asarray, ckptr.restore(best / "params"))
    cfg = model_lib.BertConfig.from_dict(saved["bert"])
  return cfg.replace(scan_layers=False, remat="none"), params, saved["task"], saved.get("labels")


def classify(cfg, params, task, labels, tokenizer, texts, pairs=None):
  """[(label, probability, all probabilities)] per text (or a score for regression)."""
  examples = [glue.Example(str(i), t, (pairs[i] if pairs else None), None) for i, t in enumerate(texts)]
  feats = glue.encode_examples(examples, tokenizer, task["max_seq_length"], labels)
  num = params["classifier"]["kernel"].shape[-1]
  logits = np.asarray(heads.BertForSequenceClassification(cfg, num_labels=num).apply(
      {"params": params}, feats["input_ids"], feats["segment_ids"], feats["input_mask"]))
  if num == 1:
    return [("score", float(l[0]), None) for l in logits]
  probs = np.asarray(jax.nn.softmax(logits, -1))
  return [(labels[int(np.argmax(p))], float(np.max(p)), dict(zip(labels, map(float, p)))) for p in probs]


def answer(cfg, params, task, tokenizer, question: str, context: str) -> str:
  ex = [squad.QAExample("q", question, context, (), -1)]
  feats = squad.convert_examples(ex, tokenizer, task["max_seq_length"], task["doc_stride"], task["max_query_length"])
  start, end = heads.BertForQuestionAnswering(cfg).apply(
      {"params": params}, feats["input_ids"], feats["segment_ids"], feats["input_mask"])
  preds, _, _ = squad.decode_answers(ex, feats, np.asarray(start), np.asarray(end),
                                     max_answer_length=task["max_answer_length"],
                                     version_2=task["version_2_with_negative"],
                                     null_threshold=task["null_score_threshold"])
  return preds["q"]


def tag(cfg, params, task, labels, tokenizer, text: str) -> list[tuple[str, str]]:
  words = text.split()
  feats = tagging.encode_conll([(words, [labels[0]] * len(words))], tokenizer, task["max_seq_length"], labels)
  logits = heads.BertForTokenClassification(cfg, num_labels=len(labels)).apply(
      {"params": params}, feats["input_ids"], feats["segment_ids"], feats["input_mask"])
  pred = np.argmax(np.asarray(logits)[0], -1)
  tags = ["O"] * len(words)
  for pos in np.nonzero(feats["word_index"][0] >= 0)[0]:
    tags[feats["word_index"][0, pos]] = labels[pred[pos]]
  return list(zip(words, tags))


def _check_vocab(cfg, tokenizer) -> None:
  if tokenizer.vocab_size != cfg.vocab_size:
    raise PredictError(f"The vocabulary has {tokenizer.vocab_size} tokens but the model {cfg.vocab_size}: "
                       "pass the vocab the checkpoint was trained with.")


if __name__ == "__main__":
  main()
