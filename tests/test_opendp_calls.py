"""mechanisms.opendp_calls: the same OpenDP measurement, invoked without the wrapper's per-call work.

At scale 0 (probability 1 for the coin) OpenDP's measurements release their input unchanged, so
those pin the conversions both ways bit for bit against the public ``Measurement.__call__``; at a
positive scale the draws are compared with the distribution OpenDP's public path samples.
"""

from __future__ import annotations

import math
import struct

import opendp.prelude as dp
import pytest
from opendp.mod import OpenDPException
from scipy import stats

from mechanisms import opendp_calls, samplers
from mechanisms.opendp_calls import invoke_bool, invoke_float, invoke_floats_to_index, invoke_int, laplace_float_draw

dp.enable_features("contrib")

_FLOATS = [0.0, -0.0, 1.5, -2.25, 5e-324, -5e-324, 2.0**-1022, 1.7976931348623157e308, -1.7976931348623157e308, 38.6]


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _float_identity() -> dp.Measurement:
    return dp.m.make_laplace(dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=0.0)


@pytest.mark.parametrize("value", _FLOATS, ids=repr)
def test_a_float_comes_back_bit_for_bit_as_from_the_public_call(value: float) -> None:
    identity = _float_identity()
    released = invoke_float(identity, value)
    assert _bits(released) == _bits(identity(value))
    assert released == value  # and bit for bit but for the sign of zero: OpenDP's -0.0 + 0 is +0.0


@pytest.mark.parametrize("value", [0, 1, -1, 2**53 + 1, 2**63 - 1, -(2**63)], ids=repr)
def test_an_i64_comes_back_exactly_as_from_the_public_call(value: int) -> None:
    identity = dp.m.make_laplace(dp.atom_domain(T="i64"), dp.absolute_distance(T="i64"), scale=0.0)
    assert invoke_int(identity, value) == identity(value) == value


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1], ids=repr)
def test_an_integer_outside_i64_is_refused_as_the_public_call_refuses_it(value: int) -> None:
    identity = dp.m.make_laplace(dp.atom_domain(T="i64"), dp.absolute_distance(T="i64"), scale=0.0)
    with pytest.raises(ValueError):
        identity(value)
    with pytest.raises(ValueError, match="not representable by i64"):
        invoke_int(identity, value)


@pytest.mark.parametrize("value", [True, False])
def test_a_certain_coin_returns_its_input_as_from_the_public_call(value: bool) -> None:
    certain = dp.m.make_randomized_response_bool(1.0, constant_time=True)
    assert invoke_bool(certain, value) is certain(value) is value


@pytest.mark.parametrize("scores", [[7.0, 1.0, 2.0], [1.0, 2.0, 9.5], [0.0, -1e300, 3.0, -2.0], [4.0]], ids=str)
def test_a_noiseless_noisy_max_returns_the_argmax_as_from_the_public_call(scores: list[float]) -> None:
    argmax = dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.linf_distance(T=float),
                                 dp.zero_concentrated_divergence(), scale=0.0)
    assert invoke_floats_to_index(argmax, scores) == argmax(scores) == scores.index(max(scores))


def test_a_value_of_the_wrong_type_for_the_measurement_raises_opendps_error() -> None:
    integers = dp.m.make_laplace(dp.atom_domain(T="i64"), dp.absolute_distance(T="i64"), scale=1.0)
    with pytest.raises(OpenDPException):
        invoke_float(integers, 1.0)


def test_a_result_of_another_type_than_expected_is_refused_not_misread() -> None:
    # A measurement on Vec<f64> that releases Vec<f64>, read as if it released a usize.
    vector = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float), scale=1.0)
    with pytest.raises(TypeError, match="Vec<f64>"):
        invoke_floats_to_index(vector, [1.0, 2.0])


def test_the_float_laplace_draws_have_opendps_laplace_distribution() -> None:
    # The same measurement through the public call and through invoke_float: both against the
    # continuous Laplace(1.5) the lattice approximates (finer than a KS test over 20,000 draws sees).
    laplace = dp.m.make_laplace(dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=1.5)
    lean = [invoke_float(laplace, 10.0) for _ in range(20_000)]
    public = [laplace(10.0) for _ in range(20_000)]
    assert stats.kstest(lean, stats.laplace(loc=10.0, scale=1.5).cdf).pvalue > 1e-6
    assert stats.kstest(public, stats.laplace(loc=10.0, scale=1.5).cdf).pvalue > 1e-6
    assert stats.ks_2samp(lean, public).pvalue > 1e-6


_F64_DOMAIN = dp.atom_domain(T=float, nan=False)
_F64_METRIC = dp.absolute_distance(T=float)


@pytest.mark.parametrize("value", _FLOATS, ids=repr)
def test_a_laplace_built_per_draw_at_scale_0_returns_the_value_as_the_public_measurement(value: float) -> None:
    released = laplace_float_draw(_F64_DOMAIN, _F64_METRIC, 0.0, value)
    assert _bits(released) == _bits(_float_identity()(value))


