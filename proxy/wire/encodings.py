"""A session's client_encoding as the Python codec dpproxy reads and writes its text in.

PostgreSQL converts every string of a client's messages from the session's client_encoding,
and every string it sends into it. dpproxy does the same on its client side, and sends the
backend its text in that same encoding (the pooled connection carries the session's
client_encoding): so the characters dpproxy analysed are the characters PostgreSQL reads.
Only encodings in which each ASCII byte is the ASCII character reach here
(``rewriter.catalog.ascii_safe_encoding``): in them no two readings of a string can differ
in a quote, a backslash or any other byte that shapes a statement.

The codec of the session running in the current task is a context variable: every session is
an asyncio task of its own, and the protocol's encoders and decoders are called inside it.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from policies.errors import SQLSTATE, Refusal

__all__ = ["ClientEncoding", "UTF8", "client_encoding", "encoding_named", "untranslatable"]

# PostgreSQL's name of an encoding, as it reports client_encoding (encnames.c), and Python's
# codec with the same table (PostgreSQL's documentation, "Available Character Sets"; the
# mapping psycopg uses for its own text). SQL_ASCII is no conversion at all, read here as
# UTF-8 (the server encoding dpproxy's databases use); MULE_INTERNAL has no Python codec and
# is read as UTF-8 too (PostgreSQL converts no UTF8 database's text to it). EUC_TW, which no
# codec reads either, is refused (``rewriter.catalog.ascii_safe_encoding``).
_CODECS = {
    "UTF8": "utf-8", "SQL_ASCII": "utf-8", "MULE_INTERNAL": "utf-8",
    "EUC_CN": "gb2312", "EUC_JIS_2004": "euc_jis_2004", "EUC_JP": "euc_jp", "EUC_KR": "euc_kr",
    "ISO_8859_5": "iso8859-5", "ISO_8859_6": "iso8859-6", "ISO_8859_7": "iso8859-7", "ISO_8859_8": "iso8859-8",
    "KOI8R": "koi8-r", "KOI8U": "koi8-u",
    "LATIN1": "iso8859-1", "LATIN2": "iso8859-2", "LATIN3": "iso8859-3", "LATIN4": "iso8859-4",
    "LATIN5": "iso8859-9", "LATIN6": "iso8859-10", "LATIN7": "iso8859-13", "LATIN8": "iso8859-14",
    "LATIN9": "iso8859-15", "LATIN10": "iso8859-16",
    "WIN866": "cp866", "WIN874": "cp874", "WIN1250": "cp1250", "WIN1251": "cp1251", "WIN1252": "cp1252",
    "WIN1253": "cp1253", "WIN1254": "cp1254", "WIN1255": "cp1255", "WIN1256": "cp1256", "WIN1257": "cp1257",
    "WIN1258": "cp1258",
}


@dataclass(frozen=True)
class ClientEncoding:
    """A client_encoding by PostgreSQL's name, and the Python codec of its text."""

    name: str
    codec: str


UTF8 = ClientEncoding("UTF8", "utf-8")
# By name and by the bytes libpq reports it in (looked up on every statement sent).
_KNOWN: dict[str | bytes, ClientEncoding] = {name: ClientEncoding(name, codec) for name, codec in _CODECS.items()}
_KNOWN.update({name.encode(): encoding for name, encoding in list(_KNOWN.items()) if isinstance(name, str)})

client_encoding: ContextVar[ClientEncoding] = ContextVar("client_encoding", default=UTF8)
"""The encoding of the session whose task is running (UTF8 outside any session)."""


def encoding_named(name: str | bytes | None) -> ClientEncoding:
    """The encoding PostgreSQL reports as ``name`` (its canonical name); UTF8 for None."""
    known = _KNOWN.get(name) if name is not None else UTF8
    if known is not None:
        return known
    text = name.decode("ascii", "replace") if isinstance(name, bytes) else name
    assert text is not None
    # Not a name PostgreSQL reports for an encoding dpproxy lets a session use: read as UTF-8.
    return ClientEncoding(text, "utf-8")


def untranslatable(text: str, encoding: ClientEncoding) -> Refusal | None:
    """The error PostgreSQL raises (22P05) when ``text`` has a character ``encoding`` lacks; else None."""
    try:
        text.encode(encoding.codec)
    except UnicodeEncodeError as exc:
        character = exc.object[exc.start]
        shown = " ".join(f"0x{byte:02x}" for byte in character.encode("utf-8"))
        return Refusal(
            SQLSTATE.UNTRANSLATABLE_CHARACTER,
            f'character with byte sequence {shown} in encoding "UTF8" has no equivalent in encoding "{encoding.name}"',
            f'Set client_encoding to one that has "{character}" (UTF8 has every character).',
        )
    return None
