"""bench/accel/gpu_step.py and kernel_trace's kernel summary: what CPU can check of the GPU tools."""
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from bench.accel import gpu_step
from bench import harness
from bench.accel import kernel_trace
from tests import test_train_utils as tu


def _hlo(fn, *args):
  return jax.jit(fn).lower(*args).compile().as_text()


def test_hlo_categories_name_what_each_kernel_does():
  def step(w, x, ids):
    def loss(w):
      h = x @ w  # a projection: matmul
      s = jnp.einsum("bld,bmd->blm", h, h)  # batched: attention's scores
      g = jnp.take(h, ids, axis=1)  # gather
      return jnp.sum(jax.nn.softmax(s)) + jnp.sum(g ** 2)
    grad = jax.grad(loss)(w)
    return w - 0.1 * grad / (jnp.sqrt(jnp.sum(grad ** 2)) + 1.0)  # the update: optimizer

  w, x = jnp.ones((16, 16)), jnp.ones((2, 8, 16))
  cats = kernel_trace.hlo_categories(_hlo(step, w, x, jnp.arange(4)))
  found = set(cats.values())
  assert {"matmuls", "attention", "gather/scatter", "optimizer"} <= found, cats
  assert found <= set(kernel_trace.CATEGORIES)
  moves = kernel_trace.hlo_categories(_hlo(lambda a: a.T.copy() * 1.0 + 0.0, jnp.ones((64, 32))))
  assert "optimizer" in moves.values() or "copies/transposes" in moves.values()


def test_kernel_summary_shares_and_order():
  events = [dict(name="gemm_a", hlo_op="f.1", dur=3000.0), dict(name="gemm_a", hlo_op="f.1", dur=3000.0),
            dict(name="fusion_b", hlo_op="f.2", dur=1000.0), dict(name="fusion_b", hlo_op="f.2", dur=1000.0),
            dict(name="mystery", hlo_op="f.9", dur=200.0)]
  out = kernel_trace.kernel_summary(events, {"f.1": "matmuls", "f.2": "optimizer"}, steps=2,
                                    step_s=0.005)
  lines = out.splitlines()
  assert "kernels 4.10 ms a step (82.0%" in lines[0]
  assert any(l.startswith("matmuls") and "60.0%" in l for l in lines)
  assert any(l.startswith("optimizer") and "20.0%" in l for l in lines)
  assert any(l.startswith("other") for l in lines)
  kernels = [l.split()[0] for l in lines[lines.index(next(l for l in lines if l.startswith("kernel"))) + 1:]]
  assert kernels == ["gemm_a", "fusion_b", "mystery"]


def test_kernels_name_the_model_code_they_run():
  """hlo_sources: a fusion's op_name path (layer numbers folded, forward/backward/update) and
  the project's file:line; GPU kernel names ('.' as '_') find their fusion."""
  def step(w, x):
    def loss(w):
      with jax.named_scope("encoder"), jax.named_scope("layer_3"):
        h = jnp.tanh(x @ w)
      return jnp.sum(h ** 2)
    return w - 0.1 * jax.grad(loss)(w)

  hlo = _hlo(step, jnp.ones((16, 16)), jnp.ones((8, 16)))
  sources = kernel_trace.hlo_sources(hlo)
  wheres = set(sources.values())
  assert any(w.startswith("fwd encoder/layer_*/") and "test_bench_gpu.py:" in w for w in wheres), wheres
  assert any(w.startswith("bwd encoder/layer_*/") for w in wheres), wheres
  name, where = next((n, w) for n, w in sources.items() if "fusion" in n or n.startswith("dot"))
  kernel = name.replace(".", "_")
  events = [dict(name=kernel, hlo_op="", dur=1000.0)]
  out = kernel_trace.kernel_summary(events, kernel_trace.hlo_categories(hlo), steps=1,
                                    step_s=0.002, sources=sources)
  assert f"{where}" in out and "50.0%" in out, out
  assert kernel_trace.source_of(
      "jit(s)/transpose(jvp(M))/bert/encoder/layer_11/attention/dot_general") == (
          "bwd bert/encoder/layer_*/attention/dot_general")


