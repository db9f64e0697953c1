"""bench/harness.py: the child-process protocol, the results file of each group, the section."""
import ast
import pathlib
import sys

import pytest

from bench import harness

BENCH = pathlib.Path(harness.BENCH)


def test_a_child_result_line_is_parsed_and_a_failure_says_why(tmp_path):
  emit = "from bench import harness; harness.emit({'x': 1.5})"
  env = harness.child_env(harness.REPO)
  assert harness.run_child([sys.executable, "-c", emit], env=env) == {"x": 1.5}
  assert harness.run_child([sys.executable, "-c", "print(7)"], mark="") == 7
  boom = "import sys; print('a'); print('b', file=sys.stderr); raise ValueError('boom')"
  with pytest.raises(harness.ChildError) as e:
    harness.run_child([sys.executable, "-c", boom])
  assert e.value.summary == "exit 1: ValueError: boom" and "Traceback" in str(e.value)
  row = harness.child_row([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.5,
                          log=str(tmp_path / "x.log"), log_header="spec\n")
  assert row == {"error": "timed out after 0 s"}
  assert (tmp_path / "x.log").read_text().startswith("spec\n--- stdout")
  ok = harness.child_row([sys.executable, "-c", emit], env=env, wall=True)
  assert ok["x"] == 1.5 and ok["wall_s"] > 0


def test_every_benchmark_writes_to_its_groups_results_file():
  """Each module under bench/GROUP/ that records a section resolves to
  bench/results/GROUP.md, which exists and the index links."""
  index = (BENCH / "RESULTS.md").read_text()
  writers = 0
  for path in sorted(BENCH.glob("*/*.py")):
    module = f"bench.{path.parent.name}.{path.stem}"
    target = harness.results_file(module)
    assert target == BENCH / "results" / f"{path.parent.name}.md" and target.exists(), module
    assert f"(results/{path.parent.name}.md)" in index
    text = path.read_text()
    assert "open(RESULTS" not in text and "RESULTS.open" not in text, module
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr in ("record", "append", "publish")
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "harness"]
    writers += bool(calls)
  assert writers >= 20, writers
  with pytest.raises(ValueError, match="not a benchmark of a group"):
    harness.results_file("bench.train_step")


def test_a_section_has_the_title_date_command_machine_and_body():
  text = harness.section("Train step", "| a |\n", command="python -m bench.peers.train_step ",
                         machine="2 cores", date="2026-12-05")
  assert text == ("\n## Train step (2026-12-05)\n\nCommand: `python -m bench.peers.train_step`  \n"
                  "Machine: 2 cores\n\n| a |\n")
  assert harness.command("bench.accel.aot_tpu", ["--smoke"]) == "python -m bench.accel.aot_tpu --smoke"


def test_every_bench_import_names_a_module_that_exists():
  """Imports of bench modules anywhere in bench/ and tests/ (inside functions too, and in the
  code strings a benchmark runs in a child: `from bench[.group] import name`) name modules
  that exist: the grouping moved every benchmark, and a function-local import is found only
  when it runs."""
  import re  # pylint: disable=g-import-not-at-top
  repo = pathlib.Path(harness.REPO)
  modules = {".".join(p.relative_to(repo).with_suffix("").parts) for p in BENCH.rglob("*.py")}
  modules |= {"bench." + p.name for p in BENCH.iterdir()
              if p.is_dir() and (p / "__init__.py").exists()}
  pattern = re.compile(r"\bfrom (bench(?:\.\w+)*) import (\w+)|\bimport (bench(?:\.\w+)+)")
  stale = []
  for path in sorted(list(BENCH.rglob("*.py")) + list((repo / "tests").glob("*.py"))):
    for i, line in enumerate(path.read_text().splitlines(), 1):
      for m in pattern.finditer(line):
        name = f"{m.group(1)}.{m.group(2)}" if m.group(1) else m.group(3)
        if name not in modules and (m.group(1) or "") not in modules - {"bench"}:
          stale.append(f"{path.relative_to(repo)}:{i}: {line.strip()}")
  assert not stale, "\n".join(stale)
