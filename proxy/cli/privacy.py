"""``dpproxy epsilon`` and ``dpproxy risk``: what an ε means, for whoever writes the policy.

``epsilon`` turns breach probabilities into ε (LPB: Ouyang, Yin and Liu, "Limiting Privacy
Breaches in Differential Privacy"; docs/references.md): a prior ρ1 and a posterior ρ2
give ε = ln(ρ2(1 − ρ1) / (ρ1(1 − ρ2))), the value a table's ``prior``/``posterior`` keys
set. ``risk`` replays the paper's informed adversary: it knows every row but one and a list
of candidates for the missing one, sees one answer with Laplace noise of scale Δ/ε, and
updates a uniform prior over the candidates by Bayes' rule. The math is in
``mechanisms.breach``; this module only parses arguments and prints.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Sequence

from mechanisms.breach import (
    QUERIES,
    answer_log_likelihoods,
    bayes_posterior,
    epsilon_from_breach,
    informed_sensitivity,
    posterior_bound,
    worst_case_posteriors,
)

__all__ = ["add_privacy_commands", "epsilon_report", "risk_report"]

_RISK_EPILOG = """\
The worked example (Table I) of Ouyang, Yin and Liu, "Limiting Privacy Breaches in
Differential Privacy":
  dpproxy risk --known 1,2,3 --candidates 1,2,3,5,10 --query avg --epsilon 2 --observed 5.041