def test_a_laplace_built_per_draw_has_the_public_constructors_distribution() -> None:
    # laplace_float_draw builds its measurement through the library's constructor: its draws
    # against the measurement dp.m.make_laplace builds, and both against the continuous Laplace(1.5).
    public = dp.m.make_laplace(_F64_DOMAIN, _F64_METRIC, scale=1.5)
    direct = [laplace_float_draw(_F64_DOMAIN, _F64_METRIC, 1.5, 10.0) for _ in range(20_000)]
    wrapped = [public(10.0) for _ in range(20_000)]
    assert stats.kstest(direct, stats.laplace(loc=10.0, scale=1.5).cdf).pvalue > 1e-6
    assert stats.ks_2samp(direct, wrapped).pvalue > 1e-6


@pytest.mark.parametrize("scale", [-1.0, float("nan")], ids=repr)
def test_a_scale_the_constructor_refuses_raises_opendps_error_as_the_public_constructor(scale: float) -> None:
    with pytest.raises(OpenDPException):
        dp.m.make_laplace(_F64_DOMAIN, _F64_METRIC, scale=scale)
    with pytest.raises(OpenDPException):
        laplace_float_draw(_F64_DOMAIN, _F64_METRIC, scale, 1.0)


def test_every_laplace_built_per_draw_is_freed_even_when_its_draw_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []
    freed: list[object] = []
    make, free = opendp_calls._make_laplace, opendp_calls._measurement_free

    def counted_make(*args: object) -> object:
        result = make(*args)
        built.append(result.payload.Ok)
        return result

    def counted_free(measurement: object) -> object:
        freed.append(measurement.value if hasattr(measurement, "value") else measurement)
        return free(measurement)

    def failed(measurement: object, value: float) -> float:
        raise RuntimeError("the draw failed")

    monkeypatch.setattr(opendp_calls, "_make_laplace", counted_make)
    monkeypatch.setattr(opendp_calls, "_measurement_free", counted_free)
    laplace_float_draw(_F64_DOMAIN, _F64_METRIC, 1.0, 3.0)
    monkeypatch.setattr(opendp_calls, "invoke_float", failed)
    with pytest.raises(RuntimeError, match="the draw failed"):
        laplace_float_draw(_F64_DOMAIN, _F64_METRIC, 1.0, 3.0)
    assert len(built) == 2 and freed == built


def test_the_padding_coin_comes_up_with_its_probability() -> None:
    draws = 20_000
    for probability in (0.2, 0.5, 0.9):
        heads = sum(samplers._coin(probability) for _ in range(draws))
        # 6 standard deviations of a binomial: a false alarm about once in 10^9 runs.
        assert abs(heads - probability * draws) < 6 * math.sqrt(draws * probability * (1 - probability))


def test_the_exponential_draw_picks_each_candidate_with_its_softmax_probability() -> None:
    scores, scale, draws = [0.0, 1.0, 2.0], 1.0, 30_000
    picked = [0, 0, 0]
    for _ in range(draws):
        picked[samplers.gumbel_argmax(scores, scale)] += 1
    weights = [math.exp(s / scale) for s in scores]
    expected = [draws * w / sum(weights) for w in weights]
    assert stats.chisquare(picked, expected).pvalue > 1e-6


@pytest.fixture
def wrapper_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenDP's per-call Python wrapper made to fail: what still works does not go through it."""
    import opendp.core

    def refused(this: object, arg: object) -> object:
        raise AssertionError("Measurement.__call__ on the statement path")

    monkeypatch.setattr(opendp.core, "measurement_invoke", refused)


@pytest.mark.usefixtures("wrapper_refused")
def test_the_smooth_medians_draw_does_not_go_through_opendps_per_call_wrapper() -> None:
    from mechanisms.smooth_median import release_sample_and_aggregate

    release = release_sample_and_aggregate([40.0, 41.0, 42.5, None, 39.0], 0.0, 100.0, 1.0, 1e-6)
    assert 0.0 <= release.value <= 100.0


@pytest.mark.usefixtures("wrapper_refused")
def test_the_exponential_mechanisms_draws_and_coin_do_not_go_through_opendps_per_call_wrapper() -> None:
    from mechanisms.exponential import release_mode

    assert release_mode(["a", "b", "c"], [3, 9, 4], 1.0).value in ("a", "b", "c")


@pytest.mark.usefixtures("wrapper_refused")
def test_a_draw_on_the_spot_from_an_empty_pool_does_not_go_through_opendps_per_call_wrapper() -> None:
    from mechanisms.noise_pool import NoisePool

    pool = NoisePool(2.0)
    pool._refill_pending = True  # as if a refill were under way: the queue stays empty
    assert isinstance(pool.take(), int)
