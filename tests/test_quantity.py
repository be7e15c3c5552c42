"""Whole-number quantities: every form Kubernetes writes is read, fractions are refused.

The API server stores `infergrid.io/gpu-memory: 20000` as `20k`; these tables are the
specification of what every InferGrid reader of a GPU quantity accepts and refuses.
"""

from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from infergrid.errors import ContractError
from infergrid.quantity import LARGEST, LONGEST, parse_milli_quantity, parse_whole_quantity

FIELD = "spec.containers[0].resources.limits[infergrid.io/gpu-memory]"

ACCEPTED = [
    # plain numbers, as written or as the API server keeps them
    ("0", 0),
    ("1024", 1024),
    ("+8", 8),
    ("007", 7),
    ("-0", 0),
    (20000, 20000),
    # decimal SI suffixes: powers of 1000
    ("20k", 20000),
    ("2048k", 2048000),
    ("3M", 3_000_000),
    ("1G", 10**9),
    ("1T", 10**12),
    ("1P", 10**15),
    ("1E", 10**18),
    ("2000m", 2),
    ("1000000u", 1),
    ("1000000000n", 1),
    # binary SI suffixes: powers of 1024
    ("1Ki", 1024),
    ("20Mi", 20 * 2**20),
    ("1Gi", 2**30),
    ("1Ti", 2**40),
    ("1Pi", 2**50),
    ("7Ei", 7 * 2**60),
    ("0.5Ki", 512),
    # decimal exponents
    ("5e3", 5000),
    ("5E3", 5000),
    ("2e+3", 2000),
    ("20000e-4", 2),
    ("0e999999999", 0),
    # decimal points that still make a whole number
    ("1.5k", 1500),
    ("0.5k", 500),
    (".5k", 500),
    ("1.", 1),
    ("2.000", 2),
    ("1.25e2", 125),
    # the int64 bound itself
    (str(LARGEST), LARGEST),
    (LARGEST, LARGEST),
    ("9.223372036854775807e18", LARGEST),
]


@pytest.mark.parametrize(("raw", "value"), ACCEPTED, ids=[repr(a[0]) for a in ACCEPTED])
def test_accepted_forms_and_their_values(raw, value):
    assert parse_whole_quantity(raw, FIELD) == value


REJECTED = [
    # fractions
    ("1.5", "not a whole number"),
    ("100m", "not a whole number"),
    ("1500m", "not a whole number"),
    ("1.0001k", "not a whole number"),
    ("1e-1", "not a whole number"),
    ("0.1Ki", "not a whole number"),
    ("1e-999999999", "not a whole number"),
    # negatives
    ("-1", "is negative"),
    ("-20k", "is negative"),
    (-1, "is negative"),
    # above int64, as Kubernetes holds it
    (str(LARGEST + 1), "above 9223372036854775807 (2^63-1)"),
    ("8Ei", "above 9223372036854775807 (2^63-1)"),
    ("1e19", "above 9223372036854775807 (2^63-1)"),
    ("1e999999999", "above 9223372036854775807 (2^63-1)"),
    (LARGEST + 1, "above 9223372036854775807 (2^63-1)"),
    # hostile sizes are refused before any big number is built
    ("9" * 10_000, f"10000 characters long; a quantity has at most {LONGEST}"),
    ("0" * 10_000 + "1", f"10001 characters long; a quantity has at most {LONGEST}"),
    # not quantities at all
    ("", "not a Kubernetes quantity"),
    (".", "not a Kubernetes quantity"),
    ("+", "not a Kubernetes quantity"),
    ("k", "not a Kubernetes quantity"),
    ("1K", "not a Kubernetes quantity"),
    ("1ki", "not a Kubernetes quantity"),
    ("1e", "not a Kubernetes quantity"),
    ("1e1.5", "not a Kubernetes quantity"),
    ("1Ki1", "not a Kubernetes quantity"),
    (" 1", "not a Kubernetes quantity"),
    ("1 ", "not a Kubernetes quantity"),
    ("0x10", "not a Kubernetes quantity"),
    ("1_000", "not a Kubernetes quantity"),
    ("²", "not a Kubernetes quantity"),
    ("١", "not a Kubernetes quantity"),
    # not strings or integers
    (True, "expected a quantity"),
    (1.0, "expected a quantity"),
    (None, "expected a quantity"),
    ([1], "expected a quantity"),
]


