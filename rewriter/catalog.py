r"""What passthrough statements may touch: catalog relations, functions and settings.

Default deny. The lists below cover what psql, pgjdbc, psqlODBC, psycopg, asyncpg,
SQLAlchemy, node-postgres, pg8000 and pgbench send (shared/reference), and what Superset and
pgAdmin 4 send (tests/data), plus their obvious neighbours. Left out on purpose, because they
carry data about protected rows:
statistics (pg_statistic*, pg_stats*, pg_stat_*, pg_statio_*; the few a client cannot do
without answer with no row, ``EMPTIED_RELATIONS``), large objects, sequence positions (the view
pg_sequences shows ``last_value``, a serial key's row count; the table pg_sequence holds
only the definitions), file access, and anything that runs SQL given as a string
(query_to_xml, ts_stat, dblink).

Relation, database and tablespace sizes reveal row counts too, but psql's ``+`` commands
(``\dt+``, ``\l+``, ``\db+`` ...) show them in every listing: rather than refusing those
commands, each call of a size function is replaced by a NULL of its type
(``NEUTRALISED_FUNCTIONS``, see neutralise.py), for every relation alike, protected or not,
so that the answer never depends on which tables the policy protects.
"""

from __future__ import annotations

__all__ = [
    "CATALOG_SCHEMAS",
    "EMPTIED_RELATIONS",
    "NEUTRALISED_FUNCTIONS",
    "NEUTRALISED_PG_CLASS_COLUMNS",
    "NEUTRALISED_PG_DATABASE_COLUMNS",
    "PASSTHROUGH_FUNCTIONS",
    "PASSTHROUGH_ONLY_FUNCTIONS",
    "SAFE_SETTINGS",
    "SESSION_EFFECT_FUNCTIONS",
    "VALUE_CAST_TYPES",
    "VALUE_FUNCTIONS",
    "ascii_safe_encoding",
    "allowed_catalog_relation",
    "allowed_function",
    "exact_floats",
    "refused_function_reason",
    "value_function",
]

CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})

_PG_CATALOG_RELATIONS = frozenset(
    {
        # tables
        "pg_aggregate", "pg_am", "pg_amop", "pg_amproc", "pg_attrdef", "pg_attribute",
        "pg_auth_members", "pg_cast", "pg_class", "pg_collation", "pg_constraint",
        "pg_conversion", "pg_database", "pg_default_acl", "pg_depend", "pg_description",
        "pg_enum", "pg_event_trigger", "pg_extension", "pg_foreign_data_wrapper",
        "pg_foreign_server", "pg_foreign_table", "pg_index", "pg_inherits", "pg_language",
        "pg_namespace", "pg_opclass", "pg_operator", "pg_opfamily", "pg_partitioned_table",
        "pg_policy", "pg_proc", "pg_publication", "pg_publication_namespace",
        "pg_publication_rel", "pg_range", "pg_rewrite", "pg_sequence", "pg_shdepend",
        "pg_shdescription", "pg_statistic_ext", "pg_tablespace", "pg_transform", "pg_trigger",
        "pg_ts_config", "pg_ts_config_map", "pg_ts_dict", "pg_ts_parser", "pg_ts_template",
        "pg_type",
        # views
        "pg_available_extensions", "pg_available_extension_versions", "pg_cursors",
        "pg_indexes", "pg_matviews", "pg_policies", "pg_prepared_statements", "pg_roles",
        "pg_rules", "pg_settings", "pg_tables", "pg_timezone_abbrevs",
        "pg_timezone_names", "pg_user", "pg_views",
        # security labels and per-database/role settings (pgAdmin's properties dialogs)
        "pg_seclabel", "pg_shseclabel", "pg_seclabels", "pg_db_role_setting",
    }
)

