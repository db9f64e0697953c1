"""Inference: fill-mask and feature extraction from a pre-trained checkpoint.

    python -m bert_jax.predict --checkpoint=DIR --vocab=vocab.txt --mode=fill_mask \
        --text="The capital of France is [MASK]."
    python -m bert_jax.predict --checkpoint=DIR --vocab=vocab.txt --mode=features \
        --input_file=texts.txt --layers=-1,-2 --output=features.npy

`--checkpoint` is anything `bert_jax.convert.load_pretrained` reads (a bert_jax
export, a HuggingFace directory, a Google TF checkpoint) or a bert_jax training
workdir.
"""
from __future__ import annotations

import json
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import convert
from bert_jax import model as model_lib

MASK_TEXT = "[MASK]"


def load_checkpoint(path: str, target: str = "pretraining"):
  """(BertConfig, unrolled params) for inference from any supported checkpoint."""
  try:
    from bert_jax import checkpointing  # A training workdir of ours.
    loader = getattr(checkpointing, "load_params_for_inference", None)
    if loader is not None:
      found = loader(path)
      if found is not None:
        cfg, params = found
        if target == "encoder" and "bert" in params:
          params = params["bert"]
        return _unrolled(cfg, params)
  except ImportError:
    pass
  cfg, params = convert.load_pretrained(path, target=target)
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
    raise ValueError(f"No {MASK_TEXT} in the input: write e.g. 'Paris is the {MASK_TEXT} of France.'")
  p = max(len(x) for x in positions)
  pos = np.zeros((len(rows), p), np.int32)
  for i, x in enumerate(positions):
    pos[i, :len(x)] = x
  module = model_lib.BertForPreTraining(cfg)
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


def extract_features(cfg, params, tokenizer, texts: Sequence[str], layers: Sequence[int] = (-1,),
                     max_len: int = 128, pooled: bool = False, batch_size: int = 32):
  """Hidden states [N, L, len(layers), D] of the chosen layers (or pooled [N, D])."""
  max_len = min(max_len, cfg.max_position_embeddings)
  rows = [[tokenizer.cls_id] + list(r)[:max_len - 2] + [tokenizer.sep_id] for r in tokenizer.encode_batch(list(texts))]
  ids, mask = _pad(rows, max_len)
  encoder_params = params["bert"] if "bert" in params else params
  module = model_lib.BertModel(cfg)

  @jax.jit
  def run(a, b):
    (seq, pool), state = module.apply(
        {"params": encoder_params}, a, jnp.zeros_like(a), b, capture_intermediates=
        lambda mdl, _: isinstance(mdl, model_lib.EncoderLayer))
    hidden = [state["intermediates"]["encoder"][f"layer_{i}"]["__call__"][0] for i in range(cfg.num_layers)]
    return pool, jnp.stack([hidden[l] for l in layers], axis=2)

  outs = []
  for s in range(0, len(rows), batch_size):
    pool, hidden = run(ids[s:s + batch_size], mask[s:s + batch_size])
    outs.append(np.asarray(pool if pooled else hidden))
  return np.concatenate(outs), mask


def main(argv=None) -> None:
  import argparse
  from input_pipeline.tokenizer import Tokenizer
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--checkpoint", required=True)
  parser.add_argument("--vocab", required=True, help="vocab.txt or SentencePiece model the model was trained with")
  parser.add_argument("--mode", choices=["fill_mask", "features"], default="fill_mask")
  parser.add_argument("--text", action="append", help="Input text (repeatable).")
  parser.add_argument("--input_file", help="One text per line.")
  parser.add_argument("--top_k", type=int, default=5)
  parser.add_argument("--layers", default="-1", help="Comma-separated layer indices (features).")
  parser.add_argument("--pooled", action="store_true", help="Write the pooled output instead (features).")
  parser.add_argument("--max_seq_length", type=int, default=128)
  parser.add_argument("--output", help="features: .npy path to write.")
  args = parser.parse_args(argv)
  texts = list(args.text or [])
  if args.input_file:
    with open(args.input_file, encoding="utf-8", errors="replace") as f:
      texts += [line.rstrip("\n") for line in f if line.strip()]
  if not texts:
    parser.error("give --text or --input_file")
  tokenizer = Tokenizer.from_path(args.vocab)
  if args.mode == "fill_mask":
    cfg, params = load_checkpoint(args.checkpoint, "pretraining")
    _check_vocab(cfg, tokenizer)
    for text, per_mask in zip(texts, fill_mask(cfg, params, tokenizer, texts, args.top_k, args.max_seq_length)):
      print(text)
      for k, cands in enumerate(per_mask):
        print(f"  [MASK] #{k + 1}: " + ", ".join(f"{t} ({p:.3f})" for t, p in cands))
  else:
    cfg, params = load_checkpoint(args.checkpoint, "encoder")
    _check_vocab(cfg, tokenizer)
    layers = [int(x) for x in args.layers.split(",")]
    feats, mask = extract_features(cfg, params, tokenizer, texts, layers, args.max_seq_length, args.pooled)
    out = args.output or "features.npy"
    np.save(out, feats)
    np.save(out.removesuffix(".npy") + "_mask.npy", mask)
    print(json.dumps({"output": out, "shape": list(feats.shape), "layers": layers, "pooled": args.pooled}))


def _check_vocab(cfg, tokenizer) -> None:
  if tokenizer.vocab_size != cfg.vocab_size:
    raise ValueError(f"The vocabulary has {tokenizer.vocab_size} tokens but the model {cfg.vocab_size}: "
                     "pass the vocab the checkpoint was trained with.")


if __name__ == "__main__":
  main()