def test_device_kernels_without_an_hlo_op_are_named_by_their_kernel_names():
  """GPU traces name kernels (cuBLAS, cuDNN, XLA fusions); where an event carries no HLO op
  its name decides its category."""
  names = {"sm90_xmma_gemm_bf16bf16_bf16f32_f32": "matmuls", "nvjet_hsh_128x256_64x4": "matmuls",
           "cudnn_generated_fort_native_sdpa_sm90_flash_fprop": "attention",
           "loop_add_fusion": "elementwise/fusions", "input_scatter_fusion": "gather/scatter",
           "Memcpy DtoD": "copies/transposes", "redzone_checker": "other"}
  got = {n: kernel_trace._category(dict(name=n, hlo_op="", dur=1.0), {}) for n in names}  # pylint: disable=protected-access
  assert got == names
  # The HLO's word wins where the event names an op.
  assert kernel_trace._category(dict(name="loop_add_fusion", hlo_op="f.3", dur=1.0),  # pylint: disable=protected-access
                                {"f.3": "optimizer"}) == "optimizer"


def test_variants_parse_config_fields_and_xla_flags():
  v = gpu_step.parse_variants(
      "cudnn:model.attention_impl=cudnn,model.attention_dropout_rate=0; "
      "nocublas:xla=--xla_gpu_enable_triton_gemm=false,xla=--xla_gpu_autotune_level=0")
  assert v == [("cudnn", {"model.attention_impl": "cudnn", "model.attention_dropout_rate": 0}, ""),
               ("nocublas", {}, "--xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0")]


def test_only_picks_rows_in_its_order_and_refuses_unknown_systems():
  args = gpu_step._parser().parse_args(  # pylint: disable=protected-access
      ["--only=modern-packed:bert_jax[flash],bert-base-128:eager", "--variants=flash:model.x=1"])
  systems = [("bert_jax", {}, ""), ("eager", {}, ""), ("bert_jax[flash]", {"model.x": 1}, "")]
  assert gpu_step._plan(args, [], systems, 0) == [  # pylint: disable=protected-access
      ("modern-packed", "bert_jax[flash]", {"model.x": 1}, ""), ("bert-base-128", "eager", {}, "")]
  args.only = ""
  assert [(w, s) for w, s, _, _ in gpu_step._plan(args, ["a", "b"], systems[:2], 0)] == [  # pylint: disable=protected-access
      ("a", "bert_jax"), ("a", "eager"), ("b", "eager"), ("b", "bert_jax")]
  with pytest.raises(SystemExit):
    gpu_step.main(["--only=bert-base-128:bert_jax[cudnn]"])


def test_variants_set_jax_options_beside_config_fields():
  """`jax.NAME=value` in a variant is a jax.config option, set before the row traces (here:
  threefry lowered to its CUDA kernel, seen in a program lowered for CUDA); the other fields
  still reach the config."""
  (_, overrides, _), = gpu_step.parse_variants(
      "threefry:jax.jax_threefry_gpu_kernel_lowering=True,bert.model.attention_impl=xla")
  spec = gpu_step.workload_spec("bert-base-128", "float32", True, overrides)
  config, _, _, _ = gpu_step.bert_jax_workload(spec)
  assert config.model.attention_impl == "xla"
  draw = jax.jit(lambda k: jax.random.normal(k, (8,)))
  cuda = lambda: draw.trace(jax.random.key(0)).lower(lowering_platforms=("cuda",)).as_text()
  assert "threefry2x32_ffi" not in cuda()
  try:
    gpu_step.jax_options(spec)
    assert "threefry2x32_ffi" in cuda()
  finally:
    jax.config.update("jax_threefry_gpu_kernel_lowering", False)