@pytest.mark.parametrize(("raw", "says"), REJECTED, ids=[repr(r[0])[:24] for r in REJECTED])
def test_rejected_forms_name_the_field_and_say_why(raw, says):
    with pytest.raises(ContractError) as raised:
        parse_whole_quantity(raw, FIELD)
    assert raised.value.field == FIELD
    assert says in raised.value.reason


_DECIMAL = {"k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_POWERS_OF_TEN = range(19)


def spellings(n: int) -> list[str]:
    """Every way we know to write the whole number ``n`` as a Kubernetes quantity."""
    out = [str(n), f"+{n}", f"{n * 1000}m"]
    for suffix, power in _DECIMAL.items():
        whole, rest = divmod(n, 10**power)
        out.append(f"{whole}.{rest:0{power}d}{suffix}")  # exact with a decimal point
        if rest == 0:
            out.append(f"{whole}{suffix}")  # the canonical form when it is the largest
    for suffix, power in _BINARY.items():
        if n % 2**power == 0:
            out.append(f"{n >> power}{suffix}")
    for power in _POWERS_OF_TEN:
        if n % 10**power == 0:
            out += [f"{n // 10**power}e{power}", f"{n // 10**power}E+{power}"]
    return out


def multiples_of(base: int, powers: range) -> st.SearchStrategy[int]:
    """Whole numbers up to LARGEST that ``base**p`` divides, so suffixed spellings exist."""
    return st.sampled_from(powers).flatmap(
        lambda p: st.integers(0, LARGEST // base**p).map(lambda m: m * base**p)
    )


whole_numbers = st.one_of(
    st.integers(min_value=0, max_value=LARGEST),
    multiples_of(10, _POWERS_OF_TEN),
    multiples_of(2, range(10, 61, 10)),
)


@given(whole_numbers)
@example(0)
@example(20000)
@example(LARGEST)
@example(2**62)
def test_every_spelling_of_a_whole_number_reads_back_as_it(n):
    for text in spellings(n):
        assert parse_whole_quantity(text, FIELD) == n, text


@given(st.integers(min_value=0, max_value=LARGEST), st.integers(min_value=1, max_value=18))
def test_every_fraction_is_refused(numerator, digits):
    """``numerator / 10**digits`` that is not whole, spelled with a point, an exponent or milli."""
    value = Fraction(numerator, 10**digits)
    if value.denominator == 1:
        numerator, value = numerator + 1, Fraction(numerator + 1, 10**digits)
    whole, rest = divmod(numerator, 10**digits)
    texts = [f"{whole}.{rest:0{digits}d}", f"{numerator}e-{digits}"]
    if (value * 1000).denominator == 1:
        texts.append(f"{value * 1000}m")  # thousandths, the way a CPU request is written
    for text in texts:
        with pytest.raises(ContractError, match="not a whole number"):
            parse_whole_quantity(text, FIELD)


@given(st.integers(min_value=1, max_value=LARGEST))
def test_every_negative_is_refused(n):
    for text in (f"-{n}", -n):
        with pytest.raises(ContractError, match="is negative"):
            parse_whole_quantity(text, FIELD)


@pytest.mark.parametrize(
    ("raw", "millis"),
    [
        ("100m", 100),
        ("1", 1000),
        ("1.5", 1500),
        ("2k", 2_000_000),
        (4, 4000),
        ("0.0001", 1),  # rounded up, as Kubernetes' MilliValue does
        ("1n", 1),
        ("1e-100", 1),
        ("1Ki", 1_024_000),
        ("0", 0),
    ],
)
def test_cpu_reads_in_millicores_rounded_up(raw, millis):
    assert parse_milli_quantity(raw, "cpu") == millis


@pytest.mark.parametrize("raw", ["-1", "1x", "", "m", None, "9" * 65, "1e30"])
def test_a_bad_cpu_quantity_names_its_field(raw):
    with pytest.raises(ContractError) as err:
        parse_milli_quantity(raw, "spec.containers[0].resources.requests.cpu")
    assert err.value.field == "spec.containers[0].resources.requests.cpu"
