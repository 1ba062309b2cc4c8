"""Choosing ε from breach probabilities: the formulas of Ouyang, Yin and Liu, "Limiting Privacy
Breaches in Differential Privacy", and its worked example (Table I)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mechanisms.breach import (
    answer_log_likelihoods,
    bayes_posterior,
    epsilon_from_breach,
    explain_epsilon,
    informed_sensitivity,
    posterior_bound,
    posterior_probabilities,
    worst_case_posteriors,
)

# Table I: D = {1, 2, 3, 10}, the adversary knows {1, 2, 3}, U = {1, 2, 3, 5, 10}, query = mean,
# ε = 2, observed answer r = 5.041 (the table header prints 5.401; the text and the noise
# column use 5.041).
KNOWN = [1.0, 2.0, 3.0]
CANDIDATES = [1, 2, 3, 5, 10]
EPSILON = 2.0
OBSERVED = 5.041


def test_table_i_sensitivity_is_the_spread_of_the_mean_over_candidates() -> None:
    assert informed_sensitivity(KNOWN, CANDIDATES, "avg") == pytest.approx(16 / 4 - 7 / 4)
    assert informed_sensitivity(KNOWN, CANDIDATES, "avg") / EPSILON == pytest.approx(1.125)


def test_table_i_likelihoods_match_the_paper() -> None:
    densities = {
        c: math.exp(v)
        for c, v in answer_log_likelihoods(KNOWN, CANDIDATES, "avg", EPSILON, OBSERVED).items()
    }
    for candidate, printed in [(1, 0.0238), (3, 0.0372), (5, 0.0580), (10, 0.1762)]:
        assert round(densities[candidate], 4) == printed
    # The paper's row for 2 uses the noise 3.401 where 5.041 − 2 = 3.041 (digits swapped):
    # its printed 0.0216 is the density at 3.401, the right value is 0.0298.
    assert round(math.exp(-3.401 / 1.125) / (2 * 1.125), 4) == 0.0216
    assert round(densities[2], 4) == 0.0298


def test_table_i_bayes_step_reproduces_the_printed_posteriors() -> None:
    printed_densities = {1: 0.0238, 2: 0.0216, 3: 0.0372, 5: 0.0580, 10: 0.1762}
    posterior = bayes_posterior(
        {c: 0.2 for c in CANDIDATES}, {c: math.log(d) for c, d in printed_densities.items()}
    )
    printed = {1: 0.0751, 2: 0.0682, 3: 0.1174, 5: 0.1831, 10: 0.5562}
    assert {c: round(p, 4) for c, p in posterior.items()} == printed


def test_table_i_corrected_posteriors_still_breach_rho_0_2_to_0_5() -> None:
    posterior = posterior_probabilities(KNOWN, CANDIDATES, "avg", EPSILON, OBSERVED)
    assert {c: round(p, 4) for c, p in posterior.items()} == {
        1: 0.0734, 2: 0.0916, 3: 0.1144, 5: 0.1785, 10: 0.5421
    }
    # The paper's conclusion: with ρ1 = 0.2, ρ2 = 0.5 this ε = 2 mean is not (ρ1, ρ2)-private.
    assert posterior[10] > 0.5


def test_table_i_answer_is_already_the_worst_case_for_the_true_value() -> None:
    # r = 5.041 lies beyond mean(D_10) = 4, where the posterior of 10 has reached its maximum.
    worst = worst_case_posteriors(KNOWN, CANDIDATES, "avg", EPSILON)
    assert worst[10] == pytest.approx(0.5421, abs=5e-5)
    assert worst[10] <= posterior_bound(0.2, EPSILON)
    assert posterior_bound(0.2, EPSILON) == pytest.approx(0.6488, abs=5e-5)


def test_lpb_epsilon_removes_the_table_i_breach() -> None:
    epsilon = epsilon_from_breach(0.2, 0.5)
    assert epsilon == pytest.approx(math.log(4.0))
    worst = worst_case_posteriors(KNOWN, CANDIDATES, "avg", epsilon)
    assert max(worst.values()) <= 0.5 + 1e-12


def test_epsilon_from_breach_formula() -> None:
    assert epsilon_from_breach(0.01, 0.5) == pytest.approx(math.log(99.0))
    assert epsilon_from_breach(0.1, 0.9) == pytest.approx(math.log(81.0))


def test_prior_of_one_over_u_gives_differential_identifiability() -> None:
    # §IV: ρ1 = 1/m yields λ ≥ Δ / ln((m − 1)ρ2 / (1 − ρ2)).
    for m, rho2 in [(5, 0.5), (73, 0.2), (99, 0.9)]:
        assert epsilon_from_breach(1 / m, rho2) == pytest.approx(math.log((m - 1) * rho2 / (1 - rho2)))


def test_figure_1_noise_grows_with_the_prior_at_posterior_one_half() -> None:
    scales = [1.0 / epsilon_from_breach(p / 100, 0.5) for p in range(1, 11)]
    assert scales == sorted(scales) and len(set(scales)) == len(scales)


@pytest.mark.parametrize(
    ("lo", "hi", "printed"),
    [(17, 90, 0.0015), (1, 99, 0.0020)],  # Table II: age, hours-per-week
)
def test_table_ii_mean_sensitivity_over_48842_rows(lo: int, hi: int, printed: float) -> None:
    known = [float(lo)] * 48841
    assert round(informed_sensitivity(known, range(lo, hi + 1), "avg"), 4) == printed


@pytest.mark.parametrize(
    ("prior", "posterior"),
    [(0.5, 0.5), (0.6, 0.5), (0.0, 0.5), (0.2, 1.0), (-0.1, 0.5), (0.2, 1.5)],
)
def test_epsilon_from_breach_rejects_anything_but_0_lt_prior_lt_posterior_lt_1(
    prior: float, posterior: float
) -> None:
    with pytest.raises(ValueError):
        epsilon_from_breach(prior, posterior)


@given(
    st.floats(1e-6, 0.999),
    st.floats(1e-6, 0.999),
)
def test_posterior_bound_inverts_epsilon_from_breach(a: float, b: float) -> None:
    prior, posterior = sorted((a, b))
    if not prior < posterior:
        return
    epsilon = epsilon_from_breach(prior, posterior)
    assert posterior_bound(prior, epsilon) == pytest.approx(posterior, rel=1e-9)


@given(
    known=st.lists(st.integers(-100, 100), min_size=0, max_size=6),
    candidates=st.lists(st.integers(-100, 100), min_size=2, max_size=6, unique=True),
    epsilon=st.floats(0.05, 5.0),
    observed=st.floats(-300, 300),
)
def test_no_answer_pushes_a_posterior_past_the_bounds(
    known: list[int], candidates: list[int], epsilon: float, observed: float
) -> None:
    posterior = posterior_probabilities(known, candidates, "sum", epsilon, observed)
    worst = worst_case_posteriors(known, candidates, "sum", epsilon)
    bound = posterior_bound(1 / len(candidates), epsilon)
    for c in candidates:
        assert posterior[c] <= worst[c] * (1 + 1e-9) + 1e-12
        assert worst[c] <= bound * (1 + 1e-9)


def test_membership_candidate_none_means_no_row() -> None:
    # Is the person in the data? COUNT moves by 1, so ε = ln γ bounds the posterior by ρ2.
    epsilon = epsilon_from_breach(0.3, 0.6)
    worst = worst_case_posteriors([7.0] * 10, [None, 7.0], "count", epsilon, prior={None: 0.7, 7.0: 0.3})
    assert worst[7.0] == pytest.approx(0.6)


def test_query_that_ignores_the_missing_row_is_rejected() -> None:
    with pytest.raises(ValueError, match="does not depend"):
        posterior_probabilities([1.0], [1.0, 2.0], "count", 1.0, 2.0)


def test_explain_epsilon_states_the_guarantee_and_refuses_a_too_large_epsilon() -> None:
    epsilon = epsilon_from_breach(0.2, 0.5)
    text = explain_epsilon(0.2, 0.5, epsilon)
    assert "1.39" in text and "20%" in text and "50%" in text
    assert text.count(".") >= 1 and "\n" not in text
    assert "20%" in explain_epsilon(0.2, 0.5, epsilon / 2)
    with pytest.raises(ValueError):
        explain_epsilon(0.2, 0.5, epsilon * 1.01)
