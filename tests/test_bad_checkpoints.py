"""Checkpoints, vocabularies and configs a user may hand over broken: each is one line
naming the file or field and what to do, exit 2, no traceback (issue: nothing silent, part
2, items 8, 14, 15 and 17). Before, NaN weights of a HuggingFace or exported checkpoint
were used (predict printed `(nan)`), and the rest were bare tracebacks."""
import json
import os
import shutil

import numpy as np
import pytest

from bert_jax import convert, formats, predict, train, workdir_lock
from common import errors
from tests import test_main_errors
from tests import test_train_utils as tu
from tests.test_checkpoint_inputs import checkpoints  # noqa: F401  pylint: disable=unused-import


@pytest.fixture(scope="module")
def hub_dir(checkpoints, tmp_path_factory):  # noqa: F811
  """The tiny model's HuggingFace directory with its vocab.txt, as the Hub ships it."""
  d = shutil.copytree(checkpoints / "hf", tmp_path_factory.mktemp("hub") / "hf")
  shutil.copy(checkpoints / "vocab.txt", d / "vocab.txt")
  return d


def _predict_error(capsys, checkpoint, *flags) -> str:
  with pytest.raises(SystemExit) as e:
    predict.main([f"--checkpoint={checkpoint}", "--text=the [MASK] sat"] + list(flags))
  err = capsys.readouterr().err
  assert e.value.code == 2 and "Traceback" not in err, err
  lines = [l for l in err.splitlines() if "error:" in l]
  assert len(lines) == 1, err
  return err


def _copy(hub_dir, tmp_path):
  return shutil.copytree(hub_dir, tmp_path / "hf")


def test_nan_weights_of_a_huggingface_or_exported_checkpoint_are_refused(hub_dir, tmp_path, capsys):
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  d = _copy(hub_dir, tmp_path)
  predict.main([f"--checkpoint={d}", "--text=the [MASK] sat"])
  assert "nan" not in capsys.readouterr().out
  state = load_file(d / "model.safetensors")
  state["bert.encoder.layer.1.output.dense.weight"][0, 0] = np.nan
  save_file(state, d / "model.safetensors", metadata={"format": "pt"})
  err = _predict_error(capsys, d)
  assert f"{d} holds NaN or infinite weights in 1 tensors" in err and "layer_1" in err, err
  convert.main([f"--input={hub_dir}", f"--output={tmp_path / 'export'}"])
  cfg, params = formats.read_native(str(tmp_path / "export"))
  params["bert"]["pooler"]["bias"][1] = np.inf
  formats.save_native(str(tmp_path / "export"), cfg, params)
  err = _predict_error(capsys, tmp_path / "export")
  assert "holds NaN or infinite weights" in err and "pooler" in err, err


@pytest.mark.parametrize("config_json,message", [
    ("{not json", "config.json is not JSON"),
    ('{"vocab_size": 40, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32}',
     "config.json lacks 'hidden_size'"),
    ("[1, 2]", "config.json holds a JSON list"),
])
def test_a_config_json_that_does_not_read_names_the_file(hub_dir, tmp_path, capsys, config_json, message):
  d = _copy(hub_dir, tmp_path)
  (d / "config.json").write_text(config_json)
  assert message in _predict_error(capsys, d)


@pytest.mark.parametrize("change,message", [
    ({"num_hidden_layers": 3}, "missing tensors"),
    ({"max_position_embeddings": 64}, "of the wrong shape"),
    ({"hidden_act": "swish7"}, "hidden_act 'swish7' unknown"),
    ({"num_attention_heads": 3}, "hidden_size 16 is not divisible by num_heads 3"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key' is not supported"),
])
def test_a_config_json_that_does_not_fit_the_weights_is_one_line(hub_dir, tmp_path, capsys, change, message):
  d = _copy(hub_dir, tmp_path)
  hf = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(json.dumps({**hf, **change}))
  assert message in _predict_error(capsys, d)


def test_weights_bert_jax_cannot_read_are_named(hub_dir, tmp_path, capsys):
  import torch  # pylint: disable=g-import-not-at-top
  d = _copy(hub_dir, tmp_path)
  (d / "model.safetensors").rename(d / "flax_model.msgpack")  # a Flax-only Hub directory
  err = _predict_error(capsys, d)
  assert "No model.safetensors or pytorch_model.bin" in err and "flax_model.msgpack" in err, err
  (d / "flax_model.msgpack").unlink()
  # Not a tensor: a reference to a function, which an unpickler would import (never done).
  torch.save({"bert.embeddings.word_embeddings.weight": torch.zeros(2), "hook": os.system},
             d / "pytorch_model.bin")
  err = _predict_error(capsys, d)
  assert "holds Python objects other than tensors" in err and "was not unpickled" in err, err
  assert "weights_only=False" not in err


def test_vocabularies_that_do_not_read_name_the_file_and_line(hub_dir, tmp_path, capsys):
  d = _copy(hub_dir, tmp_path)
  tokens = (d / "vocab.txt").read_bytes().split(b"\n")
  (d / "vocab.txt").write_bytes(b"\n".join(tokens[:7] + [b"caf\xe9"] + tokens[8:]))
  err = _predict_error(capsys, d)
  assert "vocab.txt:8: byte b'\\xe9' is not UTF-8" in err, err
  (d / "vocab.txt").write_bytes(b"\n".join(tokens[:7] + [tokens[6]] + tokens[8:]))
  err = _predict_error(capsys, d)
  assert f"lists 1 tokens twice ({tokens[6].decode()!r} on lines 7 and 8)" in err, err


@pytest.mark.parametrize("overrides,message", [
    ({"mesh_shape.data": 3}, "config.mesh_shape {'data': 3, 'fsdp': 1, 'tensor': 1} needs 3 devices but 1"),
    ({"data__max_seq_length": 64}, "--config.data.max_seq_length=64 exceeds the model's position table"),
    ({"model__hidden_act": "relu6"}, "hidden_act 'relu6' unknown"),
    ({"model__num_heads": 5}, "hidden_size 64 is not divisible by num_heads 5"),
])
def test_pretraining_configs_that_cannot_work_are_user_errors(tmp_path, overrides, message):
  config = tu.tiny_config(**{k: v for k, v in overrides.items() if "." not in k})
  for key, value in overrides.items():
    if "." in key:
      section, leaf = key.split(".")
      config[section][leaf] = value
  with pytest.raises(errors.UserError, match=message.replace("(", r"\(").replace("{", r"\{")):
    train.train_and_evaluate(config, str(tmp_path / "w"))


def test_a_workdir_that_cannot_be_used_is_one_line(tmp_path):
  (tmp_path / "afile").write_text("")
  for workdir in (tmp_path / "afile", tmp_path / "afile" / "below"):
    with pytest.raises(errors.UserError, match=r"cannot be used: it \(or a directory above it\) is "
                       "a file, not a directory"):
      with workdir_lock.hold(str(workdir)):
        pass
  out = tu.run(tu.main_args(tmp_path / "afile", model__hidden_act=None), check=False)
  assert "is a file, not a directory" in test_main_errors._one_line_error(out)  # pylint: disable=protected-access
  out = tu.run(tu.main_args(tmp_path / "w", **{"model.hidden_act": "relu6"}), check=False)
  assert "hidden_act 'relu6' unknown" in test_main_errors._one_line_error(out)  # pylint: disable=protected-access
