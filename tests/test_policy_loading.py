"""Policy files: validation errors name the file, the line, the key and what is wrong."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from policies.loader import PolicyError, load_policy, parse_policy
from policies.time_buckets import answered_units

GOOD = """\
backend:
  dsn: postgresql://svc@localhost/db
users:
  analyst:
    password: secret
    budget: {epsilon: 10}
tables:
  public.adult:
    epsilon: 0.5
    columns:
      age: {bounds: [17, 90]}
      sex: {categories: [Male, Female]}
  lookup:
    access: public
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    return info.value.problems


def test_a_valid_policy_loads_with_defaults():
    policy = parse_policy(GOOD)
    table = policy.tables["public.adult"]
    assert table.access == "protected" and table.epsilon == 0.5
    assert table.columns["age"].sensitivity == 90
    assert policy.listen.port == 6432 and policy.listen.host == "127.0.0.1"


def test_a_password_users_scram_keys_are_those_of_its_password_and_an_md5_user_has_none():
    from scramp import ScramMechanism

    policy = parse_policy(GOOD.replace("users:\n", "users:\n  hashed:\n    password: other\n    auth: md5\n"
                                                   "    budget: {epsilon: 1}\n"))
    salt, stored_key, server_key, iterations = policy.users["analyst"].scram_keys
    assert (salt, stored_key, server_key, iterations) == ScramMechanism().make_auth_info("secret", iterations, salt)
    with pytest.raises(AssertionError):
        policy.users["hashed"].scram_keys


def test_unknown_key_is_named_with_its_line():
    problems = _problems(GOOD.replace("    epsilon: 0.5", "    epsilon: 0.5\n    epsilom: 3"))
    assert problems == ["p.yaml:10: tables.public.adult.epsilom: unknown key (did you mean epsilon? see docs/policy.md)"]


@pytest.mark.parametrize("typo, meant", [
    ("  schma: s", "schema"),                  # ledger: a key under its alias
    ("  ur1: sqlite:///x", "url"),
    ("  totally_else: 1", None),               # nothing close: no guess
])
def test_a_mistyped_key_is_answered_with_the_key_it_meant(typo: str, meant: str | None):
    problems = _problems(GOOD + "ledger:\n" + typo + "\n")
    advice = f"did you mean {meant}?" if meant else "check the spelling;"
    assert problems == [f"p.yaml:{GOOD.count(chr(10)) + 2}: ledger.{typo.split(':')[0].strip()}: "
                        f"unknown key ({advice} see docs/policy.md)"]


def test_a_mistyped_key_in_a_named_entry_is_matched_against_that_entrys_keys():
    text = (GOOD.replace("      age: {bounds: [17, 90]}", "      age: {bound: [17, 90]}")
                .replace("    password: secret", "    pasword: secret"))
    assert [problem.split(": ", 1)[1] for problem in _problems(text)] == [
        "users.analyst.pasword: unknown key (did you mean password? see docs/policy.md)",
        "tables.public.adult.columns.age.bound: unknown key (did you mean bounds? see docs/policy.md)",
    ]


def test_inverted_bounds_are_refused_at_their_line():
    (problem,) = _problems(GOOD.replace("[17, 90]", "[90, 17]"))
    assert problem.startswith("p.yaml:11: tables.public.adult.columns.age:")
    assert "lo <= hi" in problem


def test_a_dsn_libpq_cannot_parse_is_refused_at_its_line():
    (problem,) = _problems(GOOD.replace("postgresql://svc@localhost/db", "host=db port"))
    assert problem == 'p.yaml:2: backend.dsn: not a valid connection string: missing "=" after "port" in connection info string'


def test_a_malformed_dsn_is_refused_without_quoting_its_password(monkeypatch: pytest.MonkeyPatch):
    (problem,) = _problems(GOOD.replace("postgresql://svc@localhost/db", "postgresql://svc:pa%zzss@db/x"))
    assert problem == ("p.yaml:2: backend.dsn: not a valid connection string: "
                       "(libpq's message is not shown: it contains the password)")
    monkeypatch.setenv("DPPROXY_TEST_DSN_ENV", "postgresql://svc:pa%zzss@db/x")
    (problem,) = _problems(GOOD.replace("  dsn: postgresql://svc@localhost/db", "  dsn_env: DPPROXY_TEST_DSN_ENV"))
    assert problem == ("p.yaml:1: backend: environment variable DPPROXY_TEST_DSN_ENV (named by dsn_env): not a valid "
                       "connection string: (libpq's message is not shown: it contains the password)")


