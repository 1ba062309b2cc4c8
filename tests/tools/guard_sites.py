"""The guard sites :mod:`guard_ablation` switches off, one at a time, and the tests each must fail.

A site is a file, a snippet of the guard's condition that occurs in it exactly once, and the
text that disables it (``if cond:`` becomes ``if False:``, an allowlist gains the names it keeps
out, a refusal becomes a pass). Its selection is the fast tests of its area, named in
:data:`SELECTIONS`; :data:`WIDER` adds slower ones (the neighbour fuzzer, at its default seeded
size, among them) for a second run of the guards the first leaves alive.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SELECTIONS", "SITES", "WIDER", "Site"]


@dataclass(frozen=True)
class Site:
    """One guard: where it is, how it is switched off, and which selection must notice."""

    name: str
    path: str
    snippet: str
    replacement: str
    selection: str


_FUZZ = "tests/test_neighbour_fuzz.py"

SELECTIONS: dict[str, tuple[str, ...]] = {
    "predicate": ("tests/test_refusals.py", "tests/test_predicate_oracles.py", "tests/test_attack_backend_sql.py"),
    "catalog": ("tests/test_refusals.py", "tests/test_attack_catalog.py", "tests/test_catalog_statements.py"),
    "value-fields": ("tests/test_attack_stop36.py::test_the_transaction_counter_is_not_read_through_attribute_notation",
                     "tests/test_attack_stop36.py::test_a_relations_age_column_is_still_read_by_its_qualified_name"),
    "classify": ("tests/test_refusals.py", "tests/test_data_modifying_cte.py", "tests/test_copy.py", "tests/test_ctes.py",
                 "tests/test_session_statements.py", "tests/test_attack_pool_isolation.py"),
    "relation": ("tests/test_protected_view_failures.py", "tests/test_service_role_grants.py"),
    "reads": ("tests/test_attack_identities.py", "tests/test_partition_key.py",
              "tests/test_attack_new_keys.py::test_a_public_relation_that_starts_reading_a_protected_table_is_refused",
              "tests/test_attack_new_keys.py::"
              "test_a_policy_whose_public_table_has_a_row_security_policy_reading_a_protected_one_is_refused"),
    "keys": ("tests/test_refusals.py", "tests/test_key_domain.py", "tests/test_attack_histograms.py"),
    "dp_query": ("tests/test_refusals.py", "tests/test_query_shapes.py", "tests/test_attack_outputs.py",
                 "tests/test_attack_availability.py::test_a_number_too_long_for_python_int_is_refused_not_an_internal_error"),
    "limits": ("tests/test_statement_limits.py",),
    "types": ("tests/test_attack_extension_types.py", "tests/test_type_support.py"),
    "settings": ("tests/test_epsilon_setting_transactions.py", "tests/test_session_statements.py"),
    "variance": ("tests/test_variance.py",),
}

_TIMEOUTS = ("tests/test_attack_workers.py::test_the_backends_idle_in_transaction_timeout_cannot_be_set",
             "tests/test_attack_workers.py::test_no_other_timeout_of_the_backend_can_be_set")

# Its shadow_schema.adult (a second relation named adult) is dropped when its module ends, and
# test_attack_catalog reads public.adult by oid: the order no longer matters.
_ATTACKS = "tests/test_attacks.py"

# Run after a selection's own tests with ``--wide``: for the guards they leave alive.
WIDER: dict[str, tuple[str, ...]] = {
    "predicate": ("tests/test_attack_backend_sql.py", "tests/test_attack_outputs.py", "tests/test_attack_budget.py",
                  "tests/test_folded_constants.py", "tests/test_attack_extension_types.py",
                  "tests/test_attack_parsing.py", "tests/test_conditional_aggregates.py", _FUZZ),
    "catalog": ("tests/test_attack_settings.py", "tests/test_attack_pool_isolation.py",
                "tests/test_attack_new_answers.py", "tests/test_attack_parsing.py", "tests/test_pg_catalog_pinning.py",
                *_TIMEOUTS, _ATTACKS),
    "classify": ("tests/test_attack_budget.py", "tests/test_attack_settings.py", "tests/test_attack_new_answers.py",
                 "tests/test_attack_parsing.py", "tests/test_attack_catalog.py", "tests/test_connection_limits.py",
                 *_TIMEOUTS, _ATTACKS),
    "relation": ("tests/test_schema_drift.py",),
    "keys": ("tests/test_histograms.py", "tests/test_attack_bi_keys.py",
             "tests/test_attack_new_keys.py::test_count_distinct_per_date_part_is_refused_for_its_cells_add_up_buckets",
             _FUZZ),
    "dp_query": ("tests/test_predicate_oracles.py", "tests/test_type_support.py", "tests/test_attack_extension_types.py",
                 "tests/test_dp_count_sum.py", "tests/test_dp_avg_min_max_mode.py", "tests/test_attack_histograms.py",
                 "tests/test_attack_new_keys.py::test_count_distinct_per_date_part_is_refused_for_its_cells_add_up_buckets",
                 _FUZZ),
    "types": ("tests/test_attack_identities.py", "tests/test_dp_count_sum.py", "tests/test_dp_avg_min_max_mode.py"),
    "settings": ("tests/test_budget.py", "tests/test_statement_limits.py", "tests/test_attack_settings.py"),
}


def _off(name: str, path: str, condition: str, selection: str, replacement: str = "False") -> Site:
    """The site whose ``if <condition>:`` becomes ``if <replacement>:``."""
    return Site(name, path, f"if {condition}:", f"if {replacement}:", selection)


_P = "rewriter/predicates.py"
_C = "rewriter/classify.py"
_F = "rewriter/function_check.py"
_K = "rewriter/catalog.py"
_G = "rewriter/group_keys.py"
_D = "rewriter/dp_query.py"
_L = "rewriter/limits.py"
_R = "proxy/backend/row_failures.py"
_RR = "proxy/backend/relation_reads.py"
_S = "proxy/serving/settings.py"


def _allow(name: str, path: str, anchor: str, extra: str, selection: str) -> Site:
    """The site whose allowlist, at ``anchor``, also holds ``extra``."""
    return Site(name, path, anchor, anchor + " " + extra, selection)


SITES: tuple[Site, ...] = (
    # ------------------------------------------------------------------ rewriter/predicates.py
    _off("pred.no-column-compared", _P, "left.column is None and right.column is None", "predicate"),
    _off("pred.two-columns-family", _P,
         "not any({column.type_oid, other.column.type_oid} <= family for family in _COLUMN_FAMILIES)", "predicate"),
    Site("pred.enum-vs-typed-constant", _P, "        if column.enum:\n            family = frozenset()",
         "        if False:\n            family = frozenset()", "predicate"),
    _off("pred.familyless-type-constant", _P,
         "family is None and (column.type_oid >= _FIRST_USER_OID or column.type_oid in _OID_TYPES)", "predicate",
         "family is None"),
    _off("pred.typed-constant-family", _P, "kind is not None and kind not in (family or ())", "predicate"),
    _off("pred.is-null-or-bool-only", _P, "not isinstance(node.expression, exp.Null)", "predicate"),
    _off("pred.bare-column-boolean", _P, "side.column.type_oid != BOOL", "predicate"),
    Site("pred.like-literal-or-parameter", _P,
         'raise self.refuse("LIKE/ILIKE takes a literal pattern or a parameter on protected table")',
         'pattern_sql = pattern.sql("postgres")', "predicate"),
    Site("pred.like-invalid-literal", _P, "            if refused is not None:\n                raise self.refuse(",
         "            if False:\n                raise self.refuse(", "predicate"),
    _off("pred.like-text-column", _P,
         "not isinstance(node.this, tuple(_CASE_FUNCTIONS)) and column.column.type_oid not in _TEXT_TYPES",
         "predicate"),
    _off("pred.like-deterministic-collation", _P, "not column.column.deterministic_collation", "predicate"),
    _off("pred.case-function-text-column", _P, "function and column.type_oid not in _TEXT_TYPES", "predicate"),
    Site("pred.value-with-column-not-folded", _P,
         "for part in node.walk()):\n                raise", "for part in node.walk()) and False:\n                raise",
         "predicate"),
    _off("pred.compare-builtin-only", _P, "side.column is not None and not side.column.builtin", "predicate"),
    _off("pred.compare-no-container", _P, "side.column is not None and side.column.container", "predicate"),
    Site("pred.fold-type-known", _P, "        if type_name is None:\n            raise",
         "        if False:\n            raise", "predicate"),
    _off("pred.cast-typmod-allowed", _P, "modifiers and not typmod_allowed", "predicate"),
    Site("pred.no-cast-of-column", _P,
         '        if isinstance(operand, exp.Column):\n            raise self.refuse("a cast of a column',
         '        if False:\n            raise self.refuse("a cast of a column', "predicate"),
    Site("pred.no-cast-of-cast", _P, "        if isinstance(operand, exp.Cast):\n            raise",
         "        if False:\n            raise", "predicate"),
    _off("pred.no-stable-cast-of-parameter", _P, "isinstance(operand, exp.Parameter) and name in _STABLE_INPUT",
         "predicate"),
    _off("pred.numeric-vs-float", _P,
         "other.cast in _FLOAT_CASTS or (other.column is not None and other.column.type_oid in _FLOAT_COLUMNS)",
         "predicate"),
    Site("pred.numeric-parameter-cast", _P, "            if other.parameter:\n",
         "            if False:\n", "predicate"),
    Site("pred.float-literal-pinned", _P, "operands[1 - index] = _float_literal(other)",
         "operands[1 - index] = other", "predicate"),
    # ------------------------------------------------------------------ LIKE patterns, parameters, folding
    _off("like.odd-trailing-escapes", "rewriter/like_patterns.py", "(len(pattern) - len(pattern.rstrip(ESCAPE))) % 2",
         "predicate", "False"),
    _off("like.run-of-three-escapes", "rewriter/like_patterns.py", "(len(pattern) - len(pattern.rstrip(ESCAPE))) % 2",
         "predicate", "pattern.endswith(ESCAPE) and not pattern.endswith(ESCAPE * 2)"),
    Site("like.part-after-percent", "rewriter/like_patterns.py", "    found = _LONG_PART.search(pattern)\n",
         "    found = None\n", "predicate"),
    _off("like.case-folded-characters", "rewriter/like_patterns.py", "characters <= MAX_CASE_FOLDED_PATTERNS",
         "predicate", "True"),
    Site("like.costly-pattern-refused", "rewriter/like_patterns.py",
         "    reason = costly_pattern_reason(pattern)\n    return None if reason is None",
         "    reason = None\n    return None if reason is None", "predicate"),
    Site("fold.like-parameters-checked", "proxy/dp/folding.py", "for number in folding.like_parameters}",
         "for number in ()}", "predicate"),
    _off("fold.like-parameter-type", "proxy/dp/folding.py", "params.types[number - 1] not in _PATTERN_TYPES",
         "predicate"),
    Site("fold.like-parameter-decodes", "proxy/dp/folding.py", "pattern = bytes(value).decode(encoding.codec)",
         'pattern = bytes(value).decode(encoding.codec, "replace")', "predicate"),
    Site("fold.like-parameter-pattern", "proxy/dp/folding.py",
         "    refused = pattern_refusal(pattern)\n    if refused is not None:",
         "    refused = pattern_refusal(pattern)\n    if False:", "predicate"),
    _off("param.declared-type", "proxy/dp/parameter_types.py", "type_oid not in PARAMETER_TYPES", "predicate"),
    # ------------------------------------------------------------------ rewriter/function_check.py, catalog.py
    Site("func.attribute-notation", _F, "        if name in NEUTRALISED_FUNCTIONS or on_a_value or not (",
         "        if False and (", "catalog"),
    Site("func.attribute-neutralised", _F, "        if name in NEUTRALISED_FUNCTIONS or on_a_value or not (",
         "        if on_a_value or not (", "catalog"),
    Site("func.attribute-age-of-a-value", _F, "        if name in NEUTRALISED_FUNCTIONS or on_a_value or not (",
         "        if name in NEUTRALISED_FUNCTIONS or not (", "value-fields"),
    Site("func.attribute-known-function", _F, "or (function_names is not None and name not in function_names)",
         "or (function_names is not None)", "catalog"),
    Site("func.attribute-release-column", _F, "or (function_names is None and _RELEASE_COLUMN.fullmatch(name))",
         "or (function_names is None)", "catalog"),
    Site("func.allowlist", _F, "        if not allowed_function(name):\n            raise",
         "        if False:\n            raise", "catalog"),
    _off("func.set-config-checked", _F, 'name.removeprefix("pg_catalog.") == "set_config"', "catalog"),
    _off("func.set-config-safe-setting", _F, "first is None or first.lower() not in SAFE_SETTINGS", "catalog",
         "first is None"),
    _off("func.set-config-literal-name", _F, "first is None or first.lower() not in SAFE_SETTINGS", "catalog",
         "first is not None and first.lower() not in SAFE_SETTINGS"),
    Site("func.set-config-exact-floats", _F, "        if not exact_floats(first, second):\n            raise",
         "        if False:\n            raise", "catalog"),
    _off("func.set-config-encoding", _F, 'first.lower() == "client_encoding" and not ascii_safe_encoding(second)',
         "catalog"),
    _off("func.set-config-isolation-local", _F,
         'first.lower() == "transaction_isolation" and not _is_true(args[2] if len(args) > 2 else None)', "catalog"),
    _allow("cat.statistics-relations", _K, '"pg_type",\n', '"pg_statistic", "pg_largeobject",\n', "catalog"),
    _allow("cat.statistics-views", _K, '"pg_views",', '"pg_stats", "pg_stat_user_tables", "pg_sequences",',
           "catalog"),
    _allow("cat.fn-statistics", _K, '"pg_size_pretty",', '"pg_stat_get_live_tuples", "pg_stat_get_numscans",',
           "catalog"),
    _allow("cat.fn-sql-as-text", _K, '"pg_size_pretty",', '"query_to_xml", "table_to_xml", "ts_stat",', "catalog"),
    _allow("cat.fn-files", _K, '"pg_size_pretty",', '"pg_read_file", "pg_ls_dir", "pg_stat_file",', "catalog"),
    _allow("cat.fn-sequences", _K, '"pg_size_pretty",', '"currval", "lastval", "pg_sequence_last_value",', "catalog"),
    _allow("cat.fn-large-objects", _K, '"pg_size_pretty",', '"lo_get", "lo_export",', "catalog"),
    Site("cat.reltuples-neutralised", _K, '    "reltuples": "(-1)::real",\n', "", "catalog"),
    _allow("cat.setting-standard-conforming-strings", _K, '"transaction", "session characteristics",',
           '"standard_conforming_strings",', "classify"),
    _allow("cat.setting-lc-monetary", _K, '"transaction", "session characteristics",', '"lc_monetary",', "classify"),
    _allow("cat.setting-idle-in-transaction", _K, '"transaction", "session characteristics",',
           '"idle_in_transaction_session_timeout",', "classify"),
    _allow("cat.setting-statement-timeout", _K, '"transaction", "session characteristics",', '"statement_timeout",',
           "classify"),
    _allow("cat.setting-role", _K, '"transaction", "session characteristics",', '"role", "session_authorization",',
           "classify"),
    _allow("cat.setting-read-only", _K, '"transaction", "session characteristics",',
           '"default_transaction_read_only", "default_transaction_deferrable", "transaction_read_only",', "classify"),
    _allow("cat.encoding-client-only", _K, '"utf8", "unicode", "sqlascii", "muleinternal",', '"sjis", "big5", "gbk",',
           "classify"),
    _off("cat.encoding-ascii-name", _K, "value is None or not value.isascii()", "classify", "value is None"),
    Site("cat.exact-floats-at-least-one", _K, 'int(value.strip().strip("\'")) >= 1', 'int(value.strip().strip("\'")) >= -15',
         "classify"),
    # ------------------------------------------------------------------ rewriter/classify.py
    _off("cls.nested-writes", _C, "kind not in _WRITES and statement.references.node_kinds & _NESTED_WRITES", "classify"),
    _off("cls.select-into", _C, 'statement.node.get("intoClause")', "classify"),
    Site("cls.writes", _C, "    if kind in _WRITES:\n        raise Refusal(",
         "    if kind in _WRITES:\n        return Passthrough(statement.text)\n    if False:\n        raise Refusal(",
         "classify"),
    Site("cls.not-supported", _C, "    if kind in _NOT_SUPPORTED:\n        raise Refusal(",
         "    if kind in _NOT_SUPPORTED:\n        return Passthrough(statement.text)\n    if False:\n        raise Refusal(",
         "classify"),
    Site("cls.other-statements", _C, '    raise Refusal(\n        SQLSTATE.READ_ONLY_SQL_TRANSACTION,\n        f"{_statement_name',
         '    return Passthrough(statement.text)\n    raise Refusal(\n        SQLSTATE.READ_ONLY_SQL_TRANSACTION,\n'
         '        f"{_statement_name', "classify"),
    _off("cls.cte-shadowing", _C, "registry.get(target.oid) is not None or target.schema not in CATALOG_SCHEMAS",
         "classify"),
    _off("cls.catalog-allowlist", _C, "not allowed_catalog_relation(target.schema, target.name)", "classify"),
    Site("cls.default-deny", _C, "        raise Refusal(\n            SQLSTATE.INSUFFICIENT_PRIVILEGE,\n"
         '            f"relation {target.schema}', "        continue\n        raise Refusal(\n"
         "            SQLSTATE.INSUFFICIENT_PRIVILEGE,\n"
         '            f"relation {target.schema}', "classify"),
    Site("cls.passthrough-functions", _C, "    check_functions(statement, registry.function_names)\n    # Each",
         "    # Each", "classify"),
    _off("cls.catalog-columns-neutralised", _C, "oid in neutralised", "classify"),
    Site("cls.columns-only-functions", _C,
         "            check_functions(statement, registry.function_names)\n            return ColumnsOnly",
         "            return ColumnsOnly", "classify"),
    Site("cls.service-role-grant", _C, "        if role is not None:\n            raise",
         "        if False:\n            raise", "relation"),
    Site("cls.row-failure", _C, "        if expression is not None:\n            raise",
         "        if False:\n            raise", "relation"),
    Site("cls.schema-changed", _C, "        if change is not None:\n            raise",
         "        if False:\n            raise", "relation"),
    _off("cls.one-relation", _C, "len(read) > 1", "dp_query"),
    Site("cls.dp-session-effects", _C, "    if effects:\n        # Wherever it stands", "    if False:\n        # Wherever it stands",
         "dp_query"),
    Site("cls.dp-function-allowlist", _C, "    if unknown:\n", "    if False:\n", "dp_query"),
    Site("cls.dp-other-aggregates", _C, "        if name in _OTHER_AGGREGATES\n", "        if False\n", "dp_query"),
    _off("cls.two-phase-commit", _C, 'node.get("kind") not in _TRANSACTION_KINDS', "classify"),
    _off("cls.read-write", _C, 'element.get("defname") == "transaction_read_only" and not value', "classify"),
    _off("cls.not-deferrable", _C, 'element.get("defname") == "transaction_deferrable" and not value', "classify"),
    _off("cls.safe-settings", _C, "name not in SAFE_SETTINGS", "classify"),
    Site("cls.set-transaction-modes", _C, '    _refuse_transaction_modes(node.get("args") or [])\n', "", "classify"),
    _off("cls.set-exact-floats", _C, 'kind != "VAR_SET_DEFAULT" and not exact_floats(name, _set_value(node))',
         "classify"),
    _off("cls.set-client-encoding", _C,
         'name in ("client_encoding", "names") and kind != "VAR_SET_DEFAULT" and not ascii_safe_encoding(_set_value(node))',
         "classify"),
    _off("cls.set-transaction-local", _C, 'name in _TRANSACTION_SCOPED and not node.get("is_local")', "classify"),
    _off("copy.only-select-to-stdout", "rewriter/copy.py",
         'query is None or node.get("is_from") or node.get("is_program") or node.get("filename")', "classify",
         "query is None"),
    _off("copy.no-values", "rewriter/copy.py", '"SelectStmt" not in query or query["SelectStmt"].get("valuesLists")',
         "classify", '"SelectStmt" not in query'),
    # ------------------------------------------------------------------ rewriter/limits.py
    _off("limits.operator-run", _L, "run > MAX_OPERATOR_RUN", "limits"),
    _off("limits.parentheses", _L, "depth > MAX_PARENTHESES", "limits"),
    _off("limits.nesting", _L, "child_depth > MAX_NESTING", "limits"),
    _off("limits.boolean-terms", _L, 'key == "BoolExpr" and len(value.get("args", ())) > MAX_BOOLEAN_TERMS', "limits"),
    _off("limits.tree-bytes", "rewriter/statements.py", "len(tree_json) > MAX_TREE_BYTES", "limits"),
    # ------------------------------------------------------------------ rewriter/group_keys.py, key_domain.py
    _off("keys.column-key-declared", _G, "policy is None or count is None", "keys", "policy is None"),
    Site("keys.column-key-cells", _G, '    if count > scope.table.policy.max_cells:\n        raise _too_many(scope, f"GROUP BY {column.name}"',
         '    if False:\n        raise _too_many(scope, f"GROUP BY {column.name}"', "keys"),
    _off("keys.time-unit-declared", _G,
         "policy is None or column.type_oid not in TIME_TYPES or chosen is None or chosen not in policy.time_units",
         "keys", "policy is None or column.type_oid not in TIME_TYPES or chosen is None"),
    _off("keys.date-trunc-no-zone", _G, 'source is None or node.args.get("zone") is not None or text is None', "keys",
         "source is None or text is None"),
    Site("keys.part-key-declared", _G,
         "    if policy is None or column.type_oid not in TIME_TYPES or not policy.time_units:\n        raise _refuse(scope, what)",
         "    if policy is None:\n        raise _refuse(scope, what)", "keys"),
    _off("keys.epoch-day-declared", _G,
         'policy is None or column.type_oid not in TIME_TYPES or "day" not in policy.time_units', "keys",
         "policy is None or column.type_oid not in TIME_TYPES"),
    _off("keys.epoch-whole-days", _G, "seconds % DAY_SECONDS", "keys"),
    Site("keys.epoch-cells", _G, "    if count > scope.table.policy.max_cells:\n        raise _too_many(scope, what, count)",
         "    if False:\n        raise _too_many(scope, what, count)", "keys"),
    _off("keys.bin-declared", _G,
         "policy is None or policy.bounds is None or policy.group_by is not True or column.type_oid not in NUMERIC_TYPES",
         "keys", "policy is None or policy.bounds is None"),
    Site("keys.bin-count-positive", _G, "and int(count.this) >= 1):", "and int(count.this) >= 0):", "keys"),
    _off("keys.bin-bounds-differ", _G, "lo == hi", "keys"),
    _off("keys.bin-cells", _G, "n + 2 > scope.table.policy.max_cells", "keys"),
    _off("keys.bin-bounds-finite", _G, "not math.isfinite(value) or abs(value) > 1e300", "keys",
         "not math.isfinite(value)"),
    Site("keys.bin-nan-in-no-cell", _G,
         "return f\"CASE WHEN {operator(name, '=', literal('NaN'))} THEN NULL ELSE {bucket} END\"", "return bucket",
         "keys"),
    Site("keys.time-bucket-within-range", _G,
         'return f"CASE WHEN {within} THEN pg_catalog.date_trunc({literal(self.unit)}, {source}) END"',
         'return f"pg_catalog.date_trunc({literal(self.unit)}, {source})"', "keys"),
    Site("keys.epoch-bucket-within-range", _G, 'return f"CASE WHEN {within} THEN {index} END"', "return index", "keys"),
    Site("keys.integer-cell-within-bounds", _G,
         "return f\"CASE WHEN {operator(row, '>=', lo)} AND {operator(row, '<=', hi)} THEN {row} END\"",
         "return row", "keys"),
    Site("keys.category-undeclared-no-cell", _G,
         'other = f" ELSE {len(policy.categories)}" if policy.other is not None else ""\n            return f"CASE',
         'other = f" ELSE {len(policy.categories)}"\n            return f"CASE', "keys"),
    Site("keys.time-cell-in-range", _G,
         'datetime.fromisoformat(value.decode("ascii")))\n            return index if 0 <= index < self.count else None',
         'datetime.fromisoformat(value.decode("ascii")))\n            return index', "keys"),
    Site("keys.epoch-cell-in-range", _G,
         "return index if 0 <= index < self.count else None\n        return int(value)",
         "return index\n        return int(value)", "keys"),
    Site("keys.joint-cells-exceeded", "rewriter/key_domain.py", "exceeded = exceeded or cells.exceeded",
         "exceeded = exceeded", "keys"),
    Site("keys.max-cells", _D, "    if plan.cells <= limit:\n", "    if True:\n", "keys"),
    # ------------------------------------------------------------------ rewriter/dp_query.py
    Site("dpq.one-select", _D, "    if not isinstance(tree, exp.Select):\n        raise scope.refuse(*_set",
         "    if False:\n        raise scope.refuse(*_set", "dp_query"),
    _off("dpq.no-grouping-sets", _D, 'any(group.args.get(key) for key in ("grouping_sets", "cube", "rollup", "totals")) or group.find(\n        exp.GroupingSets, exp.Cube, exp.Rollup\n    )',
         "keys"),
    Site("dpq.no-aggregate-in-group-by", _D, "        if node.find(exp.AggFunc) is not None:\n            raise Refusal(\"42803\"",
         "        if False:\n            raise Refusal(\"42803\"", "keys"),
    _off("dpq.group-by-key-form", _D, "not key_form(item)", "keys"),
    _off("dpq.distinct-with-sample-aggregate", _D, 'any(agg.mechanism == "sample_aggregate" for agg in aggregates)',
         "dp_query"),
    Site("dpq.distinct-with-other-key", _D,
         '    if any(key.kind == "category" and key.column.policy is not None and key.column.policy.other is not None',
         '    if False and any(key.kind == "category" and key.column.policy is not None and key.column.policy.other is not None',
         "keys"),
    _off("dpq.distinct-per-date-part", _D, 'any(key.part not in (None, "date") for key in groups)', "keys"),
    _off("dpq.known-clauses", _D,
         'not value or key in ("expressions", "from_", "where", "group", "having", "limit", "offset", "order", "kind")',
         "dp_query", "True"),
    _off("dpq.no-join", _D,
         'source is None or not isinstance(source.this, exp.Table) or source.this.args.get("joins")', "dp_query",
         "source is None or not isinstance(source.this, exp.Table)"),
    _off("dpq.no-tablesample", _D, 'source.this.args.get("sample") is not None', "dp_query"),
    _off("dpq.no-subquery", _D,
         "isinstance(node, (exp.Subquery, exp.Exists)) or (isinstance(node, exp.Select) and node is not tree)",
         "dp_query"),
    Site("dpq.no-window", _D, "        if isinstance(node, exp.Window):\n            raise",
         "        if False:\n            raise", "dp_query"),
    _off("dpq.no-star", _D, "isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))",
         "dp_query"),
    _off("dpq.count-distinct-builtin", _D, "not counted.builtin", "dp_query"),
    _off("dpq.count-distinct-countable", _D, "not counted.distinct_countable", "dp_query"),
    Site("dpq.cast-widening", _D, "    if target in _WIDER.get(column.type_oid, set()):\n        return",
         "    if True:\n        return", "dp_query"),
    Site("dpq.grouped-mechanism", _D, "    if grouped:\n        raise Refusal(", "    if False:\n        raise Refusal(",
         "keys"),
    _off("dpq.delta-required", _D, "scope.table.policy.delta <= 0", "dp_query"),
    Site("dpq.numeric-argument", _D, "    if column.type_oid not in NUMERIC_TYPES:\n        refusal",
         "    if False:\n        refusal", "dp_query"),
    Site("dpq.bounds-required", _D, "    if column.policy is None or column.policy.bounds is None:\n        raise Refusal(",
         "    if False:\n        raise Refusal(", "dp_query"),
    _off("dpq.bounds-not-too-large", _D, "limit is not None and column.policy.sensitivity > limit", "dp_query"),
    Site("dpq.mode-categories-required", _D,
         "    if column.policy is None or column.policy.categories is None:\n        raise Refusal(",
         "    if False:\n        raise Refusal(", "dp_query"),
    Site("dpq.fetch-first-only", _D,
         '        if limit.args.get("direction", "FIRST").upper() not in ("FIRST", "NEXT") or (\n'
         '            options is not None and (options.args.get("percent") or options.args.get("with_ties"))\n'
         "        ):", "        if False:", "dp_query"),
    _off("dpq.limit-bigint", _D, "len(digits) > 19 or int(digits) >= 2**63", "dp_query"),
    Site("dpq.limit-zero-no-charge", _D, "    return rows == 0 or (not grouped and (skipped or 0) > 0)",
         "    return False", "dp_query"),
    # ------------------------------------------------------------------ proxy/backend/type_support.py
    Site("types.builtin-excludes-foreign", "proxy/backend/type_support.py", "return frozenset(known - foreign)",
         "return frozenset(known)", "types"),
    Site("types.distinct-countable", "proxy/backend/type_support.py",
         "        if await _parses(session, sql) is None:\n            countable",
         "        if True:\n            countable", "types"),
    Site("types.label-comparison", "proxy/backend/type_support.py",
         '    comparison = operator("x", "=", literal(label))\n', "    return None\n", "types"),
    # ------------------------------------------------------------------ proxy/backend/row_failures.py
    Site("rows.unrecorded-function", _R, '            yield f"an operator whose function is not recorded',
         '            return\n            yield f"an operator whose function is not recorded', "relation"),
    _off("rows.scalar-subquery", _R, 'fields.get("subLinkType") not in _TOTAL_SUBLINKS', "relation"),
    _off("rows.cast-through-text", _R, 'fields.get("resulttype") not in _TEXT_TYPES', "relation"),
    _off("rows.multidimensional-array", _R, 'fields.get("multidims") != "false"', "relation"),
    _off("rows.recursive-with", _R, 'fields.get("cterecursive") != "false"', "relation"),
    _off("rows.greatest-of-rows", _R,
         'fields.get("minmaxtype") in _RECORD_TYPES or not fields.get("minmaxtype", "").isdigit()', "relation"),
    Site("rows.unknown-node", _R, "    elif tag not in _STRUCTURAL:", "    elif False:", "relation"),
    _off("rows.builtin-function", _R, "not builtin or _POLYMORPHIC.search(name) or not total", "relation",
         "_POLYMORPHIC.search(name) or not total"),
    _off("rows.polymorphic-comparison", _R, "not builtin or _POLYMORPHIC.search(name) or not total", "relation",
         "not builtin or not total"),
    _off("rows.total-function", _R, "not builtin or _POLYMORPHIC.search(name) or not total", "relation",
         "not builtin or _POLYMORPHIC.search(name)"),
    Site("rows.foreign-table", _R, "_FOREIGN if text is None else _scan(text)", '_scan(text or "")', "relation"),
    # ------------------------------------------------------------------ proxy/backend/relation_reads.py
    Site("reads.public-reads-protected", _RR, "reads = await session.fetch_all(_READS_SQL, (True, True, public, protected))",
         "reads = []", "reads"),
    Site("reads.public-child-of-protected", _RR,
         "rows_of = await session.fetch_all(_READS_SQL, (False, False, protected, public))", "rows_of = []", "reads"),
    Site("reads.public-opaque", _RR, "opaque = await session.fetch_all(_OPAQUE_SQL, (True, True, public))",
         "opaque = []", "reads"),
    Site("reads.through-views", _RR, "(True, True, public, protected)", "(False, True, public, protected)", "reads"),
    Site("reads.through-policies", _RR, "(True, True, public, protected)", "(True, False, public, protected)",
         "reads"),
    Site("reads.opaque-functions", _RR, "    WHERE n.nspname OPERATOR(pg_catalog.<>) ALL",
         "    WHERE false AND n.nspname OPERATOR(pg_catalog.<>) ALL", "reads"),
    Site("reads.opaque-foreign", _RR, "    WHERE c.relkind OPERATOR(pg_catalog.=) 'f'", "    WHERE false", "reads"),
    # ------------------------------------------------------------------ proxy/serving/settings.py
    _off("eps.positive-finite", _S, "not (epsilon > 0 and math.isfinite(epsilon))", "settings"),
    _off("eps.minimum", _S, "epsilon < MIN_EPSILON", "settings"),
    _off("eps.maximum", _S, "epsilon > maximum", "settings"),
    Site("eps.user-cap", _S, "for cap in (policy.user(self.user).max_query_epsilon, self.epsilon):",
         "for cap in (self.epsilon,):", "settings"),
    Site("eps.session-cap", _S, "for cap in (policy.user(self.user).max_query_epsilon, self.epsilon):",
         "for cap in (policy.user(self.user).max_query_epsilon,):", "settings"),
    _off("eps.failed-transaction", _S, 'status == b"E"', "settings"),
    _off("eps.savepoint-room", _S, "self._epsilon.savepoints >= MAX_SAVEPOINTS", "settings"),
    Site("eps.startup-checked", _S, "self._default = self._checked(given[-1], policy)",
         "self._default = float(given[-1])", "settings"),
    # ------------------------------------------------------------------ variances
    _off("var.bounds-too-large", _D, "kind in VARIANCES and column.policy.sensitivity > MAX_ABS_VARIANCE_BOUND",
         "variance"),
    Site("var.two-arguments", _D, "        if call.name.upper() in VARIANCE_FUNCTIONS:\n",
         "        if False:\n", "variance"),
)
