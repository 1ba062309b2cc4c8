"""What a client is told at startup: the ParameterStatus messages, also for the first client."""

from __future__ import annotations

import psycopg

from tests.conftest import running_proxy


def test_the_first_client_of_its_kind_is_told_the_reported_parameters(test_db, tmp_path_factory) -> None:
    """A fresh server's first session (no startup report learnt yet) gets every ParameterStatus
    a later one gets: psycopg2 refuses a server that reports no client_encoding."""
    with running_proxy(test_db, tmp_path_factory) as fresh:
        with psycopg.connect(fresh.dsn() + " sslmode=disable", autocommit=True) as first:
            told = {name: first.info.parameter_status(name) for name in ("client_encoding", "server_version")}
        with psycopg.connect(fresh.dsn() + " sslmode=disable", autocommit=True) as second:
            again = {name: second.info.parameter_status(name) for name in ("client_encoding", "server_version")}
    assert told == again and told["client_encoding"] == "UTF8" and told["server_version"]
