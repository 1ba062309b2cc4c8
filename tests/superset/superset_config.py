"""Superset's configuration for dpproxy's tests and screenshot script (not for production).

Read by Superset through ``SUPERSET_CONFIG_PATH``. The metadata database is a SQLite file
named by ``DPPROXY_SUPERSET_METADATA``; the secret key is fixed so that a metadata database
initialised once (the template tests/superset/install.sh leaves in the venv) opens under
every later run.
"""

import os

SECRET_KEY = "dpproxy-tests-only-this-is-not-a-secret-key"
SQLALCHEMY_DATABASE_URI = "sqlite:///" + os.environ["DPPROXY_SUPERSET_METADATA"]
SQLALCHEMY_EXAMPLES_URI = SQLALCHEMY_DATABASE_URI
# The suite talks to Superset's REST API only (login token + CSRF token): no rate limits, no
# HTTPS redirects, no cache that could answer a chart without asking dpproxy.
RATELIMIT_ENABLED = False
AUTH_RATE_LIMITED = False
TALISMAN_ENABLED = False
CONTENT_SECURITY_POLICY_WARNING = False
DATA_CACHE_CONFIG = {"CACHE_TYPE": "NullCache"}
CACHE_CONFIG = {"CACHE_TYPE": "NullCache"}
FILTER_STATE_CACHE_CONFIG = {"CACHE_TYPE": "SimpleCache"}
EXPLORE_FORM_DATA_CACHE_CONFIG = {"CACHE_TYPE": "SimpleCache"}
THUMBNAILS = False
PREVENT_UNSAFE_DB_CONNECTIONS = False
SUPERSET_WEBSERVER_TIMEOUT = 60
SQLLAB_TIMEOUT = 60
# Headless screenshots load the dashboard page without a login form in between.
WTF_CSRF_TIME_LIMIT = None

# tools/superset_screenshot.py: headless Chromium opens the dashboard without logging in, so
# the anonymous (Public) role gets Admin's permissions — on 127.0.0.1, for one screenshot.
if os.environ.get("DPPROXY_SUPERSET_PUBLIC") == "1":
    PUBLIC_ROLE_LIKE = "Admin"
