"""``dpproxy epsilon`` and ``dpproxy risk``: the formula and worked example of Ouyang, Yin and Liu,
"Limiting Privacy Breaches in Differential Privacy", from the command line."""

from __future__ import annotations

import math
import re

import pytest

from proxy.cli.main import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_epsilon_prints_ln_of_the_odds_ratio_and_what_it_protects(capsys):
    code, out, _ = _run(capsys, "epsilon", "--prior", "0.2", "--posterior", "0.5")
    assert code == 0
    first, sentence = out.strip().split("\n")
    assert float(first.removeprefix("epsilon = ")) == pytest.approx(math.log(4), rel=1e-5)
    assert "20%" in sentence and "50%" in sentence
    assert "value of a row" in sentence and "0.6931" in sentence  # substitution needs ε/2


def test_epsilon_refuses_a_posterior_not_above_the_prior(capsys):
    code, out, err = _run(capsys, "epsilon", "--prior", "0.5", "--posterior", "0.2")
    assert code == 2 and not out
    assert "prior < posterior" in err


def test_epsilon_inverse_gives_the_largest_posterior_for_a_prior(capsys):
    code, out, _ = _run(capsys, "epsilon", "--prior", "0.2", "--epsilon", str(math.log(4)))
    assert code == 0
    assert float(out.split("\n")[0].removeprefix("posterior <= ")) == pytest.approx(0.5, abs=1e-4)


def test_risk_reproduces_ouyang_yin_liu_table_i_with_the_candidate_2_row_corrected(capsys):
    code, out, _ = _run(
        capsys, "risk", "--known", "1,2,3", "--candidates", "1,2,3,5,10",
        "--query", "avg", "--epsilon", "2", "--observed", "5.041",
    )
    assert code == 0
    assert "2.25/2 = 1.125" in out
    rows = {m[0]: m[1:] for m in re.findall(r"^\s+(\d+)\s+\S+\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$", out, re.M)}
    # noise, density, posterior, worst case. The paper prints 3.401 / 0.0216 for candidate 2.
    assert rows["2"][:3] == ("3.041", "0.0298", "0.0916")
    assert {c: float(r[2]) for c, r in rows.items()} == {
        "1": 0.0734, "2": 0.0916, "3": 0.1144, "5": 0.1785, "10": 0.5421
    }
    assert rows["10"][3] == "0.5421"  # the answer already sits at 10's worst case


def test_risk_without_an_observed_answer_shows_worst_cases_within_the_lpb_bound(capsys):
    code, out, _ = _run(
        capsys, "risk", "--known", "1,2,3", "--candidates", "1,2,3,5,10",
        "--epsilon", str(math.log(4)),
    )
    assert code == 0
    worst = [float(w) for w in re.findall(r"^\s+\d+\s+\S+\s+(\S+)$", out, re.M)]
    assert len(worst) == 5 and max(worst) <= 0.5 + 1e-4  # ε = ln 4 keeps a 20% prior below 50%


def test_risk_rejects_a_query_that_does_not_depend_on_the_missing_row(capsys):
    code, _, err = _run(capsys, "risk", "--known", "1,2", "--candidates", "5", "--epsilon", "1")
    assert code == 2 and "does not depend" in err