The paper's row for candidate 2 uses the noise 3.401 where 5.041 - 2 = 3.041, so its printed
density (0.0216) and every printed posterior are slightly off; this prints the corrected
numbers (posterior of 10: 0.5421, not 0.5562). A candidate "none" stands for "no such row".
"""


def add_privacy_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``epsilon`` and ``risk`` on the ``dpproxy`` sub-command parser."""
    about = ('ε from breach probabilities: prior ρ1 and posterior ρ2 (Ouyang, Yin and Liu, '
             '"Limiting Privacy Breaches in Differential Privacy"; docs/references.md)')
    epsilon = commands.add_parser("epsilon", help=about, description=about)
    epsilon.add_argument("--prior", type=float, required=True, help="ρ1: the adversary's largest prior belief")
    target = epsilon.add_mutually_exclusive_group(required=True)
    target.add_argument("--posterior", type=float, help="ρ2: the largest belief allowed after the answers")
    target.add_argument("--epsilon", type=float, help="instead: show the largest posterior this ε allows")
    epsilon.set_defaults(run=_run_epsilon)

    risk = commands.add_parser(
        "risk",
        help="posterior of an adversary who knows all rows but one, after one noised answer",
        epilog=_RISK_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    risk.add_argument("--known", required=True, help="the rows the adversary knows, e.g. 1,2,3")
    risk.add_argument("--candidates", required=True, help="possible values of the missing row, e.g. 1,2,3,5,10")
    risk.add_argument("--query", default="avg", choices=sorted(QUERIES), help="the released aggregate")
    risk.add_argument("--epsilon", type=float, required=True, help="ε of the answer")
    risk.add_argument("--observed", type=float, help="the noised answer the adversary saw (omit: worst case only)")
    risk.add_argument(
        "--sensitivity", type=float,
        help="Δ of the Laplace noise (default: the spread of the query over the candidates, "
             "as in Ouyang, Yin and Liu)",
    )
    risk.set_defaults(run=_run_risk)


def _run_epsilon(args: argparse.Namespace) -> int:
    try:
        print(epsilon_report(args.prior, args.posterior, args.epsilon))
    except ValueError as exc:
        print(f"dpproxy epsilon: {exc}", file=sys.stderr)
        return 2
    return 0


def _run_risk(args: argparse.Namespace) -> int:
    try:
        known = [float(v) for v in _split(args.known)]
        candidates = [_candidate(v) for v in _split(args.candidates)]
        print(risk_report(known, candidates, args.query, args.epsilon, args.observed, args.sensitivity))
    except ValueError as exc:
        print(f"dpproxy risk: {exc}", file=sys.stderr)
        return 2
    return 0


def epsilon_report(prior: float, posterior: float | None, epsilon: float | None = None) -> str:
    """``dpproxy epsilon``'s output: ε for (ρ1, ρ2), or the posterior bound of (ρ1, ε)."""
    if posterior is None:
        assert epsilon is not None
        if not (epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"epsilon must be a finite positive number, got {epsilon!r}")
        bound = posterior_bound(prior, epsilon)
        return (
            f"posterior <= {bound:.4f}\n"
            f"After answers that spend ε = {epsilon:g} in total, an adversary who knows every other "
            f"row and gives a person's row at most {_pct(prior)} prior probability of being in the "
            f"table can believe it with at most {_pct(bound)}; for the value of a row known to be "
            f"present the same bound needs answers that spend at most ε/2 = {epsilon / 2:g}."
        )
    value = epsilon_from_breach(prior, posterior)
    return (
        f"epsilon = {value:.6g}\n"
        f"An adversary who knows every other row and gives a person's row at most {_pct(prior)} "
        f"prior probability of being in the table cannot believe it with more than "
        f"{_pct(posterior)} after seeing answers that spend ε = {value:.4g} in total; the same "
        f"protection for the value of a row known to be present needs ε = {value / 2:.4g}, because "
        f"changing a value is one removal plus one addition."
    )


def risk_report(
    known: Sequence[float],
    candidates: Sequence[float | None],
    query: str,
    epsilon: float,
    observed: float | None = None,
    sensitivity: float | None = None,
) -> str:
    """``dpproxy risk``'s output: each candidate's posterior, and its worst case over all answers."""
    delta = informed_sensitivity(known, candidates, query) if sensitivity is None else sensitivity
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite positive number, got {epsilon!r}")
    prior = 1.0 / len(candidates)
    worst = worst_case_posteriors(known, candidates, query, epsilon, sensitivity=sensitivity)
    answers = {c: QUERIES[query](list(known) if c is None else [*known, c]) for c in candidates}
    lines = [
        f"The adversary knows {len(known)} rows ({_list(known)}) and that the missing row is one of "
        f"{len(candidates)} candidates, each with prior {_pct(prior)}.",
        f"{query} is released with Laplace noise of scale Δ/ε = {delta:.4g}/{epsilon:g} = {delta / epsilon:.4g}"
        + (" (Δ: the spread of the query over the candidates)." if sensitivity is None else "."),
        "",
    ]
    header = f"{'candidate':>10} {query + ' if so':>12}"
    log_density: dict[float | None, float] = {}
    posterior: dict[float | None, float] = {}
    if observed is not None:
        log_density = answer_log_likelihoods(known, candidates, query, epsilon, observed, sensitivity)
        posterior = bayes_posterior({c: prior for c in candidates}, log_density)
        header += f" {'noise':>9} {'density':>9} {'posterior':>10}"
    lines.append(header + f" {'worst case':>11}")
    for c in candidates:
        line = f"{_value(c):>10} {answers[c]:>12.6g}"
        if observed is not None:
            line += f" {observed - answers[c]:>9.4g} {math.exp(log_density[c]):>9.4f} {posterior[c]:>10.4f}"
        lines.append(line + f" {worst[c]:>11.4f}")
    lines.append("")
    if observed is not None:
        lines.append(f"posterior: the adversary's belief after seeing the answer {observed:g}.")
    top = max(worst, key=lambda c: worst[c])
    lines.append(
        f"worst case: the largest posterior over every possible answer; here {_value(top)} reaches "
        f"{worst[top]:.4f}. No answer at ε = {epsilon:g} can lift a {_pct(prior)} prior above "
        f"{_pct(posterior_bound(prior, epsilon))} when Δ covers the candidates (Ouyang, Yin and Liu)."
    )
    return "\n".join(lines)


def _split(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError(f"expected a comma-separated list, got {text!r}")
    return items


def _candidate(text: str) -> float | None:
    return None if text.lower() in ("none", "absent") else float(text)


def _value(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def _list(values: Sequence[float]) -> str:
    shown = ", ".join(f"{v:g}" for v in values[:8])
    return shown + (", ..." if len(values) > 8 else "")


def _pct(p: float) -> str:
    return f"{100.0 * p:.4g}%"
