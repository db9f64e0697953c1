"""Errors a user can fix from the message alone, and how entry points report them.

An entry point wrapped in `reported` prints such an error as one line (`PROG: error: ...`,
no traceback) and exits with status 2; every other exception keeps its traceback.
"""
import functools
import os
import sys


class UserError(Exception):
  """Bad input or a missing install: the message names the problem and what to do."""


class ConfigError(UserError, ValueError):
  """A config value that cannot work: the message names the field and a value that does."""


class MissingDependencyError(UserError, ImportError):
  """A package that this path or feature needs is not installed."""


class EmptyCorpusError(UserError, ValueError):
  """A corpus that holds no text to tokenize: the message names the input."""


class PathError(UserError, FileNotFoundError):
  """A path the user gave that is missing, or of the wrong kind (a directory where a file is
  expected, a file where a directory goes): the message names it and what to give."""


def reported(main):
  """Decorates a CLI `main`: a UserError becomes one line on stderr and exit status 2."""

  @functools.wraps(main)
  def wrapper(*args, **kwargs):
    try:
      return main(*args, **kwargs)
    except UserError as e:
      prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "bert_jax"
      print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
      sys.exit(2)

  return wrapper


# ----------------------------------------------------------------------------
# Command lines: every entry point parses absl flags (`--flag=value`, `--[no]bool`) the same
# way. The main job uses the global FLAGS (with jax's and absl's own); the tools (predict,
# convert, input_pipeline.*) define their flags in private FlagValues, so importing them adds
# no global flags and their `main(argv)` can be called in-process.

HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull")


def parse_flags(fv, argv: list[str], usage: str | None = None) -> list[str]:
  """Parses `argv` (program name first) into the absl FlagValues `fv`. `--help` (also -h,
  -?, --helpshort; --helpfull lists every library's flags for the global FLAGS) prints
  `usage` and the flags, then exits 0; an unknown or malformed flag, a misspelt
  `--config.` override, a config file that does not load, or a stray argument is a
  UserError naming it."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  asked = [a for a in argv[1:] if a in HELP_FLAGS or a.startswith("--help=")]
  if asked:
    if fv is flags.FLAGS:
      app.usage(shorthelp=asked[0] != "--helpfull", writeto_stdout=True)
    else:  # absl's help lists flags under their module's file name: the flags alone here.
      listing = [l for l in fv.get_help(include_special_flags=False).splitlines()
                 if l.startswith(" ")]
      print((usage or "").strip() + "\n\nFlags:\n" + "\n".join(listing))
    raise SystemExit(0)
  try:
    rest = fv(argv)
    if "config" in fv and fv["config"].present:
      fv["config"].value.keys()  # config files load lazily: fail here, not mid-run
  except flags.UnrecognizedFlagError as e:
    if e.flagname.startswith("config.") and "config" in fv and fv["config"].present:
      raise UserError(_unknown_config_field(fv["config"].value, e.flagname)) from e
    raise UserError(f"{e} (see --help)") from e
  except flags.Error as e:
    raise UserError(f"{e} (see --help)") from e
  except OSError as e:  # a --config file that does not load
    given = [a for a in argv[1:] if a.startswith("--config=")]
    raise UserError(f"{given[0] if given else '--config'}: cannot load the config file: "
                    f"{str(e).strip().splitlines()[-1].strip()}") from e
  except (AttributeError, KeyError, TypeError, ValueError) as e:  # --config.x.y=... overrides
    while e.args and isinstance(e.args[0], BaseException):  # ml_collections nests them
      e = e.args[0]
    text = str(e.args[0]) if e.args else str(e)
    lines = [l.strip().strip("'\"") for l in text.strip("'\"").split("\n") if l.strip()]
    overrides = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")
                 and lines and lines[0] in a.split("=")[0].split(".")[1:]]
    lead = (f"{overrides[0]}: the config has no field {lines[0]!r}" if overrides
            else f"bad config override: {lines[0] if lines else e!r}")
    raise UserError(" ".join([lead + "."] + lines[1:])) from e
  if len(rest) > 1 and fv is not flags.FLAGS:
    raise UserError(f"Unexpected arguments {rest[1:]}: every option is a --flag=value "
                    "(see --help).")
  return rest


def _unknown_config_field(config, flagname: str) -> str:
  """`--config.a.b=...` naming no field: the message, with the closest field's name."""
  import difflib  # pylint: disable=g-import-not-at-top
  *parents, leaf = flagname.split(".")[1:]
  node = config
  for name in parents:
    node = node.get(name) if hasattr(node, "get") else None
  message = f"--{flagname}: the config has no field {leaf!r}."
  close = difflib.get_close_matches(leaf, list(node.keys()), n=1) if hasattr(
      node, "keys") else []
  return message + (f' Did you mean "{close[0]}" instead of "{leaf}"?' if close else "")


def require_flags(fv, *names: str) -> None:
  missing = [n for n in names if fv[n].value in (None, "")]
  if missing:
    raise UserError(f"Missing required flags: {', '.join('--' + m for m in missing)} "
                    "(see --help).")


def _fail(message: str) -> None:
  prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "bert_jax"
  print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def run(main) -> None:
  """The main job: `absl.app.run(main)` parsing the global FLAGS with `parse_flags`
  (decorate `main` with `reported`)."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top

  def parser(argv):
    try:
      return parse_flags(flags.FLAGS, argv)
    except UserError as e:
      _fail(str(e))
  app.run(main, flags_parser=parser)


def run_tool(main) -> None:
  """`python -m TOOL` for a tool with private FlagValues: INFO logs on stderr, and a
  UserError as one line `TOOL: error: ...` with exit status 2 (no traceback)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  flags.FLAGS(sys.argv[:1])  # absl logging reads the global flags: their defaults
  logging.use_absl_handler()
  logging.set_verbosity(logging.INFO)
  reported(main)(sys.argv)