def test_a_policy_file_that_is_not_utf8_is_refused_at_the_line_of_the_byte(tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_bytes(GOOD.replace("secret", "s\xe9cret").encode("latin-1"))
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.problems == [f"{path}:5: the policy file is not UTF-8 text (byte 0xe9); save it as UTF-8"]


def test_missing_backend_is_reported():
    (problem,) = _problems(GOOD.split("users:")[0].replace("backend:\n  dsn: postgresql://svc@localhost/db\n", "") + "users:" + GOOD.split("users:")[1])
    assert problem == "p.yaml:1: backend: required key is missing"


def test_protected_table_without_epsilon_is_refused():
    (problem,) = _problems(GOOD.replace("    epsilon: 0.5\n", ""))
    assert "tables.public.adult" in problem and "needs epsilon" in problem


def test_epsilon_from_breach_probabilities_and_refusal_when_posterior_not_above_prior():
    policy = parse_policy(GOOD.replace("epsilon: 0.5", "prior: 0.2\n    posterior: 0.5"))
    assert math.isclose(policy.tables["public.adult"].epsilon, math.log(4))
    (problem,) = _problems(GOOD.replace("epsilon: 0.5", "prior: 0.5\n    posterior: 0.2"))
    assert "tables.public.adult" in problem


def test_password_from_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ANALYST_PW", "from-env")
    policy = parse_policy(GOOD.replace("password: secret", "password_env: ANALYST_PW"))
    assert policy.users["analyst"].password == "from-env"
    monkeypatch.delenv("ANALYST_PW")
    (problem,) = _problems(GOOD.replace("password: secret", "password_env: ANALYST_PW"))
    assert "ANALYST_PW" in problem and "users.analyst" in problem


def test_an_empty_variable_is_named_as_empty_not_as_a_missing_key(monkeypatch: pytest.MonkeyPatch):
    # Was "a user needs password, password_env or scram_verifier" of a user that names password_env.
    monkeypatch.setenv("ANALYST_PW", "")
    (problem,) = _problems(GOOD.replace("password: secret", "password_env: ANALYST_PW"))
    assert problem == "p.yaml:4: users.analyst: environment variable ANALYST_PW (named by password_env) is empty"
    monkeypatch.setenv("DPPROXY_TEST_DSN_ENV", "")
    (problem,) = _problems(GOOD.replace("  dsn: postgresql://svc@localhost/db", "  dsn_env: DPPROXY_TEST_DSN_ENV"))
    assert problem == "p.yaml:1: backend: environment variable DPPROXY_TEST_DSN_ENV (named by dsn_env) is empty"


def test_invalid_yaml_names_the_line():
    (problem,) = _problems(GOOD.replace("budget: {epsilon: 10}", "budget: {epsilon: 10"))
    assert problem.startswith("p.yaml:") and "not valid YAML" in problem


def test_missing_file_is_a_policy_error(tmp_path: Path):
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "absent.yaml")