def test_rows_end_by_the_deadline_and_the_json_holds_each_row_as_it_ends(tmp_path, monkeypatch):
  """A caller's own timeout must not lose rows: each child's timeout is cut to --deadline_s,
  a row with under 30 s left is not run, and --json is rewritten after every row."""
  clock, calls = [0.0], []

  def fake_child(spec, timeout, flags="", log=""):
    calls.append((spec["system"], timeout, log))
    clock[0] += 50.0
    saved = json.loads((tmp_path / "rows.json").read_text())["rows"] if calls[1:] else []
    assert len(saved) == len(calls) - 1  # the rows before this one are already on disk
    return dict(step_s=0.1)

  monkeypatch.setattr(gpu_step, "run_child", fake_child)
  monkeypatch.setattr(gpu_step.time, "perf_counter", lambda: clock[0])
  args = gpu_step._parser().parse_args(  # pylint: disable=protected-access
      ["--only=bert-base-128:bert_jax,bert-base-128:bert_jax[x],bert-base-128:compile",
       "--child_timeout_s=70", "--deadline_s=110", "--budget_s=1000", "--variants=x:model.y=1",
       f"--json={tmp_path / 'rows.json'}", f"--logs={tmp_path / 'logs'}"])
  systems = [("bert_jax", {}, ""), ("bert_jax[x]", {"model.y": 1}, ""), ("compile", {}, "")]
  rows = gpu_step._run_rows(args, ["bert-base-128"], systems, 0.0)  # pylint: disable=protected-access
  # At 0 s: the child's own 70 s; at 50 s: the 60 s left; at 100 s: 10 s left, not run.
  assert [(c[0], c[1]) for c in calls] == [("bert_jax", 70), ("bert_jax", 60)]
  assert calls[1][2] == str(tmp_path / "logs" / "01_bert-base-128_bert_jax-x.log")  # plain names
  assert rows[2]["error"] == "deadline: 10 s left of 110" and "error" not in rows[1]
  assert len(json.loads((tmp_path / "rows.json").read_text())["rows"]) == 3
  args.budget_s = 40  # and --budget_s still stops rows from starting
  clock[0], calls[:] = 0.0, []
  (tmp_path / "rows.json").unlink()
  assert [r.get("error") for r in gpu_step._run_rows(args, ["bert-base-128"], systems, 0.0)] == [  # pylint: disable=protected-access
      None, "budget of 40 s spent", "budget of 40 s spent"]


def test_a_child_that_fails_or_times_out_keeps_its_output(tmp_path, monkeypatch):
  def timeout(cmd, **kw):
    raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"compiling...", stderr=b"E0001 slow")

  monkeypatch.setattr(harness.subprocess, "run", timeout)
  log = tmp_path / "rows" / "00_x.log"
  row = gpu_step.run_child(dict(system="bert_jax"), 12.0, "--xla_flag=1", str(log))
  assert row == dict(error="timed out after 12 s")
  text = log.read_text()
  assert "compiling..." in text and "E0001 slow" in text and "--xla_flag=1" in text
  failed = lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "started\n", "a\nb\nc\nTriton: boom\n")
  monkeypatch.setattr(harness.subprocess, "run", failed)
  row = gpu_step.run_child(dict(system="bert_jax"), 12.0, "", str(log))
  assert row == dict(error="exit 1: b | c | Triton: boom")
  assert "started" in log.read_text() and "Triton: boom" in log.read_text()


