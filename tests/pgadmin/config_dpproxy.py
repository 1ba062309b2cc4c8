"""pgAdmin 4's configuration for the tests (tests/pgadmin_harness.py): desktop mode, headless.

pgAdmin reads it as its distribution config (``CONFIG_DISTRO_FILE_PATH``). Desktop mode logs
the one desktop user in without a password; everything pgAdmin writes (its SQLite storage,
sessions, log) goes under ``$DPPROXY_PGADMIN_DATA``, a throwaway directory of the test run.
"""

import os

DATA_DIR = os.environ["DPPROXY_PGADMIN_DATA"]
LOG_FILE = os.path.join(DATA_DIR, "pgadmin4.log")
SQLITE_PATH = os.path.join(DATA_DIR, "pgadmin4.db")
SESSION_DB_PATH = os.path.join(DATA_DIR, "sessions")
STORAGE_DIR = os.path.join(DATA_DIR, "storage")
AZURE_CREDENTIAL_CACHE_DIR = os.path.join(DATA_DIR, "azure")
KERBEROS_CCACHE_DIR = os.path.join(DATA_DIR, "kerberos")
SERVER_MODE = False
MASTER_PASSWORD_REQUIRED = False
UPGRADE_CHECK_ENABLED = False  # no network here
USE_OS_SECRET_STORAGE = False  # no keyring: passwords stay in pgAdmin's own store
DEFAULT_SERVER = "127.0.0.1"
DEFAULT_SERVER_PORT = int(os.environ.get("DPPROXY_PGADMIN_PORT", "5050"))
CONSOLE_LOG_LEVEL = 30
FILE_LOG_LEVEL = 20
