"""Fine-tuning: GLUE / custom classification, SQuAD v1.1/v2.0, CoNLL NER, SWAG.

    python -m bert_jax.main --config=configs/glue.py:cola --config.init_checkpoint=DIR \
        --config.data_dir=glue/CoLA --config.vocab_path=vocab.txt --workdir=/tmp/cola

Reuses the training system: `train.train_step` (with a task objective), the mesh
and sharding rules, the optimizer, Orbax checkpoints (resume after a kill) and
the metric writer. Evaluates on the dev set after every epoch, keeps the best
parameters (`workdir/best`), and writes predictions in each task's submission
format plus `metrics.json`.

With `config.packing` (classification only), each epoch's shuffled training
examples are packed several to a row (input_pipeline/packing.py): attention is
block-diagonal, positions restart per example and every example is classified
from its own [CLS], so the loss equals that of the same examples unpacked while
far fewer padding tokens are computed. Steps and resume offsets then count rows;
loss/accuracy still count examples. Evaluation and prediction stay unpacked.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Callable

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from bert_jax import checkpointing, convert, fileio, heads, optim, scoring, sharding, train
from bert_jax import metrics as metrics_lib
from bert_jax.model import BertConfig
from input_pipeline import glue, packing, squad, tagging
from input_pipeline.tokenizer import Tokenizer

TEXT_INPUTS = ("input_ids", "segment_ids", "input_mask")
PACKING_INPUTS = train.PACKED_INPUTS  # passed to the head by keyword
PACKABLE_TASKS = ("glue", "custom")


@dataclasses.dataclass
class TaskData:
  """Everything task-specific: features, the model head, loss and decoding."""
  model: nn.Module
  objective: train.Objective
  train: dict[str, np.ndarray]
  eval: dict[str, np.ndarray]
  evaluate: Callable[[Any], tuple[dict[str, float], Callable[[str], None]]]  # outputs -> (metrics, writer)
  main_metric: str
  labels: tuple | None = None  # class / tag names, saved beside the best params for predict


def _objective(loss_fn: Callable, weight_key: str) -> train.Objective:
  """Adapts a heads.*_loss to the train step: sums + one denominator."""
  def sums(outputs, batch):
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return loss_fn(*outputs, batch)[1]

  def denominators(batch):
    if weight_key in batch:
      return {"weight": jnp.sum(batch[weight_key].astype(jnp.float32))}
    return {"weight": jnp.float32(batch["input_ids"].shape[0])}

  return train.Objective(inputs=TEXT_INPUTS, sums=sums, denominators=denominators,
                         loss=lambda s, d: s["loss_sum"] / jnp.maximum(d["weight"], 1e-8))


def pack_epoch(feats: dict[str, np.ndarray], order: np.ndarray, max_seq_length: int,
               max_examples_per_row: int) -> dict[str, np.ndarray]:
  """The examples `feats[order]`, in that order, packed into rows (see packing.pack_examples):
  TEXT_INPUTS + PACKING_INPUTS [R, L] / [R, E], labels and example_weights [R, E]."""
  return packing.pack_examples({k: v[order] for k, v in feats.items()}, max_seq_length,
                               max_examples_per_row)


def _glue_metrics(names, preds, labels, scores=None):
  fns = {"accuracy": lambda: scoring.accuracy(preds, labels), "f1": lambda: scoring.f1_binary(preds, labels),
         "mcc": lambda: scoring.matthews_corrcoef(preds, labels),
         "pearson": lambda: scoring.pearson(scores, labels), "spearman": lambda: scoring.spearman(scores, labels)}
  return {n: float(fns[n]()) for n in names}


def classification_task(config, tok, cfg: BertConfig) -> TaskData:
  if config.task == "glue":
    spec = glue.GLUE[config.glue_task]
    if config.data_dir.startswith("tfds"):  # "tfds" or "tfds:<tensorflow_datasets dir>"
      tfds_dir = config.data_dir.partition(":")[2] or None
      read = lambda split: glue.read_tfds_glue(config.glue_task, split, tfds_dir, config.tfds_name or None)
    else:
      read = lambda split: glue.read_glue(config.glue_task, config.data_dir, split)
    train_ex, eval_ex = read("train"), read(config.eval_split)
    labels, metrics, name = spec.labels, spec.metrics, spec.submission_name
  else:  # custom CSV / TSV / JSONL
    read = lambda path: glue.read_custom(path, config.text_a_column, config.label_column,
                                         config.text_b_column or None)
    train_ex, eval_ex = read(config.train_file), read(config.eval_file)
    labels = tuple(config.labels) if config.labels else glue.infer_labels(train_ex)
    metrics, name = ("accuracy",) if len(labels) > 2 else ("accuracy", "f1"), "predictions"
  regression = labels is None
  model = heads.BertForSequenceClassification(cfg, num_labels=1 if regression else len(labels))
  L = config.max_seq_length
  eval_feats = glue.encode_examples(eval_ex, tok, L, labels)

  def evaluate(logits):
    scores = logits[:, 0] if regression else None
    preds = scores if regression else np.argmax(logits, -1)
    gold = eval_feats["labels"]
    result = _glue_metrics(metrics, preds, gold, scores)

    def write(out_dir):
      rows = [f"{ex.guid}\t{p:.3f}\n" if regression else f"{ex.guid}\t{labels[int(p)]}\n"
              for ex, p in zip(eval_ex, preds)]
      (out_dir / f"{name}.tsv").write_text("index\tprediction\n" + "".join(rows))
    return result, write

  return TaskData(model, _objective(heads.classification_loss, "example_weights"),
                  glue.encode_examples(train_ex, tok, L, labels), eval_feats, evaluate, metrics[0],
                  labels=tuple(labels) if labels is not None else None)


def squad_task(config, tok, cfg: BertConfig) -> TaskData:
  train_ex = squad.read_squad(config.train_file)
  eval_ex = squad.read_squad(config.eval_file)
  conv = functools.partial(squad.convert_examples, tokenizer=tok, max_seq_length=config.max_seq_length,
                           doc_stride=config.doc_stride, max_query_length=config.max_query_length)
  train_feats = {k: v for k, v in conv(train_ex).items() if k in TEXT_INPUTS + ("start_positions", "end_positions")}
  eval_feats = conv(eval_ex)
  v2 = config.version_2_with_negative
  too_long = squad.answers_over_length(eval_ex, tok, config.max_answer_length)
  if too_long["answers"]:
    logging.warning("%d gold answers (%d questions with no shorter one) are longer than "
                    "max_answer_length=%d tokens (the longest: %d) and cannot be predicted "
                    "exactly; raise --config.max_answer_length to reach them.",
                    too_long["answers"], too_long["examples"], config.max_answer_length,
                    too_long["longest"])

  def evaluate(outputs):
    start, end = outputs
    preds, null_diffs, nbest = squad.decode_answers(
        eval_ex, eval_feats, start, end, n_best=config.n_best_size,
        max_answer_length=config.max_answer_length, version_2=v2, null_threshold=config.null_score_threshold)
    gold = {e.qid: list(e.answers) for e in eval_ex}
    result = scoring.squad_scores(preds, gold, na_probs=null_diffs if v2 else None)
    # Questions whose every gold answer exceeds max_answer_length (unreachable spans).
    result["answers_over_max_length"] = too_long["examples"]

    def write(out_dir):
      for fname, obj in (("predictions.json", preds), ("nbest_predictions.json", nbest)) + (
          (("null_odds.json", null_diffs),) if v2 else ()):
        (out_dir / fname).write_text(json.dumps(obj, indent=1))
    return result, write

  return TaskData(heads.BertForQuestionAnswering(cfg), _objective(heads.span_loss, "example_weights"),
                  train_feats, eval_feats, evaluate, "f1")


def conll_task(config, tok, cfg: BertConfig) -> TaskData:
  train_s = tagging.read_conll(fileio.join(config.data_dir, config.train_file))
  eval_s = tagging.read_conll(fileio.join(config.data_dir, config.eval_file))
  if config.tag_scheme == "iob1":  # train on IOB2 targets; scores read both
    train_s = [(w, tagging.iob1_to_iob2(t)) for w, t in train_s]
    eval_s = [(w, tagging.iob1_to_iob2(t)) for w, t in eval_s]
  labels = sorted({t for _, tags in train_s + eval_s for t in tags})
  L = config.max_seq_length
  eval_feats = tagging.encode_conll(eval_s, tok, L, labels)

  def evaluate(logits):
    pred_ids = np.argmax(logits, -1)
    pred_tags = []
    for i, (words, _) in enumerate(eval_s):
      tags = ["O"] * len(words)
      for pos in np.nonzero(eval_feats["word_index"][i] >= 0)[0]:
        tags[eval_feats["word_index"][i, pos]] = labels[pred_ids[i, pos]]
      pred_tags.append(tags)
    result = scoring.ner_scores(pred_tags, [t for _, t in eval_s])

    def write(out_dir):
      (out_dir / "predictions.txt").write_text("".join(
          "".join(f"{w} {g} {p}\n" for w, g, p in zip(words, gold, pred)) + "\n"
          for (words, gold), pred in zip(eval_s, pred_tags)))
    return result, write

  return TaskData(heads.BertForTokenClassification(cfg, num_labels=len(labels)),
                  _objective(heads.token_loss, "label_weights"),
                  tagging.encode_conll(train_s, tok, L, labels), eval_feats, evaluate, "f1",
                  labels=tuple(labels))


def swag_task(config, tok, cfg: BertConfig) -> TaskData:
  train_ex = tagging.read_swag(fileio.join(config.data_dir, config.train_file))
  eval_ex = tagging.read_swag(fileio.join(config.data_dir, config.eval_file))
  L = config.max_seq_length
  eval_feats = tagging.encode_swag(eval_ex, tok, L)

  def evaluate(scores):
    preds = np.argmax(scores, -1)
    result = {"accuracy": scoring.accuracy(preds, eval_feats["labels"])}

    def write(out_dir):
      (out_dir / "predictions.csv").write_text(
          "id,pred\n" + "".join(f"{e['id']},{int(p)}\n" for e, p in zip(eval_ex, preds)))
    return result, write

  return TaskData(heads.BertForMultipleChoice(cfg), _objective(heads.classification_loss, "example_weights"),
                  tagging.encode_swag(train_ex, tok, L), eval_feats, evaluate, "accuracy")


TASKS = {"glue": classification_task, "custom": classification_task, "squad": squad_task,
         "conll": conll_task, "swag": swag_task}


def load_encoder(path: str) -> tuple[BertConfig, Any]:
  """Encoder config + params from our pre-training workdir or any converted checkpoint."""
  if checkpointing.is_orbax_checkpoint(path):
    found = checkpointing.load_params_for_inference(path)
    if found is None:
      raise FileNotFoundError(f"No restorable checkpoint under {path}.")
    cfg, params = found
    return cfg, params["bert"]
  return convert.load_pretrained(path, target="encoder")


def _batches(feats: dict[str, np.ndarray], batch_size: int, order: np.ndarray, offset: int = 0):
  for start in range(offset, len(order) - batch_size + 1, batch_size):
    idx = order[start:start + batch_size]
    yield start, {k: v[idx] for k, v in feats.items()}


def _predict(p_predict, params, feats, batch_size, batch_sh):
  """Outputs for every eval feature; the last batch is padded (weight-free)."""
  n = len(feats["input_ids"])
  outs = []
  for start in range(0, n, batch_size):
    idx = np.arange(start, start + batch_size) % n
    batch = sharding.host_to_global({k: feats[k][idx] for k in TEXT_INPUTS}, batch_sh)
    out = jax.device_get(p_predict(params, batch))
    take = min(batch_size, n - start)
    outs.append(jax.tree.map(lambda x: np.asarray(x)[:take], out))
  return jax.tree.map(lambda *xs: np.concatenate(xs), *outs)


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Fine-tunes config.init_checkpoint on config.task; returns the best dev metrics."""
  out_dir = fileio.path(workdir)
  out_dir.mkdir(parents=True, exist_ok=True)
  if not config.init_checkpoint:
    raise ValueError("Fine-tuning needs --config.init_checkpoint (a pre-training workdir of ours, "
                     "a converted checkpoint, a HuggingFace directory or a Google TF checkpoint).")
  if config.task not in TASKS:
    raise ValueError(f"config.task={config.task!r}: choose one of {sorted(TASKS)} or 'pretrain'.")
  packed = bool(config.get("packing", False))
  if packed and config.task not in PACKABLE_TASKS:
    raise ValueError(f"packing is only supported for classification fine-tuning (task glue or custom), "
                     f"not task={config.task!r}: set --config.packing=False.")
  if packed and config.get("max_examples_per_row", 0) < 1:
    raise ValueError(f"max_examples_per_row must be >= 1, got {config.get('max_examples_per_row')}.")
  enc_cfg, enc_params = load_encoder(config.init_checkpoint)
  cfg = enc_cfg.replace(hidden_dropout_rate=config.model.hidden_dropout_rate,
                        attention_dropout_rate=config.model.attention_dropout_rate,
                        dtype=config.model.dtype, scan_layers=False, remat="none")
  if config.max_seq_length > cfg.max_position_embeddings:
    raise ValueError(f"max_seq_length {config.max_seq_length} exceeds the checkpoint's "
                     f"{cfg.max_position_embeddings} positions.")
  tok = Tokenizer.from_path(config.vocab_path, config.get("lowercase"))
  if tok.vocab_size != cfg.vocab_size:
    raise ValueError(f"vocab {config.vocab_path} has {tok.vocab_size} tokens, the checkpoint "
                     f"{cfg.vocab_size}: use the vocabulary the model was pre-trained with.")
  task = TASKS[config.task](config, tok, cfg)
  n_train = len(task.train["input_ids"])
  B = config.global_batch_size
  epoch_order = lambda epoch: np.random.default_rng([config.seed, epoch]).permutation(n_train)
  if packed:
    # Rows per epoch depend on that epoch's shuffle: count them up front (row assignment
    # only) for the schedule's length; each epoch is packed when it starts (packing is
    # deterministic, so a resumed run re-packs the same rows).
    pack = lambda epoch: pack_epoch(task.train, epoch_order(epoch), config.max_seq_length,
                                    config.max_examples_per_row)
    lengths = task.train["input_mask"].sum(-1)
    rows = [packing.assign_rows(lengths[epoch_order(e)], np.zeros_like(lengths),
                                max_seq_length=config.max_seq_length,
                                max_examples_per_row=config.max_examples_per_row,
                                max_predictions_per_row=0)[-1]
            for e in range(config.num_epochs)]
    steps = [r // B for r in rows]
    logging.info("Packing: %d examples -> %s rows an epoch (%.2f examples a row, %.0f%% of tokens "
                 "real), %s steps of %d rows.", n_train, rows, n_train / max(np.mean(rows), 1),
                 100 * lengths.sum() / (np.mean(rows) * config.max_seq_length), steps, B)
    if min(steps, default=1) == 0:
      raise ValueError(f"{n_train} training examples pack into {min(rows)} rows, fewer than one batch "
                       f"of {B} rows: lower global_batch_size.")
    task.objective = task.objective.replace(keyword_inputs=PACKING_INPUTS)
  else:
    steps = [n_train // B] * config.num_epochs
    if n_train // B == 0:
      raise ValueError(f"{n_train} training examples is fewer than one batch of {B}.")
  total = sum(steps)
  config = ml_collections.ConfigDict(config.to_dict())  # unlocked copy for the schedule
  config.schedule.warmup_steps = int(config.warmup_fraction * total)
  config.schedule.decay_steps = total
  tx = optim.make_optimizer(config)
  mesh = sharding.make_mesh(config.mesh_shape)
  rules = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in config.logical_axis_rules)
  model, objective = task.model, task.objective
  sample = {k: v[:1] for k, v in task.train.items() if k in TEXT_INPUTS}

  def init(rng):
    params = model.init({"params": rng}, *(jnp.asarray(sample[k]) for k in TEXT_INPUTS))["params"]
    return train.TrainState(step=jnp.zeros([], jnp.int32), params=params, opt_state=tx.init(params))

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(init, jax.random.key(config.seed))
    state_sh = sharding.logical_shardings(boxed, mesh, rules)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            sharding.strip_boxes(boxed), state_sh)
    ckpt = checkpointing.Checkpointer(workdir, keep=2, keep_period=None, async_save=False)
    restored = ckpt.restore(abstract, config)
    if restored is not None:
      step0, state, data_state, _ = restored
      logging.info("Resumed fine-tuning at step %d.", step0)
    else:
      state = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=state_sh)(jax.random.key(config.seed))
      # The pre-trained encoder replaces the fresh one; only `classifier` stays new (and
      # the pooler, for checkpoints without one: BertForMaskedLM, BertModel(add_pooling_layer=False)).
      if "pooler" not in enc_params:
        logging.warning("init_checkpoint %s has no pooler: it starts from a fresh "
                        "initialisation (as transformers does for such checkpoints).",
                        config.init_checkpoint)
        enc_params = {**enc_params, "pooler": jax.device_get(state.params["bert"]["pooler"])}
      bert = jax.tree.map(lambda a, x: jax.device_put(np.asarray(x, a.dtype), a.sharding),
                          abstract.params["bert"], enc_params)
      state = state.replace(params={**state.params, "bert": bert})
      data_state = None
    batch_sh = sharding.batch_sharding(mesh, rules)
    repl = sharding.replicated(mesh)
    p_train = jax.jit(functools.partial(train.train_step, model=model, tx=tx, objective=objective),
                      in_shardings=(state_sh, batch_sh, repl), out_shardings=(state_sh, repl),
                      donate_argnums=(0,))
    p_predict = jax.jit(lambda p, b: model.apply({"params": p}, *(b[k] for k in TEXT_INPUTS)),
                        in_shardings=(state_sh.params, batch_sh))
    writer = metrics_lib.make_writer(workdir)
    best_path = out_dir / "best"
    metrics_path = out_dir / "metrics.json"
    best = _read_json(metrics_path).get("best", {})
    dropout_rng = jax.random.fold_in(jax.random.key(config.seed), 1)
    step = int(jax.device_get(state.step))
    epoch0, offset = (data_state or {}).get("epoch", 0), (data_state or {}).get("offset", 0)
    if offset and bool((data_state or {}).get("packing", False)) != packed:
      raise ValueError(f"The checkpoint in {workdir} stopped mid-epoch with packing="
                       f"{not packed}; resume with the same --config.packing (its offset counts "
                       f"{'examples' if packed else 'rows'}).")
    history = _read_json(metrics_path).get("epochs", [])
    for epoch in range(epoch0, config.num_epochs):
      if packed:  # rows of this epoch's shuffled examples; offsets count rows
        feats = pack(epoch)
        order = np.arange(len(feats["input_ids"]))
      else:
        feats, order = task.train, epoch_order(epoch)
      sums = None
      for start, batch in _batches(feats, B, order, offset if epoch == epoch0 else 0):
        state, m = p_train(state, sharding.host_to_global(batch, batch_sh), dropout_rng)
        sums = m if sums is None else jax.tree.map(jnp.add, sums, m)
        step += 1
        if step % config.log_every_steps == 0:
          host = jax.device_get(sums)
          # Sums and weight count examples (packed rows: filled example slots only).
          logging.info("epoch %d step %d/%d | loss %.4f | train acc %.4f | %d examples", epoch + 1, step,
                       total, host["loss_sum"] / max(host["weight"], 1e-8),
                       host["correct_sum"] / max(host["weight"], 1e-8), host["weight"])
          if not np.isfinite(host["loss_sum"]):
            raise metrics_lib.NonFiniteLossError(f"Non-finite fine-tuning loss at step {step}.")
        if config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0:
          ckpt.save(step, state, {"epoch": epoch, "offset": start + B, "packing": packed}, config)
      outputs = _predict(p_predict, state.params, task.eval, config.eval_batch_size, batch_sh)
      result, write = task.evaluate(outputs)
      result = {k: float(v) for k, v in result.items()}
      logging.info("epoch %d dev: %s", epoch + 1, result)
      writer.write_scalars(step, {f"dev/{k}": v for k, v in result.items() if isinstance(v, float)})
      history.append({"epoch": epoch + 1, "step": step, **result})
      if not best or result[task.main_metric] > best[task.main_metric]:
        best = {"epoch": epoch + 1, "step": step, **result}
        _save_params(best_path, state.params, cfg, config, task.labels)
        if jax.process_index() == 0:  # shared files: one writer, every host reads them
          write(out_dir)
      ckpt.save(step, state, {"epoch": epoch + 1, "offset": 0, "packing": packed}, config)
      if jax.process_index() == 0:
        metrics_path.write_text(json.dumps({"task": config.task, "main_metric": task.main_metric,
                                            "best": best, "epochs": history}, indent=2))
    ckpt.close()
    writer.flush()
  logging.info("Best dev %s: %s", task.main_metric, best)
  return best


def _read_json(path) -> dict:
  try:
    return json.loads(path.read_text()) if path.exists() else {}
  except ValueError:
    return {}


def _save_params(path, params, cfg: BertConfig, config, labels) -> None:
  """The best parameters (head included) + what is needed to use them, in `path` (best/).

  config.json marks best/ complete: it is removed before the parameters are replaced and
  written after them, so a kill in between leaves a best/ that predict refuses, never one
  whose config and parameters disagree (a directory rename is not atomic on GCS)."""
  marker = path / "config.json"
  if jax.process_index() == 0 and marker.exists():
    marker.unlink()
  with ocp.StandardCheckpointer() as checkpointer:  # every process writes its shards
    checkpointer.save(path / "params", params, force=True)
    checkpointer.wait_until_finished()
  if jax.process_index() == 0:
    marker.write_text(json.dumps({"bert": cfg.to_dict(), "labels": labels,
                                  "task": json.loads(config.to_json_best_effort())}, indent=2))
