#!/usr/bin/env bash
# Install Apache Superset (pinned) into its own venv for tests/test_superset.py; idempotent.
#
# Where: $DPPROXY_SUPERSET_VENV, else ~/.cache/dpproxy/superset-6.1.0 (shared by every
# clone and worktree on the machine; Superset's ~150 packages would clash with dpproxy's own
# in one venv: it needs SQLAlchemy 1.4, dpproxy 2.x). A venv whose marker matches the
# constraints file is left as it is.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${DPPROXY_SUPERSET_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dpproxy/superset-6.1.0}"
constraints="$here/constraints.txt"
marker="$venv/.dpproxy-constraints"

if [ -x "$venv/bin/superset" ] && [ -f "$venv/metadata-template.db" ] && cmp -s "$constraints" "$marker"; then
  echo "superset: $venv is up to date"
  exit 0
fi
# shellcheck source=../fresh_venv.sh
. "$here/../fresh_venv.sh"
fresh_venv "$venv"
# rich (the `superset` CLI) and cachetools (the PostgreSQL engine spec, through aws_iam) are
# imported but not declared; flask-caching: 2.5 breaks Superset's
# memoize (both pinned in the constraints file).
"$venv/bin/python" -m pip install -q -c "$constraints" apache-superset==6.1.0 psycopg2-binary rich cachetools flask-caching
"$venv/bin/python" -c "import superset, psycopg2"

# A metadata database initialised once (migrations, admin/admin, roles: ~20 s), which every
# test run copies instead of initialising its own.
template="$venv/metadata-template.db"
rm -f "$template"
export SUPERSET_CONFIG_PATH="$here/superset_config.py" DPPROXY_SUPERSET_METADATA="$template" FLASK_APP=superset
unset PYTHONPATH
(cd "$venv" \
  && "$venv/bin/superset" db upgrade \
  && "$venv/bin/superset" fab create-admin --username admin --firstname Ada --lastname Admin \
       --email admin@example.invalid --password admin \
  && "$venv/bin/superset" init) > "$venv/init.log" 2>&1 || { tail -30 "$venv/init.log"; exit 1; }
cp "$constraints" "$marker"
echo "superset: installed in $venv"
