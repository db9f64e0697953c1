"""What the families' parity tests against transformers share: a HuggingFace directory of a
model with random weights, padded random inputs, and four fine-tuning steps of ours against
transformers' (sequence classification, dropout off, the same batches, AdamW with bias
correction and no decay on norms and biases, a constant learning rate: the loss of each step
and every parameter after the last within 1e-5)."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import torch

from bert_jax import heads, objectives
from bert_jax import trainer as trainer_lib
from bert_jax.configs import glue


def randomize(model, seed: int, is_norm: Callable[[str], bool]):
  """Every weight random (norm scales around 1), so a mapping mistake cannot hide."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g) * 0.1
      p.copy_(1.0 + noise if is_norm(name) and name.endswith("weight") else noise)
  return model.eval()


def hf_dir(tmp_path, cls, config, is_norm: Callable[[str], bool], seed: int = 0
           ) -> tuple[str, object]:
  """(directory, model): `cls(config)` with random weights (randomize), saved."""
  torch.manual_seed(seed)
  model = randomize(cls(config), seed, is_norm)
  d = tmp_path / f"{config.model_type}-{cls.__name__}"
  model.save_pretrained(d)
  return str(d), model


def padded_inputs(seed: int, batch: int, pad: tuple[int, ...], vocab: int, length: int,
                  first_id: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """(ids, mask) [batch, length]: random ids after `first_id`, row b's last pad[b] padding."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(4, vocab, (batch, length)).astype(np.int32)
  ids[:, 0] = first_id
  mask = np.ones((batch, length), np.int32)
  for b, p in enumerate(pad[:batch]):
    if p:
      mask[b, -p:] = 0
      ids[b, -p:] = pad_id
  return ids, mask


def to_torch(x):
  return torch.tensor(np.asarray(x), dtype=torch.long)


def four_steps_match(hf, cfg, params, make_inputs: Callable[[int], tuple[np.ndarray, np.ndarray]],
                     to_hf: Callable[[dict], dict], no_decay: Callable[[str], bool],
                     name: Callable[[str], str] = lambda k: k) -> set[str]:
  """Runs both; returns transformers' parameter names that `to_hf` does not give (tied)."""
  hf.train()
  c = glue.get_config("sst2")
  c.global_batch_size, c.num_train_steps = 4, 4
  # lr 1e-4: each step moves a weight by ~1e-4 (a wrong gradient shows 10x over the bound),
  # while Adam's amplification of float rounding in near-zero gradients (m / (sqrt(v) +
  # eps) with |g| ~ eps) stays below it (2.6e-5 seen at lr 1e-3).
  c.opt.bias_correction, c.opt.learning_rate, c.opt.weight_decay = True, 1e-4, 0.01
  c.opt.grad_clip_norm = 0.0
  c.schedule = ml_collections.ConfigDict({"warmup_steps": 0, "decay_steps": 4,
                                          "end_learning_rate": 1e-4})
  model = heads.BertForSequenceClassification(cfg, num_labels=3)
  rng = np.random.default_rng(5)
  batches = []
  for _ in range(4):
    ids, mask = make_inputs(int(rng.integers(100)))
    batches.append({"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask,
                    "labels": rng.integers(0, 3, 4).astype(np.int32)})
  trainer = trainer_lib.build(c, model, objectives.supervised(heads.classification_sums),
                              batches[0], None)
  with trainer.activate():
    state = trainer.init()
  state = state.replace(params=jax.tree.map(jnp.asarray, params))
  decay, no = [], []
  for n, p in hf.named_parameters():
    (no if no_decay(n) else decay).append(p)
  start = {name(k): v.detach().numpy().copy() for k, v in hf.state_dict().items()}
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                           {"params": no, "weight_decay": 0.0}], lr=1e-4,
                          betas=(c.opt.b1, c.opt.b2), eps=c.opt.eps)
  for step, batch in enumerate(batches):
    with trainer.activate():
      state, sums = trainer.train_step(state, trainer.to_global(batch), trainer.train_rng)
    out = hf(input_ids=to_torch(batch["input_ids"]), attention_mask=to_torch(batch["input_mask"]),
             labels=to_torch(batch["labels"]))
    opt.zero_grad()
    out.loss.backward()
    opt.step()
    ours, theirs = float(sums["loss_sum"]) / float(sums["weight"]), float(out.loss.detach())
    assert abs(ours - theirs) <= 1e-5, (step, ours, theirs)
  got = {name(k): v for k, v in to_hf(jax.device_get(state.params)).items()}
  want = {name(k): v.detach().numpy() for k, v in hf.state_dict().items()}
  moved = 0.0
  for k, v in want.items():
    if k in got:
      assert np.abs(got[k] - v).max() <= 1e-5, k
      moved = max(moved, float(np.abs(v - start[k]).max()))
  assert moved > 1e-4  # the steps did move the weights
  return set(want) - set(got)


