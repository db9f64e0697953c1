# What the launchers share (sourced by launch/gpu.sh and launch/tpu.sh): errors, notes, and
# printing a command as a shell would read it back. The sourcing script sets LAUNCHER (its
# name, for errors) and DRY_RUN, and appends main's pass-through flags to PASS.

die() { echo "$LAUNCHER: error: $*" >&2; exit 2; }
note() { echo "# $*"; }

# Quote one word for a POSIX shell, only when it needs it (--flag=VALUE keeps
# the flag name outside the quotes: --command='...').
q() {
  local s=$1 safe='^[A-Za-z0-9_./:=@%+,-]+$' flag='^(--[A-Za-z0-9_.-]+=)(.*)$' dq_ok='^[^$`"\\!]*$'
  if [[ $s =~ $safe ]]; then
    printf '%s' "$s"
  elif [[ $s =~ $flag ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
    q "${BASH_REMATCH[2]}"
  elif [[ $s != *\'* ]]; then
    printf "'%s'" "$s"
  elif [[ $s =~ $dq_ok ]]; then
    printf '"%s"' "$s"
  else
    printf "'%s'" "${s//\'/\'\\\'\'}"
  fi
}

# Quote and join all arguments into one line.
join_q() {
  local out="" a
  for a in "$@"; do out+="${out:+ }$(q "$a")"; done
  printf '%s' "$out"
}

log_cmd() { echo "+ $(join_q "$@")"; }

# Print a command, then run it (not in --dry_run).
run() {
  log_cmd "$@"
  (( DRY_RUN )) && return 0
  "$@"
}

# The arguments after `--`: each goes to bert_jax.main (PASS), except --dry_run: a dry run
# stays a dry run wherever the flag stands (never start the real thing by a misplaced flag).
pass_through() {
  local arg
  for arg in "$@"; do
    if [[ $arg == --dry_run ]]; then DRY_RUN=1; else PASS+=("$arg"); fi
  done
}
