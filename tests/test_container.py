"""The Dockerfile and docker-compose.yml, checked without a Docker engine.

No engine runs here, so these pin what can be checked statically: the image is built from
this project's pyproject.toml with pip (the install the tests use), it copies every
package, runs as a non-root user, and its entry point, command and HEALTHCHECK are
commands the dpproxy CLI accepts; the compose file wires PostgreSQL, the one-shot loader
and dpproxy with healthchecks, completion ordering and shared volumes, and its commands
parse too. Where the docker compose CLI (v2 plugin or v1) exists, it validates the file.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml

from proxy.cli.main import _parser

ROOT = Path(__file__).resolve().parent.parent


def _instructions() -> list[tuple[str, str]]:
    """The Dockerfile as (INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            keyword, _, rest = pending.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
            pending = ""
    return instructions


def _stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage, from its FROM on (global ARGs are left out)."""
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in _instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def _exec_form(rest: str) -> list[str]:
    value = json.loads(rest)
    assert isinstance(value, list), f"exec form expected, got {rest}"
    return value


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _packages() -> set[str]:
    """The top-level packages the wheel holds (``proxy*`` takes proxy and its subpackages)."""
    return {pattern.rstrip("*") for pattern in _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]}


def _accepted_by_cli(argv: list[str]) -> None:
    assert argv[0] != "dpproxy" or argv[1:], argv
    _parser().parse_args(argv[1:] if argv[0] == "dpproxy" else argv)


def test_image_is_built_from_this_project_with_pip_in_two_slim_stages():
    build, runtime = _stages()
    assert build[0][1].startswith("${PYTHON_IMAGE}") and "AS build" in build[0][1]
    args = dict(rest.split("=", 1) for keyword, rest in _instructions() if keyword == "ARG")
    base = args["PYTHON_IMAGE"]
    assert base.startswith("python:") and "-slim" in base
    required = _pyproject()["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, base.split(":")[1].split("-")[0].split("."))) >= tuple(map(int, required.split(".")))

    copied = {source for keyword, rest in build if keyword == "COPY" for source in rest.split()[:-1]}
    assert {"pyproject.toml", "README.md", "LICENSE"} <= copied  # pyproject's readme and license-files
    assert _packages() <= copied

    runs = " ".join(rest for keyword, rest in build if keyword == "RUN")
    assert "pip wheel --wheel-dir /wheels ." in runs
    assert "pip install --no-index --find-links /wheels --prefix /install dpproxy" in runs
    assert ("COPY", "--from=build /install /usr/local") in runtime


def test_image_runs_dpproxy_as_a_non_root_user_with_a_healthcheck():
    runtime = dict(_stages()[1][1:])
    user = runtime["USER"].split(":")[0]
    assert user not in ("root", "0")
    assert f"--uid {user}" in runtime["RUN"]

    entrypoint = _exec_form(runtime["ENTRYPOINT"])
    assert entrypoint == ["dpproxy"] and "dpproxy" in _pyproject()["project"]["scripts"]
    command = _exec_form(runtime["CMD"])
    assert command == ["serve", "-c", "/etc/dpproxy/policy.yaml"]
    _accepted_by_cli(command)

    healthcheck = runtime["HEALTHCHECK"]
    assert "--interval=" in healthcheck and "--timeout=" in healthcheck
    probe = _exec_form(healthcheck.split("CMD", 1)[1].strip())
    assert probe[:2] == ["dpproxy", "health"]
    _accepted_by_cli(probe)
    assert set(runtime["EXPOSE"].split()) == {"6432", "9187"}


def test_dockerignore_sends_only_what_the_image_copies():
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "**"
    allowed = {line.lstrip("!").rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "LICENSE", *_packages()}


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_runs_postgres_then_the_loader_then_dpproxy():
    services = _compose()["services"]
    assert set(services) == {"postgres", "loader", "dpproxy"}
    postgres, loader, dpproxy = services["postgres"], services["loader"], services["dpproxy"]

    assert postgres["image"].startswith("postgres:")
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert loader["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert dpproxy["depends_on"] == {"loader": {"condition": "service_completed_successfully"}}
    assert loader["image"] == dpproxy["image"] and loader["build"] == dpproxy["build"] == "."
    assert loader["restart"] == "no"

    assert "127.0.0.1:6432:6432" in dpproxy["ports"]
    assert dpproxy["stop_grace_period"] == "40s"  # longer than the default shutdown_grace_s of 30 s


def test_compose_commands_are_accepted_by_the_cli_and_share_the_policy():
    services = _compose()["services"]
    loader, dpproxy = services["loader"]["command"], services["dpproxy"]["command"]
    _accepted_by_cli(loader)
    _accepted_by_cli(dpproxy)
    args = _parser().parse_args(loader)
    assert args.run.__name__ == "_demo_load"
    written, served = str(args.policy_out), dpproxy[dpproxy.index("-c") + 1]
    assert written == served == "/etc/dpproxy/policy.yaml"
    assert args.listen_host == "0.0.0.0" and args.port == 6432 and args.metrics_port == 9187
    assert args.service_password_env in services["loader"]["environment"]

    assert "policy:/etc/dpproxy" in services["loader"]["volumes"]
    assert "policy:/etc/dpproxy:ro" in services["dpproxy"]["volumes"]
    assert str(args.ledger).startswith("/var/lib/dpproxy/")
    assert "ledger:/var/lib/dpproxy" in services["dpproxy"]["volumes"]
    assert set(_compose()["volumes"]) == {"pgdata", "policy", "ledger"}
    # dpproxy reaches PostgreSQL as the service role, whose password the loader set.
    assert services["dpproxy"]["environment"]["PGPASSWORD"] == services["loader"]["environment"][args.service_password_env]


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_file_is_valid_for_the_compose_cli():
    cli = _compose_cli()
    assert cli is not None, "no Compose CLI: install Debian's docker-compose (./run-tests does)"
    result = subprocess.run([*cli, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{shlex.join(cli)} config: {result.stderr}"


def test_the_license_is_an_spdx_expression_so_installs_print_no_deprecation_wall():
    # `license = {text = ...}` made every `pip install -e .` (the README's first command, and each
    # ./run-tests) print setuptools' deprecation notice three times over.
    project = _pyproject()
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]  # the first to read an SPDX string


def test_the_apache_license_text_ships_in_the_repository_and_the_package():
    # pyproject.toml declared Apache-2.0 while the repository held no license text to go with it.
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert _pyproject()["project"]["license-files"] == ["LICENSE"]
