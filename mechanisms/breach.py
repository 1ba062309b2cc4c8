"""Choosing ε from breach probabilities (LPB: Ouyang, Yin and Liu, "Limiting Privacy
Breaches in Differential Privacy"; docs/references.md).

An informed adversary knows every row but one and the candidate values of the missing row.
(ρ1, ρ2)-privacy asks that whenever the adversary's prior belief in a fact is at most ρ1,
the belief after seeing the released answer is at most ρ2. That holds when every likelihood
ratio Pr[D_i → r] / Pr[D_j → r] between two hypotheses is at most
γ = ρ2(1 − ρ1) / (ρ1(1 − ρ2)) (the paper's Theorem 2, after Evfimievski, Gehrke and Srikant
2003). A Laplace answer with scale λ = Δ/ε keeps the ratio below e^{Δ/λ} = e^ε, so ε = ln γ.

Which hypotheses are covered depends on the neighbouring relation. dpproxy's mechanisms are
ε-DP for one row added or removed, so ε = ln γ protects membership ("is this person's row in
the data?"). The paper's setting is the value of a row known to be present, a substitution,
which is two add/remove steps: in general that ratio is only bounded by e^{2ε}, so protecting
a value needs ε = ln(γ)/2. Mechanisms that move by at most Δ under substitution (COUNT, MODE,
SUM with lo ≥ 0) keep e^ε.

The risk functions reproduce the paper's worked example (Table I): the adversary's posterior
over the candidates after one Laplace answer, whose scale λ = Δ/ε uses the paper's Δ, the
spread of the query over the candidate databases.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar, Union, cast

from .laplace import _check_epsilon

__all__ = [
    "QUERIES",
    "answer_log_likelihoods",
    "bayes_posterior",
    "epsilon_from_breach",
    "explain_epsilon",
    "informed_sensitivity",
    "posterior_bound",
    "posterior_probabilities",
    "worst_case_posteriors",
]

K = TypeVar("K", bound=Hashable)
Rows = Sequence[float]
Query = Union[str, Callable[[Rows], float]]

QUERIES: dict[str, Callable[[Rows], float]] = {
    "count": len,
    "sum": math.fsum,
    "avg": lambda rows: math.fsum(rows) / len(rows),
}


def epsilon_from_breach(prior: float, posterior: float) -> float:
    """ε = ln(ρ2(1 − ρ1) / (ρ1(1 − ρ2))): the largest ε for which prior ≤ ρ1 implies posterior ≤ ρ2.

    Requires 0 < ρ1 < ρ2 < 1. A posterior no larger than the prior cannot be guaranteed.
    """
    if not 0.0 < prior < posterior < 1.0:
        raise ValueError(
            f"need 0 < prior < posterior < 1, got prior={prior!r}, posterior={posterior!r}: "
            "no noise can keep the posterior at or below the prior"
        )
    return math.log(posterior * (1.0 - prior) / (prior * (1.0 - posterior)))


def posterior_bound(prior: float, epsilon: float) -> float:
    """Worst case over all data and answers: posterior ≤ ρ1·e^ε / (1 − ρ1 + ρ1·e^ε).

    The inverse of :func:`epsilon_from_breach`. It is attained when every other hypothesis
    is a full Δ away from the true one and the answer falls beyond the true value.
    """
    if not 0.0 <= prior <= 1.0:
        raise ValueError(f"prior must be a probability, got {prior!r}")
    if not epsilon >= 0.0:
        raise ValueError(f"epsilon must be non-negative, got {epsilon!r}")
    if prior in (0.0, 1.0):
        return prior
    # ρ1·e^ε / (1 − ρ1 + ρ1·e^ε) written so that a large ε cannot overflow.
    return 1.0 / (1.0 + (1.0 - prior) / prior * math.exp(-epsilon))


def explain_epsilon(prior: float, posterior: float, epsilon: float) -> str:
    """One sentence for the CLI saying what ``epsilon`` guarantees for the (prior, posterior) pair.

    Raises ValueError when ``epsilon`` is too large for that guarantee.
    """
    needed = epsilon_from_breach(prior, posterior)
    _check_epsilon(epsilon)
    if epsilon > needed * (1.0 + 1e-9):
        raise ValueError(
            f"epsilon={epsilon:.4g} exceeds {needed:.4g}, the most that keeps a "
            f"{_percent(prior)} prior below a {_percent(posterior)} posterior"
        )
    return (
        f"With ε = {epsilon:.3g} in total, an adversary who knows every other row and gives "
        f"at most {_percent(prior)} prior probability to a given person being in the data "
        f"cannot believe it with more than {_percent(posterior)} after seeing the answers."
    )


def informed_sensitivity(known_values: Rows, candidates: Sequence[K], query: Query) -> float:
    """The paper's Δ: max − min of the query over the databases known_values ∪ {candidate}."""
    answers = _candidate_answers(known_values, candidates, query).values()
    return max(answers) - min(answers)


