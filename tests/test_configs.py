"""The configs: they load, carry the papers' recipes, and take (only known) overrides."""
from absl import flags
import pytest
from ml_collections import config_flags

from bert_jax import optim
from bert_jax import registry
from bert_jax import train
from tests import test_train_utils as tu
from tests.test_finetune import pretrained  # noqa: F401  pylint: disable=unused-import

CONFIGS = ["default.py", "tiny_pretrain.py", "base_pretrain.py", "base_pretrain.py:phase2",
           "base_pretrain.py:lamb", "base_pretrain.py:lamb,phase2", "large_pretrain.py",
           "large_pretrain.py:phase2", "large_pretrain.py:lamb", "large_pretrain.py:lamb,phase2"]


def _load(spec: str, *overrides: str):
  argv = ["prog", f"--config={tu.REPO / 'configs' / spec}", *overrides]
  fv = flags.FlagValues()
  # sys_argv: override flags (--config.x.y) are derived from the command line.
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  fv(argv)
  return fv.config


@pytest.mark.parametrize("spec", CONFIGS)
def test_every_config_loads_and_builds_its_model(spec):
  config = _load(spec)
  assert config.task == "pretrain"
  cfg = registry.model_config(config, vocab_size=30522)
  preset = config.model.preset
  sizes = {"tiny": (2, 128), "base": (12, 768), "large": (24, 1024)}[preset]
  assert (cfg.num_layers, cfg.hidden_size) == sizes
  assert cfg.intermediate_size == 4 * cfg.hidden_size
  assert config.global_batch_size % config.grad_accum_steps == 0


@pytest.mark.parametrize("model", ["base", "large"])
def test_paper_recipe_two_phases(model):
  p1, p2 = _load(f"{model}_pretrain.py"), _load(f"{model}_pretrain.py:phase2")
  for c in (p1, p2):
    assert c.global_batch_size == 256
    assert c.opt.name == "adamw" and c.opt.learning_rate == 1e-4
    assert (c.opt.b1, c.opt.b2, c.opt.eps, c.opt.weight_decay) == (0.9, 0.999, 1e-6, 0.01)
    assert c.schedule.warmup_steps == 10_000 and c.schedule.decay_steps == 1_000_000
    assert c.model.max_position_embeddings == 512
  assert (p1.num_train_steps, p1.data.max_seq_length, p1.data.max_predictions_per_seq) == (
      900_000, 128, 20)
  assert (p2.num_train_steps, p2.data.max_seq_length, p2.data.max_predictions_per_seq) == (
      1_000_000, 512, 76)
  # Phase 2 continues phase 1's schedule: same lr at the switch.
  assert optim.host_learning_rate(p1, 900_000) == optim.host_learning_rate(p2, 900_000) > 0


def test_lamb_variant_is_the_large_batch_recipe():
  c = _load("large_pretrain.py:lamb")
  assert c.opt.name == "lamb" and c.global_batch_size == 32_768
  assert c.opt.learning_rate == 5e-3 and c.schedule.warmup_steps == 3_125
  assert c.schedule.decay_steps == 15_625 and c.num_train_steps == 14_062
  c2 = _load("large_pretrain.py:lamb,phase2")
  assert c2.num_train_steps == 15_625 and c2.data.max_seq_length == 512


def test_command_line_overrides_and_unknown_keys_fail():
  c = _load("tiny_pretrain.py", "--config.opt.learning_rate=0.5", "--config.mesh_shape.fsdp=2",
            "--config.model.num_layers=3")
  assert c.opt.learning_rate == 0.5 and c.mesh_shape.fsdp == 2
  assert registry.model_config(c, 100).num_layers == 3
  with pytest.raises(Exception, match="learning_rat"):
    _load("tiny_pretrain.py", "--config.opt.learning_rat=0.5")
  with pytest.raises(Exception):
    _load("base_pretrain.py:phase3")


def test_tiny_pretrain_schedule_follows_its_step_count():
  c = _load("tiny_pretrain.py", "--config.num_train_steps=500")
  assert optim.host_learning_rate(c, 500) == 0.0 < optim.host_learning_rate(c, 499)


def test_vocab_size_must_cover_the_vocabulary():
  c = tu.tiny_config()
  with pytest.raises(ValueError, match="smaller than the vocabulary"):
    registry.model_config(c, vocab_size=1000)
  c.model.vocab_size = None
  assert registry.model_config(c, vocab_size=1000).vocab_size == 1000
  with pytest.raises(ValueError, match="vocab_size is unset"):
    registry.model_config(c, vocab_size=None)


# ------------------------------------------------ every field is read by its job ----

# Fields read only in another mode than the runs below exercise (each is then checked to be
# named in the job's code): the mode that reads it.
MODE_ONLY = {
    "data.shuffle_buffer": "data.tfrecord_pattern set (original BERT TFRecords)",
    "data.mixture_temperature": "data.mixture set (several prepared corpora)",
    "data.max_examples_per_row": "data.packing=True",
    "data.max_predictions_per_row": "data.packing=True",
    "max_examples_per_row": "packing unset or True (glue)",
    "packed_batch": "packing unset or True (glue, classify_custom)",
    "compilation_cache_dir": "bert_jax.main.run, before any job (process.job_compilation_cache)",
    "tfds_name": "data_dir=tfds",
    "electra.generator_size": "objective=electra",
    "electra.discriminator_weight": "objective=electra",
}


