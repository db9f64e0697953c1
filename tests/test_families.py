"""The model families (bert_jax/families.py): each found by name or by a checkpoint's
model_type, none chosen by a type check outside its own modules, and a checkpoint of a
model type no family reads refused in one line."""
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy

from bert_jax import families
from common import errors
from bert_jax.models import bert as model_lib
from bert_jax.models import modern

REPO = pathlib.Path(__file__).resolve().parents[1]


def _own_modules() -> set[str]:
  """The files a family owns (it may test its kind there): the module its record lives in
  (families.MODULES), its config's and its encoder's, and families.py."""
  names = set(families.MODULES.values())
  for name in families.names():
    family = families.get(name)
    names |= {family.config.__module__, family.encoder.__module__}
  return {n.replace(".", "/") + ".py" for n in names} | {"bert_jax/families.py"}


def _type_check() -> re.Pattern:
  """An isinstance test of any family's config class, a type() test, or a family name test."""
  classes = "|".join(sorted({families.get(n).config.__name__ for n in families.names()}))
  return re.compile(rf"isinstance\([^)]*\b({classes})\b|type\(\w*cfg\w*\) is"
                    r"|\.family\s*(==|!=|in)\s*[\"'(]")


def test_no_family_is_chosen_by_a_type_check_outside_its_modules():
  own, check = _own_modules(), _type_check()
  assert {"bert_jax/models/deberta.py", "bert_jax/models/modern.py"} <= own
  assert "DebertaConfig" in check.pattern and "ElectraConfig" in check.pattern
  found = [f"{path.relative_to(REPO)}:{i}: {line.strip()}"
           for package in ("bert_jax", "bert_jax/configs", "bert_jax/models", "input_pipeline",
                           "common")
           for path in sorted((REPO / package).glob("*.py"))
           if str(path.relative_to(REPO)) not in own
           for i, line in enumerate(path.read_text().splitlines(), 1) if check.search(line)]
  assert not found, "\n".join(found)


def test_each_family_is_found_by_name_config_and_model_type():
  assert families.names() == sorted(families.MODULES)
  assert families.of(model_lib.BertConfig()).name == "bert"
  assert families.of(modern.ModernConfig.from_preset("modernbert-base")).name == "modernbert"
  assert families.model_types() == {name: name for name in families.names()}
  for name in families.names():
    family = families.get(name)
    assert family.name == name and getattr(family.config(), "family", name) in families.names()


def test_an_unknown_family_name_is_a_config_error():
  with pytest.raises(families.errors.ConfigError, match="'albert' is unknown: choose one of "
                                                        "bert, deberta-v2, electra, eurobert, "
                                                        "modernbert, "
                                                        "roberta, xlm-roberta"):
    families.get("albert")


def _albert_dir(path: pathlib.Path) -> pathlib.Path:
  path.mkdir()
  (path / "config.json").write_text(json.dumps({
      "model_type": "albert", "architectures": ["AlbertForMaskedLM"], "vocab_size": 30,
      "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
      "intermediate_size": 16, "embedding_size": 4}))
  safetensors.numpy.save_file({"albert.embeddings.word_embeddings.weight":
                               np.zeros((30, 4), np.float32)}, str(path / "model.safetensors"))
  (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                            + [f"w{i}" for i in range(25)]) + "\n")
  return path


@pytest.mark.parametrize("command", ["convert", "predict", "finetune"])
def test_a_model_type_no_family_reads_is_one_line_exit_2(tmp_path, command):
  albert = _albert_dir(tmp_path / "albert")
  argv = {"convert": ["-m", "bert_jax.convert", f"--input={albert}", f"--output={tmp_path / 'o'}"],
          "predict": ["-m", "bert_jax.predict", f"--checkpoint={albert}", "--text=a [MASK]"],
          "finetune": ["-m", "bert_jax.main", "--config=configs/glue.py:cola",
                       f"--config.init_checkpoint={albert}",
                       f"--config.vocab_path={albert / 'vocab.txt'}",
                       f"--config.data_dir={tmp_path}", f"--workdir={tmp_path / 'w'}"]}[command]
  out = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                       timeout=300, check=False)
  assert out.returncode == 2, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  lines = [l for l in out.stderr.splitlines() if "albert" in l]
  assert len(lines) == 1, out.stderr[-3000:]
  assert "'albert' checkpoint (config.json model_type)" in lines[0]
  assert ("the supported model types are bert, deberta-v2, electra, eurobert, modernbert, "
          "roberta, xlm-roberta" in lines[0])
  assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", families.names())