def answer_log_likelihoods(
    known_values: Rows,
    candidates: Sequence[K],
    query: Query,
    epsilon: float,
    observed: float,
    sensitivity: float | None = None,
) -> dict[K, float]:
    """ln of the Laplace(Δ/ε) density of ``observed`` if the missing row were each candidate.

    ``sensitivity`` defaults to :func:`informed_sensitivity`; pass dpproxy's global Δ to model
    its actual noise instead.
    """
    _check_epsilon(epsilon)
    answers = _candidate_answers(known_values, candidates, query)
    if sensitivity is None:
        sensitivity = max(answers.values()) - min(answers.values())
    if not sensitivity > 0.0:
        raise ValueError("the query does not depend on the missing row: the posterior is the prior")
    scale = sensitivity / epsilon
    return {c: -math.log(2.0 * scale) - abs(observed - f) / scale for c, f in answers.items()}


def bayes_posterior(prior: Mapping[K, float], log_likelihoods: Mapping[K, float]) -> dict[K, float]:
    """Pr[X = c | answer] = Pr[X = c]·Pr[answer | c] / Σ_i Pr[X = i]·Pr[answer | i]."""
    if set(prior) != set(log_likelihoods):
        raise ValueError("prior and likelihoods must cover the same candidates")
    if any(p < 0.0 for p in prior.values()) or not math.isclose(math.fsum(prior.values()), 1.0):
        raise ValueError("prior must be non-negative and sum to 1")
    top = max(log_likelihoods.values())
    weights = {c: prior[c] * math.exp(log_likelihoods[c] - top) for c in prior}
    total = math.fsum(weights.values())
    return {c: w / total for c, w in weights.items()}


def posterior_probabilities(
    known_values: Rows,
    candidates: Sequence[K],
    query: Query,
    epsilon: float,
    observed: float,
    prior: Mapping[K, float] | None = None,
    sensitivity: float | None = None,
) -> dict[K, float]:
    """The informed adversary's posterior over the missing row after one noised answer.

    ``candidates`` are the possible values of the missing row (``None`` may stand for "no row",
    with ``known_values`` alone as the database); ``prior`` defaults to uniform.
    """
    log_likelihoods = answer_log_likelihoods(
        known_values, candidates, query, epsilon, observed, sensitivity
    )
    return bayes_posterior(_uniform(candidates) if prior is None else prior, log_likelihoods)


def worst_case_posteriors(
    known_values: Rows,
    candidates: Sequence[K],
    query: Query,
    epsilon: float,
    prior: Mapping[K, float] | None = None,
    sensitivity: float | None = None,
) -> dict[K, float]:
    """For each candidate c, the largest posterior of c over every possible noised answer.

    Moving the answer r towards f(D_c) never decreases a likelihood ratio
    exp((|r − f(D_i)| − |r − f(D_c)|)/λ), so the supremum is at r = f(D_c). With the default
    sensitivity (or any larger one) it never exceeds :func:`posterior_bound` of c's prior.
    """
    answers = _candidate_answers(known_values, candidates, query)
    return {
        c: posterior_probabilities(
            known_values, candidates, query, epsilon, answers[c], prior, sensitivity
        )[c]
        for c in candidates
    }


def _candidate_answers(known_values: Rows, candidates: Sequence[K], query: Query) -> dict[K, float]:
    if len(candidates) == 0:
        raise ValueError("need at least one candidate value")
    if len(set(candidates)) != len(candidates):
        raise ValueError("candidates must be distinct")
    if isinstance(query, str):
        try:
            query = QUERIES[query.lower()]
        except KeyError:
            raise ValueError(f"unknown query {query!r}; use one of {sorted(QUERIES)} or a function") from None
    rows = list(known_values)
    # A candidate joins the rows as the target's value (a number when it is not None).
    return {c: float(query(rows if c is None else [*rows, cast(float, c)])) for c in candidates}


def _uniform(candidates: Sequence[K]) -> dict[K, float]:
    return {c: 1.0 / len(candidates) for c in candidates}


def _percent(p: float) -> str:
    return f"{100.0 * p:.3g}%"