def test_check_config_command_exit_codes(tmp_path: Path):
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("[17, 90]", "[90, 17]"))
    ok = subprocess.run([sys.executable, "-m", "proxy.cli", "check-config", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0 and "OK" in ok.stdout
    failed = subprocess.run([sys.executable, "-m", "proxy.cli", "check-config", str(bad)], capture_output=True, text=True)
    assert failed.returncode == 1
    assert f"{bad}:11: tables.public.adult.columns.age:" in failed.stderr


def test_duplicate_key_is_an_error_at_its_line_not_a_silent_override():
    problems = _problems(GOOD.replace("    epsilon: 0.5", "    epsilon: 1\n    epsilon: 100"))
    assert len(problems) == 1
    assert problems[0].startswith("p.yaml:10: tables.public.adult.epsilon: duplicate key (first given at line 9)")


def test_duplicate_key_in_a_flow_mapping_or_quoted_is_an_error():
    (flow,) = _problems(GOOD.replace("{epsilon: 10}", "{epsilon: 10, epsilon: 1000}"))
    assert flow.startswith("p.yaml:6: users.analyst.budget.epsilon: duplicate key")
    (quoted,) = _problems(GOOD.replace("    epsilon: 0.5", '    epsilon: 0.5\n    "epsilon": 50'))
    assert quoted.startswith("p.yaml:10: tables.public.adult.epsilon: duplicate key")


def test_duplicate_top_level_section_is_an_error():
    (problem,) = _problems(GOOD + "tables:\n  lookup: {access: public}\n")
    assert problem.startswith("p.yaml:15: tables: duplicate key (first given at line 7)")


def test_a_merge_key_may_still_be_overridden():
    text = GOOD.replace("    budget: {epsilon: 10}", "    budget:\n      <<: &b {epsilon: 10}\n      epsilon: 5")
    assert parse_policy(text).users["analyst"].budget.epsilon == 5


def test_check_config_refuses_a_duplicate_key(tmp_path: Path):
    path = tmp_path / "dup.yaml"
    path.write_text(GOOD.replace("    epsilon: 0.5", "    epsilon: 1\n    epsilon: 100"))
    run = subprocess.run([sys.executable, "-m", "proxy.cli", "check-config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert f"{path}:10: tables.public.adult.epsilon: duplicate key" in run.stderr


@pytest.mark.parametrize("entry, message", [
    ("{group_by: true}", "group_by needs a declared domain"),
    ("{bounds: [2021-01-01, 5], group_by: true}", "a time range needs two dates or timestamps"),
    ("{bounds: ['2021-01-01T00:00:00+02:00', 2024-12-31]}", "time bounds are wall-clock times without a time zone"),
    ("{bounds: [2024-12-31, 2021-01-01], group_by: [month]}", "time bounds must have lo <= hi"),
    ("{bounds: [0, 9], group_by: [month]}", "group_by: [units] is for a time range"),
    ("{bounds: [2021-01-01, 2024-12-31], group_by: [month, month]}", "without repeats"),
    ("{bounds: [2021-01-01, 2024-12-31], group_by: [hour]}", "unknown time unit 'hour' (one of day, week, month, quarter, year; a day is the finest"),
    ("{categories: [a, b], group_by: yes please}", "group_by: give true, false or a list of time units"),
    ("{categories: [a, b], other: z}", "other names the GROUP BY key of undeclared values"),
    ("{categories: [a, b], group_by: true, other: a}", "must not be one of the declared categories"),
])
def test_a_group_by_opt_in_without_a_usable_domain_is_refused_at_its_line(entry: str, message: str):
    (problem,) = _problems(GOOD.replace("{categories: [Male, Female]}", entry))
    assert problem.startswith("p.yaml:12: tables.public.adult.columns.sex"), problem
    assert message in problem, problem


@pytest.mark.parametrize("entry, over", [
    ("{bounds: [2021-01-01, 2024-12-31], group_by: true}", "day (1461)"),
    ("{bounds: [2000-01-01, 2099-12-31], group_by: [month, year]}", "month (1200)"),
    ("{categories: [" + ", ".join(f"c{i}" for i in range(1001)) + "], group_by: true}", "categories (1001)"),
])
def test_a_group_by_domain_over_the_cell_cap_is_refused(entry: str, over: str):
    (problem,) = _problems(GOOD.replace("{categories: [Male, Female]}", entry))
    # At the column's line and key; it was the table's line, "tables.public.adult: columns.sex: ...".
    assert problem.startswith("p.yaml:12: tables.public.adult.columns.sex: group_by has more cells than max_cells 1000")
    assert over in problem, problem
    assert "raise max_cells or narrow the domain" in problem
    assert ("or list a coarser unit" in problem) == ("categories" not in over)


@pytest.mark.parametrize("listed, answered", [
    (("month",), ("month", "quarter", "year")),
    (("quarter",), ("quarter", "year")),
    (("week",), ("week",)),  # a week straddles months, quarters and years
    (("day",), ("day", "week", "month", "quarter", "year")),
    (("year", "week"), ("week", "year")),
])
def test_a_listed_unit_answers_the_coarser_units_nested_in_it(listed, answered):
    assert answered_units(listed) == answered


def test_max_cells_raises_the_cap_and_is_itself_bounded():
    entry = "{bounds: [2021-01-01, 2024-12-31], group_by: true}"
    policy = parse_policy(GOOD.replace("{categories: [Male, Female]}", entry)
                          .replace("    epsilon: 0.5", "    epsilon: 0.5\n    max_cells: 2000"))
    sex = policy.tables["public.adult"].columns["sex"]
    assert sex.time_units == ("day", "week", "month", "quarter", "year") and sex.bucket_count("day") == 1461
    (problem,) = _problems(GOOD.replace("    epsilon: 0.5", "    epsilon: 0.5\n    max_cells: 100001"))
    assert problem == "p.yaml:10: tables.public.adult.max_cells: Input should be less than or equal to 100000"


def test_a_time_range_and_its_units_load():
    policy = parse_policy(GOOD.replace("{categories: [Male, Female]}",
                                       "{bounds: [2021-01-01, '2024-12-31 23:59:59'], group_by: [month, year]}"))
    column = policy.tables["public.adult"].columns["sex"]
    assert column.bounds is None and column.time_bounds is not None
    assert column.time_bounds[1].isoformat() == "2024-12-31T23:59:59"
    assert column.listed_units == ("month", "year") and column.bucket_count("month") == 48
    assert column.time_units == ("month", "quarter", "year")  # quarter is nested in month


def test_backend_pool_keys_have_documented_defaults_and_are_checked_at_their_line():
    pool = parse_policy(GOOD).backend.pool
    assert (pool.size, pool.checkout_timeout_s, pool.idle_timeout_s) == (20, 30.0, 300.0)
    text = GOOD.replace("  dsn: postgresql://svc@localhost/db\n",
                        "  dsn: postgresql://svc@localhost/db\n  pool:\n    size: 0\n    checkout_timout_s: 5\n")
    assert _problems(text) == [
        "p.yaml:4: backend.pool.size: Input should be greater than or equal to 1",
        "p.yaml:5: backend.pool.checkout_timout_s: unknown key (did you mean checkout_timeout_s? see docs/policy.md)",
    ]


def test_avg_defaults_to_sum_count_and_a_column_may_override_the_table():
    table = parse_policy(GOOD).tables["public.adult"]
    assert table.avg == "sum_count" and table.avg_method("age") == "sum_count"
    table = parse_policy(GOOD.replace("{bounds: [17, 90]}", "{bounds: [17, 90], avg: sample_aggregate}")).tables["public.adult"]
    assert table.avg == "sum_count" and table.avg_method("age") == "sample_aggregate"
    table = parse_policy(GOOD.replace("    epsilon: 0.5", "    epsilon: 0.5\n    avg: sample_aggregate")
                         .replace("{bounds: [17, 90]}", "{bounds: [17, 90], avg: sum_count}")).tables["public.adult"]
    assert table.avg == "sample_aggregate" and table.avg_method("age") == "sum_count"


@pytest.mark.parametrize("old, new, where, message", [
    ("{categories: [Male, Female]}", "{categories: [Male, Female], avg: sum_count}", "p.yaml:12: tables.public.adult.columns.sex",
     "avg is how AVG of a numeric column is answered: it needs bounds: [lo, hi] of numbers"),
    ("{bounds: [17, 90]}", "{bounds: [17, 90], avg: median}", "p.yaml:11: tables.public.adult.columns.age.avg",
     "Input should be 'sample_aggregate' or 'sum_count'"),
    ("    epsilon: 0.5\n    columns:\n      age: {bounds: [17, 90]}",
     "    epsilon: 0.5\n    delta: 0\n    columns:\n      age: {bounds: [17, 90], avg: sample_aggregate}",
     "p.yaml:12: tables.public.adult.columns.age: ",  # the column's line, not the table's
     "avg: sample_aggregate is (ε, δ)-DP and needs the table's delta > 0"),
])
def test_a_column_avg_that_cannot_be_answered_is_refused_at_its_line(old: str, new: str, where: str, message: str):
    (problem,) = _problems(GOOD.replace(old, new))
    assert problem.startswith(where), problem
    assert message in problem, problem


@pytest.mark.parametrize("before, after, expected", [
    ("age: {bounds: [17, 90]}", "age: {bounds: [17]}",
     "tables.public.adult.columns.age.bounds: too few values: got [17]; give bounds: [lo, hi]"),
    ("age: {bounds: [17, 90]}", "age: {bounds: [17, 90, 99]}",
     "tables.public.adult.columns.age.bounds: too many values: got [17, 90, 99]; give bounds: [lo, hi]"),
    ("age: {bounds: [17, 90]}", "age: {bounds: 90}",
     "tables.public.adult.columns.age.bounds: give a list in brackets (bounds: [lo, hi]); got a number"),
    ("sex: {categories: [Male, Female]}", "sex: {categories: Male}",
     "tables.public.adult.columns.sex.categories: give a list in brackets (categories: [a, b, c]); got a single value"),
    ("  lookup:\n    access: public\n", "  lookup:\n", "tables.lookup: give its entries as indented key: value lines "
                                                     "under it; got nothing"),
])
def test_a_value_of_the_wrong_shape_is_told_in_plain_words(before: str, after: str, expected: str):
    # pydantic said "bounds.1: required key is missing", "Input should be a valid tuple",
    # "Input should be a valid dictionary".
    assert [problem.split(": ", 1)[1] for problem in _problems(GOOD.replace(before, after))] == [expected]


def test_a_password_yaml_reads_as_a_number_is_told_to_be_quoted_and_never_shown():
    problems = _problems(GOOD.replace("    password: secret", "    password: 904517"))
    assert problems == ["p.yaml:5: users.analyst.password: give text; YAML read this value as a number: "
                        "put it in quotes"]
    assert "904517" not in problems[0]