# Catalog relations a client reads that passthrough answers as having no row (neutralise.py,
# ``empty_relations``), for every client alike: their columns and types, nothing read. pgAdmin
# fails to connect when either of the first two is refused: it counts replication slots, whose
# WAL positions (restart_lsn, confirmed_flush_lsn) move with every write, and reads its own
# backend's GSSAPI status, a statistics view that lists every backend (and the backend is
# dpproxy's, not the analyst's). Its Dashboard reads the other four and shows its own error
# text, never the server's, when they are refused: pg_stat_database counts transactions, tuples
# inserted, returned and fetched and blocks read, which the rows and other sessions decide;
# pg_stat_activity holds other sessions' statement texts (through the pool, a backend's
# ``query`` is dpproxy's rewritten SQL, its backend_xid/backend_xmin and state_change follow
# other clients' writes); pg_locks and pg_prepared_xacts name the relations, tuples and
# transactions others hold. With no row, the Dashboard's session counts are 0 and its counters
# NULL (a sum over no row), whatever the rows and whatever other sessions do.
EMPTIED_RELATIONS = frozenset({"pg_replication_slots", "pg_stat_gssapi", "pg_stat_activity", "pg_stat_database",
                               "pg_locks", "pg_prepared_xacts"})

# pg_class columns that reveal row counts and sizes, or which rows a table holds; replaced in
# every passthrough statement (those the backend has: relallfrozen, the pages VACUUM found all
# frozen, is PostgreSQL 18's). relfrozenxid and relminmxid are set by each VACUUM to the oldest
# transaction (multixact) id still unfrozen in the table, i.e. the xmin of its oldest unfrozen
# row: a table holding one row written before the others answered that row's xid, its
# neighbour without it the others' (0 is what a relation without storage has).
NEUTRALISED_PG_CLASS_COLUMNS = {
    "reltuples": "(-1)::real",
    "relpages": "0::integer",
    "relallvisible": "0::integer",
    "relallfrozen": "0::integer",
    "relfrozenxid": "'0'::pg_catalog.xid",
    "relminmxid": "'0'::pg_catalog.xid",
}

# pg_database columns replaced in every passthrough statement: each VACUUM sets them to the
# least relfrozenxid (relminmxid) of the database's relations, a protected table's among them.
NEUTRALISED_PG_DATABASE_COLUMNS = {
    "datfrozenxid": "'0'::pg_catalog.xid",
    "datminmxid": "'0'::pg_catalog.xid",
}

# Functions each call of which becomes a NULL of the type given (its arguments are never
# evaluated): the size functions (bigint), and pg_blocking_pids (integer[]), the backends
# holding a lock a given backend waits for, which pgAdmin's Dashboard lists beside each session.
NEUTRALISED_FUNCTIONS = {
    **dict.fromkeys(("pg_table_size", "pg_relation_size", "pg_total_relation_size", "pg_indexes_size",
                     "pg_database_size", "pg_tablespace_size"), "int8"),
    "pg_blocking_pids": "int4[]",
}

