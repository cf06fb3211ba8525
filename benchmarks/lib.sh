# Sourced by the benchmark scripts: their --help, and the prerequisites checked before any
# run starts (a missing one was a "command not found" minutes in, or a cryptic cp error).

# SCRIPT ARGS...: with -h or --help among ARGS, print SCRIPT's opening comment (its usage)
# and exit 0, before anything runs.
help_if_asked() {
  local script=$1 arg
  shift
  for arg in "$@"; do
    case "$arg" in
      -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$script"; exit 0 ;;
    esac
  done
}

# MESSAGE: one line on stderr, the script's name first, and exit 2.
fail() {
  echo "$(basename "$0"): $*" >&2
  exit 2
}

# The scratchgpt command must be on PATH.
need_scratchgpt() {
  command -v scratchgpt >/dev/null ||
    fail "scratchgpt is not on PATH: activate the virtualenv it is installed in" \
      "(. .venv/bin/activate) or install it (pip install -e .)"
}

# PYTHON: that interpreter must import scratchgpt.
need_python_scratchgpt() {
  "$1" -c "import scratchgpt" 2>/dev/null ||
    fail "$1 cannot import scratchgpt: set PYTHON to the interpreter it is installed in" \
      "(PYTHON=.venv/bin/python)"
}

# DIR: a karpathy/nanoGPT checkout (its train.py and Shakespeare's prepare.py).
need_nanogpt() {
  [ -f "$1/train.py" ] && [ -f "$1/data/shakespeare_char/prepare.py" ] ||
    fail "$1 is no nanoGPT checkout (no train.py and data/shakespeare_char/prepare.py" \
      "there): git clone https://github.com/karpathy/nanoGPT"
}

# FILE: a corpus the script reads from $SCRATCHGPT_DATA_DIR.
need_corpus() {
  [ -f "$SCRATCHGPT_DATA_DIR/$1" ] ||
    fail "no $1 in SCRATCHGPT_DATA_DIR ($SCRATCHGPT_DATA_DIR): set SCRATCHGPT_DATA_DIR" \
      "to the folder that holds it"
}
