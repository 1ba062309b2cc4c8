"""The ``options`` startup parameter (libpq's ``PGOPTIONS``, pgjdbc's ``options``), read as
PostgreSQL reads it: settings given as ``-c name=value`` or ``--name=value``.

PostgreSQL applies them as if each were a startup parameter of its own, below the startup
parameters the client names itself. dpproxy takes those it passes on from any startup
parameter (``connection.startup_settings``) and ``dpproxy.epsilon``. Any other is not applied,
and the session is told so in a WARNING (rather than refused: clients put settings there
that dpproxy sets itself, such as ``statement_timeout``), never dropped without a word.
"""

from __future__ import annotations

__all__ = ["with_options"]


def with_options(params: dict[str, str], forwarded: frozenset[str]) -> tuple[dict[str, str], list[str]]:
    """``params`` with the settings of its ``options`` added (a parameter named outright wins),
    and a warning for each part of ``options`` that is not applied.

    ``forwarded`` are the lower-case names dpproxy takes from the startup packet.
    """
    text = params.get("options")
    if not text:
        return params, []
    named = {name.lower() for name in params}
    merged = dict(params)
    warnings = []
    settings, others = _settings(_split(text))
    for word in others:
        warnings.append(f'the startup option "{word}" is not a setting (-c name=value); dpproxy ignores it')
    for name, value in settings:
        if name.lower() not in forwarded and name.lower() != "dpproxy.epsilon":
            warnings.append(f'the setting "{name}" in the startup options is not applied by dpproxy; '
                            f"SET it after connecting (dpproxy takes {', '.join(sorted(forwarded))} and "
                            "dpproxy.epsilon from options)")
        elif name.lower() not in named:
            merged[name] = value
    return merged, warnings


# What pg_split_opts splits at: C's isspace, ASCII only (not U+00A0, U+2003, U+001C ... which
# Python's str.isspace also counts).
_SPACE = frozenset(" \t\n\v\f\r")


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
        elif character in _SPACE:
            if started:
                words.append("".join(current))
                current, started = [], False
        else:
            current.append(character)
            started = True
    if started:
        words.append("".join(current))
    return words


def _settings(words: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, value) of each ``-c name=value``, ``-cname=value`` or ``--name=value`` (a dash in a
    name is an underscore, as PostgreSQL reads it), and the words that are no such setting."""
    settings, others = [], []
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
            others.append(word)
            position += 1
            continue
        name, equals, value = setting.partition("=")
        if equals and name:
            settings.append((name.replace("-", "_"), value))
        else:
            others.append(setting)
    return settings, others