_FUNCTIONS = frozenset(
    {
        # session and server information
        "version", "current_database", "current_schema", "current_schemas", "current_setting",
        "current_user", "session_user", "current_catalog", "pg_backend_pid",
        "pg_is_in_recovery", "pg_postmaster_start_time", "pg_conf_load_time",
        "pg_client_encoding", "inet_server_port", "txid_current_if_assigned",
        # the functions behind the allowlisted views pg_settings (pgAdmin reads it at connect)
        # and pg_available_extensions (its tree's Extensions)
        "pg_show_all_settings", "pg_available_extensions", "pg_available_extension_versions",
        # the backend connection's temporary schema (0: none; DDL never runs through dpproxy),
        # which Arrow's ADBC driver lists beside the others in adbc_get_objects
        "pg_my_temp_schema",
        "pg_advisory_unlock_all", "set_config",
        # the rows of an aclitem[] (grantor, grantee, privilege), as pgAdmin lists privileges
        "aclexplode",
        # catalog helpers
        "format_type", "pg_get_expr", "pg_get_indexdef", "pg_get_constraintdef",
        "pg_get_userbyid", "pg_get_viewdef", "pg_get_triggerdef", "pg_get_ruledef",
        "pg_get_functiondef", "pg_get_function_arguments", "pg_get_function_result",
        "pg_get_function_identity_arguments", "pg_get_function_sqlbody", "pg_get_partkeydef",
        "pg_get_partition_constraintdef", "pg_get_serial_sequence",
        "pg_get_statisticsobjdef", "pg_get_statisticsobjdef_columns", "pg_get_keywords",
        "pg_relation_is_publishable", "pg_encoding_to_char", "pg_char_to_encoding",
        "pg_table_is_visible", "pg_type_is_visible", "pg_function_is_visible",
        "pg_collation_is_visible", "pg_opclass_is_visible", "pg_operator_is_visible",
        "pg_conversion_is_visible", "pg_opfamily_is_visible", "pg_statistics_obj_is_visible",
        "pg_ts_config_is_visible", "pg_ts_dict_is_visible", "pg_ts_parser_is_visible",
        "pg_ts_template_is_visible", "obj_description", "col_description",
        "shobj_description", "pg_describe_object", "pg_identify_object",
        "pg_index_column_has_property", "pg_index_has_property", "pg_indexam_has_property",
        "pg_options_to_table", "pg_tablespace_location", "pg_get_publication_tables",
        "to_regtype", "to_regclass", "to_regproc", "to_regprocedure", "to_regnamespace",
        "to_regrole", "to_regoper", "to_regoperator", "to_regcollation",
        "has_table_privilege", "has_schema_privilege", "has_column_privilege",
        "has_any_column_privilege", "has_database_privilege", "has_function_privilege",
        "has_sequence_privilege", "has_type_privilege", "has_tablespace_privilege",
        "has_foreign_data_wrapper_privilege", "has_server_privilege",
        "has_language_privilege", "pg_has_role", "information_schema._pg_expandarray",
        # pure functions and aggregates over catalog rows
        "array_agg", "string_agg", "array_to_string", "array_upper", "array_lower",
        "array_length", "array_position", "array_positions", "cardinality", "unnest",
        "generate_series", "generate_subscripts", "row_number", "rank", "dense_rank",
        "count", "min", "max", "sum", "avg", "bool_and", "bool_or", "every",
        "json_build_object", "jsonb_build_object", "json_build_array", "jsonb_build_array",
        "json_agg", "jsonb_agg", "json_object_agg", "to_json", "to_jsonb", "row_to_json",
        "replace", "btrim", "trim", "ltrim", "rtrim", "lower", "upper", "length",
        "char_length", "octet_length", "substr", "substring", "left", "right", "position",
        "strpos", "concat", "concat_ws", "format", "quote_ident", "quote_literal",
        "quote_nullable", "split_part", "like_escape", "starts_with", "abs", "round", "trunc",
        "floor", "ceil", "ceiling", "mod", "now", "current_timestamp", "pg_typeof",
        "pg_size_pretty",
        # a value formatted as text (pgAdmin's Dashboard formats its sessions' start times so)
        "to_char",
        # a date part of a value (EXTRACT(YEAR FROM ...) over a released year key's start) and
        # a Sunday week's start computed from a released day (rewriter/date_parts.py)
        "extract", "date_part", "date_trunc",
    }
)

# Of the allowlisted functions, those a statement on a protected table may call (in its
# post-processing, since its WHERE and aggregate arguments allow fewer): value functions, whose
# result is a function of their arguments (string, number, date/time, JSON and array
# formatting), and the session's own values. Not the catalog helpers (format_type,
# pg_get_*def, obj_description, pg_describe_object, pg_tablespace_location, to_reg*,
# has_*_privilege ...): over a release they look up the catalog by a released number, so a
# release would become a probe of objects by OID, answered or failing (XX000, 58P01) as the
# catalog and the noise decide. Nor a set-returning function or an aggregate of the catalog's
# (generate_series, unnest, string_agg ...): classify refuses those on a protected table.
VALUE_FUNCTIONS = frozenset(
    {
        "version", "current_database", "current_schema", "current_user", "session_user", "current_catalog",
        "array_to_string", "array_upper", "array_lower", "array_length", "array_position", "array_positions",
        "cardinality", "count", "min", "max", "sum", "avg",
        "json_build_object", "jsonb_build_object", "json_build_array", "jsonb_build_array", "to_json", "to_jsonb",
        "row_to_json",
        "replace", "btrim", "trim", "ltrim", "rtrim", "lower", "upper", "length", "char_length", "octet_length",
        "substr", "substring", "left", "right", "position", "strpos", "concat", "concat_ws", "format",
        "quote_ident", "quote_literal", "quote_nullable", "split_part", "like_escape", "starts_with",
        "abs", "round", "trunc", "floor", "ceil", "ceiling", "mod", "now", "current_timestamp", "pg_typeof",
        "extract", "date_part", "date_trunc", "pg_size_pretty"
    }
)