class _ReadTracker:
  """Records which config fields the job's code (bert_jax/, input_pipeline/) reads: a field
  is (the key set of its section, its key), so copies of a section (to_dict round trips)
  count as the same section. Reads made while serialising (to_dict, to_json) do not count."""
  SKIP = {"to_dict", "to_json", "to_json_best_effort", "__init__", "__eq__", "__repr__",
          "__str__", "copy_and_resolve_references", "__deepcopy__", "lock", "unlock"}

  def __init__(self):
    self.reads = set()

  def install(self, monkeypatch):
    import ml_collections  # pylint: disable=g-import-not-at-top
    import sys  # pylint: disable=g-import-not-at-top
    real = ml_collections.ConfigDict.__getitem__
    tracker = self

    def getitem(config, key):
      frame = sys._getframe(1)  # pylint: disable=protected-access
      while frame is not None and "ml_collections" in frame.f_code.co_filename:
        if frame.f_code.co_name in tracker.SKIP:
          return real(config, key)
        frame = frame.f_back
      if frame is not None and any(f"/{p}/" in frame.f_code.co_filename
                                   for p in ("bert_jax", "input_pipeline")):
        tracker.reads.add((frozenset(config._fields), key))  # pylint: disable=protected-access
      return real(config, key)

    monkeypatch.setattr(ml_collections.ConfigDict, "__getitem__", getitem)

  def unread(self, config, prefix=""):
    import ml_collections  # pylint: disable=g-import-not-at-top
    out = []
    for key in config:
      value = config._fields[key]  # pylint: disable=protected-access
      name = prefix + key
      if isinstance(value, ml_collections.ConfigDict):
        out += self.unread(value, name + ".")
      elif (frozenset(config._fields), key) not in self.reads:  # pylint: disable=protected-access
        out.append(name)
    return out


def _named_in_code(field: str) -> bool:
  leaf = field.rsplit(".", 1)[-1]
  return any(leaf in p.read_text() for d in ("bert_jax", "input_pipeline")
             for p in (tu.REPO / d).rglob("*.py"))


@pytest.mark.slow
def test_every_field_of_every_shipped_config_is_read_by_its_job(tmp_path, monkeypatch, capsys,
                                                                pretrained):  # noqa: F811
  """Pre-training (the README job, then packed) and every fine-tuning task run under a
  tracker; each leaf of each shipped config must be read by its job (or, for MODE_ONLY
  fields, be named in the code of the mode that reads it)."""
  from bert_jax.configs import classify_custom, conll, embed, glue, squad, swag, tiny_pretrain  # pylint: disable=g-import-not-at-top
  from tests import test_contrastive, test_finetune, test_finetune_packing, test_main  # pylint: disable=g-import-not-at-top
  tracker = _ReadTracker()
  tracker.install(monkeypatch)

  def pretrain(workdir, **overrides):
    c = tiny_pretrain.get_config()
    for key, value in {**test_main.SHORT, "num_train_steps": 4, "eval_every_steps": 2,
                       **overrides}.items():
      *parents, leaf = key.split(".")
      node = c
      for p in parents:
        node = node[p]
      node[leaf] = value
    train.train_and_evaluate(c, str(workdir))

  pretrain(tmp_path / "pre")
  pretrain(tmp_path / "packed", **{"data.packing": True, "data.vocab_path": str(tmp_path / "pre" / "vocab"),
                                   "data.prepared_dir": str(tmp_path / "pre" / "prepared")})
  unread = [f for f in tracker.unread(tiny_pretrain.get_config()) if f not in MODE_ONLY]
  assert not unread, f"pre-training config fields nobody reads: {unread}"

  def fresh(name):
    (tmp_path / name).mkdir()
    return tmp_path / name

  test_finetune.test_glue_sst2_learns_and_writes_submission(fresh("sst2"), pretrained)
  test_finetune.test_glue_stsb_regression_and_custom_jsonl(fresh("stsb"), pretrained)
  test_finetune.test_squad_end_to_end(fresh("squad"), pretrained, "v2", capsys)
  test_finetune.test_conll_end_to_end(fresh("conll"), pretrained, capsys)
  test_finetune.test_swag_end_to_end(fresh("swag"), pretrained)
  test_finetune_packing.test_packed_finetuning_end_to_end(fresh("packed_ft"), pretrained)
  test_contrastive.test_embed_job_learns_keeps_best_and_exports(fresh("embed"), pretrained)
  test_contrastive.test_beir_retrieval_is_a_dev_metric_and_picks_best(fresh("beir"), pretrained)
  for module in (glue, classify_custom, squad, conll, swag, embed):
    unread = [f for f in tracker.unread(module.get_config()) if f not in MODE_ONLY]
    assert not unread, f"{module.__name__} fields the fine-tuning job never reads: {unread}"
  for field, mode in MODE_ONLY.items():
    assert _named_in_code(field), (field, mode)