def test_gpu_step_imports_no_tensorflow():
  out = subprocess.run(tu.without_tensorflow([sys.executable, "-m", "bench.accel.gpu_step", "--help"]),
                       cwd=tu.REPO, env=tu.env(), capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and "torch.compile" in out.stdout, out.stderr[-2000:]


@pytest.mark.slow
def test_gpu_step_smoke_on_cpu(tmp_path):
  """Both families, bert_jax and transformers eager, a variant with a config override and an
  XLA flag, each in its own process where TensorFlow cannot be imported; the rows land in
  --json."""
  out = tmp_path / "rows.json"
  code = ("import sys\nfor m in ('tensorflow', 'tensorflow_datasets', 'clu'): sys.modules[m] = None\n"
          "from bench.accel import gpu_step\n"
          f"gpu_step.main(['--smoke', '--workloads=bert-base-128,modern-packed', "
          f"'--systems=bert_jax,eager', '--json={out}', "
          "'--variants=xla:bert.model.attention_impl=xla,modern.model.attention=dense,"
          "xla=--xla_cpu_use_thunk_runtime=true'])")
  proc = subprocess.run([sys.executable, "-c", code], cwd=tu.REPO, env=tu.env(), capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(out.read_text())["rows"]
  assert {(r["workload"], r["system"]) for r in rows} == {
      (w, s) for w in ("bert-base-128", "modern-packed") for s in ("bert_jax", "eager", "bert_jax[xla]")}
  bad = [r for r in rows if "error" in r]
  assert not bad, bad
  for r in rows:
    assert r["step_s"] > 0 and r["first_s"] > 0 and r["tokens"] > 0 and r["flops"] > 0
    assert r["synced_s"] > 0, r
    if r["system"].startswith("bert_jax"):  # the step compiles beside initialisation
      assert 0 < r["imports_s"] < r["setup_s"] < r["first_s"], r
      assert 0 < r["init_compile_s"] < r["init_s"], r
      assert 0 < r["compile_s"] < r["first_s"] - r["imports_s"], r
  assert "| bert-base-128 | bert_jax |" in proc.stdout


@pytest.mark.slow
def test_profile_step_trace_summary_on_cpu(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "bench.accel.profile_step", "--preset=tiny", "--batch=2", "--seq_len=32",
       f"--trace={tmp_path}", "--trace_steps=2"], cwd=tu.REPO, capture_output=True, text=True,
      timeout=600, env=tu.env(XLA_FLAGS="--xla_cpu_enable_xprof_traceme=true"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "matmuls" in proc.stdout and "share of step" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_profile_step_traces_gpu_step_workloads_on_cpu(tmp_path):
  """--workload profiles gpu_step's row (ModernBERT on packed rows here, an override
  applied): its kernels come from ModernBERT's code, and its tokens/s is printed."""
  proc = subprocess.run(
      [sys.executable, "-m", "bench.accel.profile_step", "--workload=modern-packed", "--smoke",
       "--overrides=modern.model.attention=dense,bert.model.attention_impl=cudnn",
       f"--trace={tmp_path}", "--trace_steps=2"], cwd=tu.REPO, capture_output=True, text=True,
      timeout=600, env=tu.env(XLA_FLAGS="--xla_cpu_enable_xprof_traceme=true"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "modern-packed (smoke), float32 on cpu: " in proc.stdout, proc.stdout
  assert "k tokens/s" in proc.stdout and "share of step" in proc.stdout, proc.stdout
  assert "(modern_attention.py:" in proc.stdout and "(bert.py:" not in proc.stdout, proc.stdout
  assert (tmp_path / "step.hlo.txt.gz").exists()
  refused = subprocess.run([sys.executable, "-m", "bench.accel.profile_step", "--workload=modern-full"],
                           cwd=tu.REPO, capture_output=True, text=True, timeout=120, env=tu.env())
  assert refused.returncode != 0 and "give --trace" in refused.stderr, refused.stderr[-2000:]


@pytest.mark.slow
def test_profile_step_times_config_variants_beside_the_step():
  proc = subprocess.run(
      [sys.executable, "-m", "bench.accel.profile_step", "--preset=tiny", "--batch=2", "--seq_len=32",
       "--rounds=1", "--model_variants=attention:remat=attention;dots:remat=dots"],
      cwd=tu.REPO, capture_output=True, text=True, timeout=600, env=tu.env())
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [line.split()[:2] for line in proc.stdout.splitlines() if line.startswith("step (")]
  assert rows == [["step", "(this"], ["step", "(attention)"], ["step", "(dots)"]], proc.stdout