# The types a statement on a protected table may cast to (PostgreSQL's names, as its parser
# writes them, ``pg_catalog.`` prefix optional, arrays of them too): value types. Not oid, the
# reg* types nor the other system identifiers (xid, tid, pg_lsn ...): ``count(*)::regclass``
# prints the name of the relation whose OID the noise gave, a catalog probe by a released
# number; nor a type of the database's own (a domain, an enum, a composite): its input and
# cast functions are the database's, not PostgreSQL's.
VALUE_CAST_TYPES = frozenset(
    {
        "int2", "int4", "int8", "numeric", "float4", "float8", "money", "bool", "text", "varchar", "bpchar",
        "char", "name", "date", "time", "timetz", "timestamp", "timestamptz", "interval", "json", "jsonb",
        "uuid", "bytea", "bit", "varbit",
    }
)

# Every function a catalog statement may call (the neutralised ones aside).
PASSTHROUGH_FUNCTIONS = _FUNCTIONS

# Allowlisted functions that change the session: catalog statements may call them, no
# statement on a protected table may (a DP statement's functions are pure).
SESSION_EFFECT_FUNCTIONS = frozenset({"set_config", "pg_advisory_unlock_all"})

# Allowlisted functions for catalog statements only, never in a statement on a protected table:
# to_char fails on some constant formats ('9V9EEEE'), which over a DP answer would be after the
# charge, for a reason no row decides.
PASSTHROUGH_ONLY_FUNCTIONS = frozenset({"to_char"})

# Settings a client may SET or set_config(): presentation and session plumbing only.
# Not standard_conforming_strings: it changes how literals parse, and the classifier
# parses with it on. Not lc_monetary: it changes what a money literal in a DP query's WHERE
# means ('1,000.00'), which neither a repeat's key nor the pre-charge check's memory carry
# (they carry the reported DateStyle, IntervalStyle, TimeZone and client_encoding). Not
# idle_in_transaction_session_timeout: inside a block the backend sits idle while a quantised
# DP answer waits for its boundary, for the quantum minus the time the rows took, so whether
# that timer ended the connection said how long they took (dpproxy's own
# listen.idle_in_transaction_timeout_s times the client instead). Not lock_timeout: a DP
# statement also waits for the lock of its table's TOAST relation, which it opens only when a
# row it reads has a long value stored apart, so a wait for the operator's lock there (a
# REINDEX, a VACUUM truncating it, replayed on a standby) ended by lock_timeout failed the
# statement exactly on the table holding such a row (proxy.backend.pool.PINNED_SETTINGS).
SAFE_SETTINGS = frozenset(
    {
        "application_name", "client_encoding", "names", "datestyle", "intervalstyle",
        "timezone", "time zone", "extra_float_digits", "search_path", "bytea_output",
        "client_min_messages", "lc_numeric", "lc_time", "jit",
        "transaction_isolation",
        "default_transaction_isolation", "xmloption",
        "transaction", "session characteristics",
    }
)


