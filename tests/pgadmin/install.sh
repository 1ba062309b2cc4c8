#!/usr/bin/env bash
# Install pgAdmin 4 (pinned) into its own venv for tests/test_client_pgadmin.py; idempotent.
#
# Where: $DPPROXY_PGADMIN_VENV, else ~/.cache/dpproxy/pgadmin4-9.18 (shared by every clone and
# worktree on the machine; pgAdmin's Flask stack pins versions of its own, SQLAlchemy and
# psycopg among them, that dpproxy's venv must not be tied to). A venv whose marker matches
# the constraints file is left as it is. All wheels: needs nothing but python3-venv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${DPPROXY_PGADMIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dpproxy/pgadmin4-9.18}"
constraints="$here/constraints.txt"
marker="$venv/.dpproxy-constraints"

if [ -x "$venv/bin/pgadmin4" ] && cmp -s "$constraints" "$marker"; then
  echo "pgadmin: $venv is up to date"
  exit 0
fi
# shellcheck source=../fresh_venv.sh
. "$here/../fresh_venv.sh"
fresh_venv "$venv"
"$venv/bin/python" -m pip install -q -c "$constraints" pgadmin4==9.18
"$venv/bin/python" -c "import psycopg; import pgadmin4"
cp "$constraints" "$marker"
echo "pgadmin: installed in $venv"
