"""The ``options`` startup parameter (libpq's ``PGOPTIONS``, pgjdbc's ``options``), read as
PostgreSQL reads it: settings given as ``-c name=value`` or ``--name=value``.

PostgreSQL applies them as if each were a startup parameter of its own, below the startup
parameters the client names itself. dpproxy takes those it passes on from any startup
parameter (``connection.startup_settings``) and ``dpproxy.epsilon``; any other is refused with
a hint to SET it after connecting, where the statement's own rules apply, rather than dropped
without a word.
"""

from __future__ import annotations

from policies.errors import SQLSTATE, Refusal

__all__ = ["with_options"]


def with_options(params: dict[str, str], forwarded: frozenset[str]) -> dict[str, str]:
    """``params`` with the settings of its ``options`` added (a parameter named outright wins).

    ``forwarded`` are the lower-case names dpproxy takes from the startup packet. Raises
    Refusal for an argument that is not a setting, or for a setting dpproxy does not take there.
    """
    text = params.get("options")
    if not text:
        return params
    named = {name.lower() for name in params}
    merged = dict(params)
    for name, value in _settings(_split(text)):
        if name.lower() not in forwarded and name.lower() != "dpproxy.epsilon":
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f'setting "{name}" in the startup options is not passed through dpproxy',
                "From options, dpproxy takes " + ", ".join(sorted(forwarded)) + " and dpproxy.epsilon; "
                f"run SET {name} = ... after connecting instead.",
            )
        if name.lower() not in named:
            merged[name] = value
    return merged


def _split(text: str) -> list[str]:
    """``options`` split at whitespace, a backslash taking the next character as it is
    (PostgreSQL's pg_split_opts)."""
    words: list[str] = []
    current: list[str] = []
    started = escaped = False
    for character in text:
        if escaped:
            current.append(character)
            escaped = False
        elif character == "\\":
            started = escaped = True
        elif character.isspace():
            if started:
                words.append("".join(current))
                current, started = [], False
        else:
            current.append(character)
            started = True
    if started:
        words.append("".join(current))
    return words


def _settings(words: list[str]) -> list[tuple[str, str]]:
    """(name, value) of each ``-c name=value``, ``-cname=value`` or ``--name=value``; a dash in
    a name is an underscore, as PostgreSQL reads it."""
    settings = []
    position = 0
    while position < len(words):
        word = words[position]
        if word == "-c" and position + 1 < len(words):
            setting, position = words[position + 1], position + 2
        elif word.startswith("-c") and len(word) > 2:
            setting, position = word[2:], position + 1
        elif word.startswith("--") and len(word) > 2:
            setting, position = word[2:], position + 1
        else:
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f'invalid command-line argument in the startup options: "{word}"',
                "dpproxy reads settings from options, as -c name=value or --name=value.",
            )
        name, equals, value = setting.partition("=")
        if not equals or not name:
            raise Refusal(SQLSTATE.SYNTAX_ERROR, f'--{setting} requires a value',
                          "Give each setting in options as -c name=value.")
        settings.append((name.replace("-", "_"), value))
    return settings
