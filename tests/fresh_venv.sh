# Sourced by tests/superset/install.sh and tests/pgadmin/install.sh: fresh_venv DIR replaces DIR
# with a new venv of $PYTHON (python3 unless set) whose pip is current.
fresh_venv() {
  local venv="$1" python="${PYTHON:-python3}"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
}
