"""bert_jax.loader, the one way weights enter a model: runs of ours onto shardings in either
layout, past damaged steps; other formats on the host; layouts, fit and finiteness."""
import logging

import jax
import numpy as np
import pytest

from bert_jax import formats, loader, train
from tests import test_checkpoint
from tests import test_train_utils as tu

tu.use_compilation_cache()

FROZEN = dict(num_train_steps=1, schedule__warmup_steps=5, eval_steps=0)  # params untouched


@pytest.mark.slow  # three tiny runs (~33 s); test_checkpoint converts layouts on resume
def test_init_from_a_run_saved_in_the_other_layout(tmp_path):
  """A scan_layers run starts from an unrolled run of ours and back (the Orbax restore reads
  the saved layout and converts on device; before, the keys did not fit)."""
  train.train_and_evaluate(tu.tiny_config(num_train_steps=2), str(tmp_path / "unrolled"))
  want = tu.load_checkpoint(tmp_path / "unrolled", 2)["params"]
  scanned = train.train_and_evaluate(
      tu.tiny_config(init_checkpoint=str(tmp_path / "unrolled"), model__scan_layers=True,
                     **FROZEN), str(tmp_path / "scanned"))
  assert "layers" in scanned.params["bert"]["encoder"]
  got = tu.flat(loader.to_layout(jax.device_get(scanned.params), False))
  assert got.keys() == tu.flat(want).keys()
  for k, v in tu.flat(want).items():
    np.testing.assert_array_equal(got[k], v, err_msg=k)
  back = train.train_and_evaluate(
      tu.tiny_config(init_checkpoint=str(tmp_path / "scanned"), **FROZEN), str(tmp_path / "back"))
  for k, v in tu.flat(want).items():
    np.testing.assert_array_equal(tu.flat(back.params)[k], v, err_msg=k)


def test_init_reads_past_a_damaged_step_and_says_so(tmp_path, caplog):
  """As predict does: the newest intact step is read and the damaged one named (nothing is
  moved in the run read from)."""
  first = tmp_path / "first"
  train.train_and_evaluate(tu.tiny_config(num_train_steps=6, checkpoint_every_steps=3), str(first))
  test_checkpoint._overwrite_middle(  # pylint: disable=protected-access
      test_checkpoint._largest_data_file(first / "checkpoints" / "6"), 0x7F)  # pylint: disable=protected-access
  caplog.set_level(logging.INFO)
  state = train.train_and_evaluate(tu.tiny_config(init_checkpoint=str(first), **FROZEN),
                                   str(tmp_path / "second"))
  assert f"{first / 'checkpoints' / '6'} is damaged" in caplog.text
  assert "reading step 3 instead" in caplog.text and "(step 3)" in caplog.text
  want = tu.flat(tu.load_checkpoint(first, 3)["params"])
  for k, v in tu.flat(state.params).items():
    np.testing.assert_array_equal(v, want[k], err_msg=k)
  assert tu.checkpoint_steps(first) == [3, 6]


def test_layouts_round_trip_and_nonfinite_names_leaves():
  rng = np.random.default_rng(0)
  layer = lambda: {"attention": {"query": {"kernel": rng.normal(size=(4, 2, 2))}},
                   "output": {"bias": rng.normal(size=(4,))}}
  params = {"bert": {"encoder": {"layer_0": layer(), "layer_1": layer()},
                     "pooler": {"bias": np.zeros(4)}}, "output_bias": np.zeros(8)}
  scanned = loader.to_layout(params, True)
  assert loader.flat(scanned)[("bert", "encoder", "layers", "output", "bias")].shape == (2, 4)
  assert loader.is_scanned(loader.flat(scanned)) and not loader.is_scanned(loader.flat(params))
  back = loader.to_layout(scanned, False)
  assert loader.flat(back).keys() == loader.flat(params).keys()
  for k, v in loader.flat(params).items():
    np.testing.assert_array_equal(loader.flat(back)[k], v)
  assert loader.nonfinite(params) == []
  params["bert"]["encoder"]["layer_1"]["output"]["bias"][2] = np.inf
  assert loader.nonfinite(params) == ["bert/encoder/layer_1/output/bias"]
  on_device = jax.tree.map(jax.numpy.asarray, params)
  assert loader.nonfinite(on_device) == ["bert/encoder/layer_1/output/bias"]


def test_encoder_part_keeps_the_head_fresh_and_refuses_another_encoder(tmp_path):
  """target="encoder": the checkpoint's encoder under `bert`, the head and a missing pooler
  fresh; an encoder of other sizes is refused naming the tensors."""
  train.train_and_evaluate(tu.tiny_config(num_train_steps=1), str(tmp_path / "run"))
  cfg, enc = loader.read(str(tmp_path / "run"), "encoder")
  enc = {k: v for k, v in enc.items() if k != "pooler"}
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  spec = lambda shape: jax.ShapeDtypeStruct(shape, np.float32, sharding=one)
  abstract = {"bert": jax.tree.map(lambda x: spec(x.shape), enc),
              "classifier": {"kernel": spec((64, 3))}}
  abstract["bert"]["pooler"] = {"kernel": spec((64, 64))}
  fresh = jax.tree.map(lambda a: np.full(a.shape, 7.0, a.dtype), abstract)
  out = loader.load_into((cfg, enc), abstract, fresh, target="encoder")
  np.testing.assert_array_equal(out["classifier"]["kernel"], fresh["classifier"]["kernel"])
  np.testing.assert_array_equal(out["bert"]["pooler"]["kernel"], fresh["bert"]["pooler"]["kernel"])
  for k, v in tu.flat(enc).items():
    np.testing.assert_array_equal(tu.flat(out["bert"])[k], v, err_msg=k)
  abstract["bert"]["embeddings"]["word_embeddings"]["embedding"] = spec((99, 64))
  with pytest.raises(formats.CheckpointMismatchError, match="word_embeddings/embedding: "
                     r"checkpoint \(128, 64\) vs model \(99, 64\)"):
    loader.load_into((cfg, enc), abstract, fresh, target="encoder")


def test_target_is_the_name_convert_uses_and_part_still_works(tmp_path):
  """read/load_into take `target` (convert's --target); `part`, the former name, still works."""
  train.train_and_evaluate(tu.tiny_config(num_train_steps=1), str(tmp_path / "run"))
  _, by_target = loader.read(str(tmp_path / "run"), target="encoder")
  _, by_part = loader.read(str(tmp_path / "run"), target="encoder")
  _, whole = loader.read(str(tmp_path / "run"))
  assert "encoder" in by_target and "bert" in whole
  assert tu.flat(by_target).keys() == tu.flat(by_part).keys() == tu.flat(whole["bert"]).keys()
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = {"bert": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, np.float32, sharding=one),
                                   by_target)}
  fresh = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), abstract)
  out = loader.load_into(str(tmp_path / "run"), abstract, fresh, target="encoder")
  for k, v in tu.flat(by_target).items():
    np.testing.assert_array_equal(tu.flat(out["bert"])[k], v, err_msg=k)