def task_head_matches(cfg, params, hf, ids, mask, head: str, tolerance: float = 1e-4) -> None:
  """Our `head` (classify | tag | qa | choice) on `params` read from transformers' model `hf`
  gives its logits (the pooler a token head never reads filled in fresh)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  model = {"classify": lambda: heads.BertForSequenceClassification(cfg, num_labels=3),
           "tag": lambda: heads.BertForTokenClassification(cfg, num_labels=3),
           "qa": lambda: heads.BertForQuestionAnswering(cfg),
           "choice": lambda: heads.BertForMultipleChoice(cfg)}[head]()
  fresh = nn.unbox(model.init(jax.random.key(0), ids, np.zeros_like(ids), mask))["params"]
  params = {**fresh, **params, "bert": {**fresh["bert"], **params["bert"]}}
  got = model.apply({"params": params}, ids, np.zeros_like(ids), mask)
  with torch.no_grad():
    out = hf(input_ids=to_torch(ids), attention_mask=to_torch(mask))
  if head == "qa":
    got, want = np.stack(got, -1), np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1)
  else:
    got, want = np.asarray(got), out.logits.numpy()
  real = mask.astype(bool) if head in ("tag", "qa") else slice(None)
  assert np.abs(got[real] - want[real]).max() <= tolerance


def export_matches(hf, back, ids, mask) -> None:
  """transformers' model `back`, loaded from our export of `hf`, gives `hf`'s outputs."""
  with torch.no_grad():
    a = hf(input_ids=to_torch(ids), attention_mask=to_torch(mask))[0].numpy()
    b = back.eval()(input_ids=to_torch(ids), attention_mask=to_torch(mask))[0].numpy()
  real = mask.astype(bool) if a.ndim >= 2 and a.shape[:2] == mask.shape else slice(None)
  np.testing.assert_array_equal(a[real], b[real])


def suite_runs_on(tmp_path, path: str) -> None:
  """configs/suite.py (CoLA, MRPC: pairs, STS-B: regression) on the checkpoint at `path` (its
  vocabulary beside it), one grid point, one seed: every task reported."""
  from bert_jax import main  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import suite as suite_config  # pylint: disable=g-import-not-at-top
  from tests import suite_data  # pylint: disable=g-import-not-at-top
  suite_data.make_glue(tmp_path / "data")
  c = suite_config.get_config("cola,mrpc,stsb")
  c.init_checkpoint = c.vocab_path = path
  c.data_dir, c.protocol, c.seeds = str(tmp_path / "data"), "grid", 1
  c.grid.learning_rate, c.grid.global_batch_size, c.grid.num_epochs = (1e-3,), (8,), (1,)
  c.eval_batch_size, c.max_seq_length, c.log_every_steps, c.submission = 8, 24, 0, False
  assert main.run(c, str(tmp_path / "suite")) is not None
  text = (tmp_path / "suite" / "report.md").read_text()
  assert all(t in text for t in ("CoLA", "MRPC", "STS-B")), text


def edited_copy(path: str, dest, config_change=None, extra=None) -> str:
  """A copy of the HuggingFace directory `path` at `dest` with config.json's fields changed
  by `config_change` and the tensors `extra` (the file's names -> arrays) added to its
  model.safetensors."""
  import json  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  d = pathlib.Path(shutil.copytree(path, dest))
  config = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(json.dumps({**config, **(config_change or {})}))
  state = {**load_file(d / "model.safetensors"), **(extra or {})}
  save_file(state, d / "model.safetensors", metadata={"format": "pt"})
  return str(d)


def refusal(path: str, target: str = "pretraining") -> str:
  """The message of the CheckpointMismatchError that reading `path` as `target` raises: one
  line, saying what to do."""
  import pytest  # pylint: disable=g-import-not-at-top
  from bert_jax import formats, loader  # pylint: disable=g-import-not-at-top
  with pytest.raises(formats.CheckpointMismatchError) as e:
    loader.read(path, target)
  message = str(e.value)
  assert "\n" not in message and ("fix config.json" in message or "remove" in message), message
  return message


def finetune_and_predict(tmp_path, path: str, capsys) -> None:
  """CoLA (suite_data's) from the checkpoint directory `path` (its tokenizer beside it)
  through the fine-tuning job, one epoch at L=16, then predict --mode=classify on the run: a
  label of CoLA's printed."""
  import json  # pylint: disable=g-import-not-at-top
  from bert_jax import finetune, predict  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import glue as glue_config  # pylint: disable=g-import-not-at-top
  from tests import suite_data  # pylint: disable=g-import-not-at-top
  suite_data.make_glue(tmp_path / "glue")
  c = glue_config.get_config("cola")
  c.init_checkpoint = c.vocab_path = path
  c.data_dir, c.max_seq_length = str(tmp_path / "glue" / "CoLA"), 16
  c.num_epochs, c.global_batch_size, c.eval_batch_size, c.log_every_steps = 1, 8, 8, 1000
  best = finetune.finetune(c, str(tmp_path / "work"))
  assert "matthews_corrcoef" in best or "accuracy" in best
  predict.main([f"--checkpoint={tmp_path / 'work'}", "--mode=classify",
                "--text=the movie was very good"])
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["prediction"] in ("0", "1")


def exported_classifier_matches(tmp_path, path: str, cls, **load_kw) -> None:
  """The run finetune_and_predict left, exported (convert --target=all --to=huggingface):
  transformers' `cls` loads it with every key, AutoTokenizer gives our ids on a pair, and
  its logits are ours within 1e-5."""
  from bert_jax import convert, finetuned  # pylint: disable=g-import-not-at-top
  from input_pipeline import features  # pylint: disable=g-import-not-at-top
  from input_pipeline.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  convert.main([f"--input={tmp_path / 'work' / 'best'}", f"--output={tmp_path / 'hf'}",
                "--target=all", "--to=huggingface", f"--vocab={path}"])
  back, info = cls.from_pretrained(tmp_path / "hf", output_loading_info=True, **load_kw)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  cfg, params, _, _ = finetuned.load(str(tmp_path / "work"))
  ours = Tokenizer.from_path(str(tmp_path / "hf"))
  ids, _ = features.encode_pair(ours, ours.encode("the movie"), ours.encode("was good"))
  assert ids == theirs("the movie", "was good")["input_ids"]
  ids = np.asarray([ids])
  got = heads.BertForSequenceClassification(cfg, num_labels=2).apply(
      {"params": params}, ids, np.zeros_like(ids), np.ones_like(ids))
  with torch.no_grad():
    want = back.eval()(input_ids=to_torch(ids)).logits.numpy()
  assert np.abs(np.asarray(got) - want).max() <= 1e-5