def test_every_family_shards_by_its_rules_table(name):
  """A family's parameters carry only logical axis names its sharding rules map (a name no
  rule maps would be silently replicated); every family shards by the shared table today."""
  import flax.linen as nn
  import jax
  import ml_collections
  from bert_jax import registry
  from bert_jax import sharding
  from tests import test_train_utils as tu
  config = tu.tiny_config()
  config.model = ml_collections.ConfigDict(dict(
      family=name, preset="tiny" if name == "bert" else None, dtype="float32",
      param_dtype="float32"))
  config.data.nsp = False
  model, _, sample = registry.pretraining(config, vocab_size=64)
  shapes = jax.eval_shape(lambda: model.init(
      {"params": jax.random.key(0), "dropout": jax.random.key(1)}, **sample, deterministic=True))
  specs = jax.tree.leaves(nn.get_partition_spec(shapes),
                          is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  used = {axis for spec in specs for axis in spec if axis is not None}
  assert used and used <= {rule for rule, _ in families.get(name).sharding_rules}, used
  assert families.get(name).sharding_rules == sharding.RULES


def test_each_family_builds_the_vocabulary_kind_of_its_checkpoints():
  """A run that builds its vocabulary from a corpus trains the kind the family's published
  checkpoints ship (config.build.vocab_kind "" asks the family)."""
  from input_pipeline import vocab
  kinds = {name: families.get(name).vocab_kind for name in families.names()}
  assert kinds == {"bert": "wordpiece", "electra": "wordpiece", "roberta": "bpe",
                   "xlm-roberta": "sentencepiece", "deberta-v2": "sentencepiece",
                   "modernbert": "bpe", "eurobert": "bpe"}
  assert set(kinds.values()) <= set(vocab.KINDS)


# Two families in the default tier (BERT's packing has its own tests), the others slow.
@pytest.mark.parametrize("name", [n if n in ("modernbert", "deberta-v2") else
                                  pytest.param(n, marks=pytest.mark.slow)
                                  for n in families.names()])
def test_every_family_classifies_packed_rows_as_each_example_alone(name):
  """Fine-tuning packs classification examples by default (bert_jax/finetune.packs): each
  family's classifier gives each example of a packed row (block-diagonal attention,
  positions restarting, its own [CLS] or mean) its logits unpacked, dropout off."""
  import flax.linen as nn
  import jax
  import ml_collections
  from bert_jax import heads, registry
  from input_pipeline import epochs, features
  from tests import test_train_utils as tu
  from tests.test_finetune_packing import L, _examples
  config = tu.tiny_config()
  config.model = ml_collections.ConfigDict(dict(
      family=name, preset="tiny" if name == "bert" else None, dtype="float32",
      param_dtype="float32", num_layers=2, hidden_size=32, num_heads=2, intermediate_size=48))
  cfg = registry.model_config(config, 64)
  cfg = cfg.replace(**{field: 0.0 for field in families.get(name).dropout})
  f = _examples(n=7, num_labels=3)
  head = heads.BertForSequenceClassification(cfg, num_labels=3)
  params = nn.unbox(jax.jit(head.init)(jax.random.key(0), *(f[k] for k in features.TEXT)))["params"]
  params = jax.tree.map(lambda p: p * 8, params)  # logits well away from 0
  packed = epochs.pack_epoch(dict(f, index=np.arange(7)), np.arange(7), L, 4)
  assert packed["input_ids"].shape[0] < 7  # several examples a row
  apply = jax.jit(head.apply)
  alone = np.asarray(apply({"params": params}, *(f[k] for k in features.TEXT)))
  logits = np.asarray(apply({"params": params}, *(packed[k] for k in features.TEXT),
                            **{k: packed[k] for k in features.PACKED}))
  filled = packed["example_weights"] > 0
  assert np.abs(alone).max() > 0.1
  np.testing.assert_allclose(logits[filled], alone[packed["index"][filled]], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", families.names())
def test_every_family_keeps_the_parameter_layout(name):
  """The layout the loader converts (families.ENCODER, UNROLLED_LAYER,
  SCANNED_LAYERS) is every family's: unrolled, `encoder/layer_i` for each of its 3 layers and
  nothing layer-like beside them; with scan_layers, `encoder/layers` stacking the 3 on axis 0;
  the loader turns each into the other leaf for leaf."""
  import jax
  import ml_collections
  from bert_jax import loader, registry
  from tests import test_train_utils as tu
  trees = {}
  for scan in (False, True):
    config = tu.tiny_config()
    config.model = ml_collections.ConfigDict(dict(
        family=name, preset="tiny" if name == "bert" else None, dtype="float32",
        param_dtype="float32", num_layers=3, hidden_size=32, num_heads=2, intermediate_size=48,
        scan_layers=scan))
    config.data.nsp = False
    model, _, sample = registry.pretraining(config, vocab_size=64)
    try:
      shapes = jax.eval_shape(lambda: model.init(  # pylint: disable=cell-var-from-loop
          {"params": jax.random.key(0), "dropout": jax.random.key(1)}, **sample,
          deterministic=True))["params"]
    except errors.ConfigError:  # DeBERTa's layers are not scanned (refused in one line)
      assert scan and name == "deberta-v2", name
      continue
    trees[scan] = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), nn_unbox(shapes))
  encoder = trees[False]["bert"][families.ENCODER]
  layers = [families.UNROLLED_LAYER.format(i) for i in range(3)]
  assert [k for k in encoder if k.startswith(families.UNROLLED_LAYER.format(""))] == layers
  assert families.SCANNED_LAYERS not in encoder
  if True not in trees:
    return
  scanned = trees[True]["bert"][families.ENCODER]
  assert families.SCANNED_LAYERS in scanned and not set(layers) & set(scanned)
  assert {a.shape[0] for a in jax.tree.leaves(scanned[families.SCANNED_LAYERS])} == {3}
  for scan in (False, True):
    got = loader.to_layout(trees[not scan], scan)
    assert jax.tree.structure(got) == jax.tree.structure(trees[scan])
    assert [a.shape for a in jax.tree.leaves(got)] == [a.shape for a in jax.tree.leaves(trees[scan])]


def nn_unbox(tree):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return nn.unbox(tree)