# Client encodings in which every byte below 0x80 is always the ASCII character itself:
# PostgreSQL's server-side encodings, by the names and aliases it accepts (encnames.c),
# as clean_encoding_name() reduces them (ASCII letters and digits, lower case). Not its
# client-only encodings (SJIS, SHIFT_JIS_2004, BIG5, GBK, GB18030, UHC, JOHAB and their
# aliases mskanji, win932, win950 ...): there the second byte of a character can be an ASCII
# byte, a backslash among them, so the UTF-8 text dpproxy parsed and sends is, for
# PostgreSQL, another statement (the last byte of "ā" swallows the backslash of ``E'ā\'``
# and the quote after it ends the string). dpproxy reads a client's text in its
# client_encoding (proxy/wire/encodings.py), which must therefore be one of these.
_ASCII_SAFE_ENCODINGS = frozenset(
    {
        "utf8", "unicode", "sqlascii", "muleinternal",
        # Not EUC_TW, ASCII-safe as it is: neither Python nor psycopg has a codec for it, so
        # dpproxy could read no text in it (its backend connection's parameters included).
        # Not EUC_JP, EUC_JIS_2004 nor EUC_KR: Python's codecs read some characters as others
        # than PostgreSQL's tables do (EUC_JP A1C1 is Python's U+301C, PostgreSQL's U+FF5E;
        # Python writes ¥ as the byte 0x5C; EUC_KR's 8-byte Hangul make-up sequences are one
        # syllable to Python, four jamo to PostgreSQL), so a name dpproxy judged could denote
        # another column for PostgreSQL (tests/test_attack_identities.py).
        "euccn",
        "latin1", "latin2", "latin3", "latin4", "latin5", "latin6", "latin7", "latin8", "latin9", "latin10",
        "iso88591", "iso88592", "iso88593", "iso88594", "iso88595", "iso88596", "iso88597", "iso88598",
        "iso88599", "iso885910", "iso885913", "iso885914", "iso885915", "iso885916",
        "win1250", "win1251", "win1252", "win1253", "win1254", "win1255", "win1256", "win1257", "win1258",
        "windows1250", "windows1251", "windows1252", "windows1253", "windows1254", "windows1255",
        "windows1256", "windows1257", "windows1258", "win866", "windows866", "alt", "win874", "windows874",
        "koi8", "koi8r", "koi8u", "win", "abc", "tcvn", "tcvn5712", "vscii",
    }
)


def ascii_safe_encoding(value: str | None) -> bool:
    """True for a client_encoding value in which PostgreSQL reads each ASCII byte as dpproxy does.

    PostgreSQL drops every character of the name but ASCII letters and digits (so ``'sjéis'``
    is SJIS): a name with any other non-ASCII character, or none given as a literal, is not safe.
    """
    if value is None or not value.isascii():
        return False
    return "".join(ch for ch in value.lower() if ch.isalnum()) in _ASCII_SAFE_ENCODINGS


def exact_floats(name: str, value: str | None) -> bool:
    """False for an ``extra_float_digits`` below 1 (or not a literal integer).

    Below 1 PostgreSQL prints float8/float4 rounded, and DP sums and partition values of
    float columns reach dpproxy as text: a rounded exact value can move by far more than one
    row's contribution, which the noise does not cover. At 1 and above output is exact.
    """
    if name.lower() != "extra_float_digits":
        return True
    try:
        return value is not None and int(value.strip().strip("'")) >= 1
    except ValueError:
        return False


def allowed_catalog_relation(schema: str, name: str) -> bool:
    """True for the catalog relations passthrough statements may read."""
    if schema == "information_schema":
        return True
    return schema == "pg_catalog" and (name in _PG_CATALOG_RELATIONS or name in EMPTIED_RELATIONS)


def allowed_function(name: str) -> bool:
    """True for functions passthrough statements may call (``pg_catalog.`` prefix optional).

    Neutralised size functions count as allowed: they are replaced before the statement runs.
    """
    bare = name.removeprefix("pg_catalog.")
    return bare in _FUNCTIONS or bare in NEUTRALISED_FUNCTIONS


def value_function(name: str) -> bool:
    """True for the allowlisted functions a statement on a protected table may call (``VALUE_FUNCTIONS``)."""
    return name.removeprefix("pg_catalog.") in VALUE_FUNCTIONS


# Why a function off the allowlist is refused, by name prefix (first match wins).
_REFUSAL_REASONS = (
    (("pg_stat", "pg_statio", "pg_mcv", "pg_get_stat"), "it reads statistics about the rows"),
    (("pg_read", "pg_ls_", "pg_stat_file", "pg_file"), "it reads server files"),
    (("lo_", "pg_largeobject"), "it reads large objects"),
    (("query_to_", "table_to_", "schema_to_", "database_to_", "cursor_to_", "ts_stat", "dblink"),
     "it runs SQL given as text"),
    (("nextval", "currval", "lastval", "setval", "pg_sequence_last_value", "pg_get_sequence_data"),
     "it reveals sequence positions"),
)


def refused_function_reason(name: str) -> str:
    """Why ``name`` (not allowed) is refused, for the analyst's error message."""
    bare = name.removeprefix("pg_catalog.")
    for prefixes, reason in _REFUSAL_REASONS:
        if bare.startswith(prefixes):
            return reason
    return "it is not on dpproxy's allowlist of catalog and formatting functions"
