"""Kubernetes quantity parsing; expected values come from apimachinery's quantity_test.go."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nri_midbatch.policy.quantity import Format, Quantity, QuantityError, parse_quantity

INT64_MAX = 2**63 - 1
DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15}
BINARY_POWERS = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50}


@pytest.mark.parametrize(
    ("text", "amount", "fmt"),
    [
        ("0", 0, Format.DECIMAL_SI),
        ("0Ki", 0, Format.BINARY_SI),
        ("1", 1, Format.DECIMAL_SI),
        ("1Ki", 1024, Format.BINARY_SI),
        ("7Mi", 7 * 2**20, Format.BINARY_SI),
        ("3Ei", 3 * 2**60, Format.BINARY_SI),
        ("5n", Fraction(5, 10**9), Format.DECIMAL_SI),
        ("3m", Fraction(3, 1000), Format.DECIMAL_SI),
        ("50k", 50_000, Format.DECIMAL_SI),
        ("1E", 10**18, Format.DECIMAL_SI),
        ("12E", 12 * 10**18, Format.DECIMAL_SI),
        ("1E-3", Fraction(1, 1000), Format.DECIMAL_EXPONENT),
        ("1e3", 1000, Format.DECIMAL_EXPONENT),
        ("1.3E+6", 1_300_000, Format.DECIMAL_EXPONENT),
        ("100.035k", 100_035, Format.DECIMAL_SI),
        ("0.0005k", Fraction(1, 2), Format.DECIMAL_SI),
        ("0.5e-2", Fraction(5, 1000), Format.DECIMAL_EXPONENT),
        ("100.035Ki", Fraction(10243584, 100), Format.BINARY_SI),
        (".001", Fraction(1, 1000), Format.DECIMAL_SI),
        ("1.", 1, Format.DECIMAL_SI),
        ("1.G", 10**9, Format.DECIMAL_SI),
        ("+1k", 1000, Format.DECIMAL_SI),
        ("-1.5", Fraction(-3, 2), Format.DECIMAL_SI),
        # Parsing rounds to nano resolution, away from zero.
        ("3.001n", Fraction(4, 10**9), Format.DECIMAL_SI),
        ("0.0000000001", Fraction(1, 10**9), Format.DECIMAL_SI),
        ("0.00000012345", Fraction(124, 10**9), Format.DECIMAL_SI),
        ("-0.9n", Fraction(-1, 10**9), Format.DECIMAL_SI),
        # A binary quantity below 1 becomes decimal; one above int64 is capped at MaxInt64.
        ("0.000000000001Ki", Fraction(2, 10**9), Format.DECIMAL_SI),
        ("9Ei", INT64_MAX, Format.BINARY_SI),
        ("-9Ei", -INT64_MAX, Format.BINARY_SI),
    ],
)
def test_parse(text: str, amount: int | Fraction, fmt: Format) -> None:
    quantity = parse_quantity(text)
    assert quantity.amount == amount
    assert quantity.format is fmt


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 1",
        "1 ",
        "1.2.3",
        "1.1.M",
        "1+1.0M",
        "0.1mi",
        "0.1am",
        "aoeu",
        ".5i",
        "1i",
        "-3.01i",
        "-3.01e-",
        "1K",
        "1e",
        "1E+",
        "1e1.5",
        "1kk",
        # Non-ASCII digits.
        "\u0663",
        "1e\u0663",
        # Bounds that keep exact arithmetic cheap.
        "1e1001",
        "1" * 1001,
    ],
)
def test_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["Ki", "m", "k", ".", "+", "-", "-k", ".M", "e3"])
def test_a_suffix_without_digits_is_zero(text: str) -> None:
    # apimachinery's parseQuantityString: "if we stripped all numerator positions, always
    # return 0"; the suffix must still be one it knows.
    assert parse_quantity(text).value() == 0


def test_a_suffix_without_digits_must_still_be_known() -> None:
    with pytest.raises(QuantityError, match="unknown suffix 'mi'"):
        parse_quantity("mi")


def test_error_says_what_is_wrong() -> None:
    with pytest.raises(QuantityError, match=r"'1Kb'.*unexpected 'b'"):
        parse_quantity("1Kb")
    with pytest.raises(QuantityError, match="unknown suffix 'mi'"):
        parse_quantity("1mi")
    with pytest.raises(QuantityError, match="empty"):
        parse_quantity("")


@pytest.mark.parametrize(
    ("text", "value", "milli"),
    [
        ("1k", 1000, 1_000_000),
        ("500", 500, 500_000),
        ("500m", 1, 500),
        ("1.5", 2, 1500),
        ("1.4", 2, 1400),
        ("1n", 1, 1),
        ("0.1m", 1, 1),
        ("2Gi", 2 * 2**30, 2 * 2**30 * 1000),
        # Negative and int64-backed: rounded away from zero (negativeScaleInt64).
        ("-1.5", -2, -1500),
        ("-1.4", -2, -1400),
        ("-500m", -1, -500),
        ("-1n", -1, -1),
        ("-0.1m", -1, -1),
        ("-0.000000001", -1, -1),  # nine decimals: still nano
        ("-000000000000000000001.5", -2, -1500),  # leading zeros are not digits
        # ParseQuantity's inf.Dec path: the magnitude rounded up to nano, the sign put back,
        # then scaledValue truncates toward zero and adds 1 for a remainder, whatever the
        # sign (checked against apimachinery v0.36.3: -1e-10 -> Value 1, MilliValue 1).
        ("1e-10", 1, 1),
        ("-1e-10", 1, 1),
        ("-1.5e-10", 1, 1),
        ("-0.5n", 1, 1),  # finer than nano as written
        ("-0.00000000010", 1, 1),  # ten decimals, even with a trailing zero
        ("-0.5000000000000000000", 1, -500),  # 20 digits
        ("-2.50000000000000000000", -1, -2500),
        ("-1000000000000000000", -(10**18), -(10**21)),  # 19 digits, whole
        ("-0.0001Ki", 1, -101),  # a binary fraction: -0.1024
        ("-1.5Ki", -1536, -1536000),
        ("-1234567890123456Ki", -1234567890123456 * 1024, -1234567890123456 * 1024000),
        ("0", 0, 0),
    ],
)
def test_value_and_milli_value(text: str, value: int, milli: int) -> None:
    quantity = parse_quantity(text)
    assert quantity.value() == value
    assert quantity.milli_value() == milli


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("1Gi", "1Gi"),
        ("1024Mi", "1Gi"),
        ("1000M", "1G"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("1.5", "1500m"),
        ("1.5Gi", "1536Mi"),
        (".001Ki", "1024m"),
        (".000000000001Ki", "2n"),
        ("100.035Ki", "102435840m"),
        ("0.5Mi", "512Ki"),
        ("512", "512"),
        ("1e3", "1e3"),
        ("1.3E+6", "1300e3"),
        ("80e-3", "80e-3"),
        ("1000E", "1e21"),
        ("9Ei", "9223372036854775807"),
        ("-1.5", "-1500m"),
        ("-1Ki", "-1Ki"),
        ("0Ki", "0"),
        ("-0", "0"),
    ],
)
def test_canonical_string(text: str, canonical: str) -> None:
    assert str(parse_quantity(text)) == canonical


def test_equality_ignores_spelling() -> None:
    assert parse_quantity("1k") == parse_quantity("1000") == parse_quantity("1e3")
    assert parse_quantity("1Ki") == parse_quantity("1024")
    assert parse_quantity("1k") != parse_quantity("1Ki")
    assert len({parse_quantity("1k"), parse_quantity("1e3")}) == 1


def test_rejects_amount_finer_than_nano() -> None:
    with pytest.raises(QuantityError):
        Quantity(Fraction(1, 3))


int64s = st.integers(min_value=-INT64_MAX, max_value=INT64_MAX)


@given(st.integers(min_value=-(10**30), max_value=10**30), st.sampled_from(list(Format)))
@example(1000, Format.DECIMAL_SI)
@example(1024, Format.BINARY_SI)
@example(-(2**60) * 7, Format.BINARY_SI)
@example(25_000, Format.BINARY_SI)
def test_canonical_strings_of_integers_round_trip(number: int, fmt: Format) -> None:
    if fmt is Format.BINARY_SI and abs(number) > INT64_MAX:
        number %= INT64_MAX  # apimachinery caps binary quantities at MaxInt64
    text = str(Quantity(Fraction(number), fmt))
    parsed = parse_quantity(text)
    assert parsed.amount == number
    assert parsed.value() == number
    if fmt is Format.BINARY_SI and not text.endswith("i"):
        # Binary but not a multiple of 1024: printed as a plain number, which reads back as
        # decimal ("25000" -> "25k"), exactly as in apimachinery.
        assert str(parsed) == str(Quantity(Fraction(number), Format.DECIMAL_SI))
    else:
        assert str(parsed) == text


@given(int64s, st.sampled_from(sorted(DECIMAL_EXPONENTS)))
def test_decimal_suffix_equals_exponent_spelling(number: int, suffix: str) -> None:
    exponent = DECIMAL_EXPONENTS[suffix]
    expected = number * Fraction(10) ** exponent
    assert parse_quantity(f"{number}{suffix}").amount == expected
    assert parse_quantity(f"{number}e{exponent}").amount == expected
    assert parse_quantity(f"{number}E{exponent}") == parse_quantity(f"{number}{suffix}")


@given(
    st.integers(min_value=1 - 2**13, max_value=2**13 - 1), st.sampled_from(sorted(BINARY_POWERS))
)
def test_binary_suffix_equals_plain_integer(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == parse_quantity(
        str(number * 2 ** BINARY_POWERS[suffix])
    )


@given(
    st.integers(min_value=0, max_value=10**9 - 1),
    st.integers(min_value=0, max_value=10**9 - 1),
    st.sampled_from(["", "k", "M"]),
)
def test_value_rounds_up_positive_and_down_negative(whole: int, nanos: int, suffix: str) -> None:
    # At most 18 digits, none finer than nano: int64-backed, rounded away from zero.
    text = f"{whole}.{nanos:09d}{suffix}"
    positive = parse_quantity(text)
    exact = positive.amount
    assert exact >= 0
    assert exact <= positive.value() < exact + 1
    assert exact * 1000 <= positive.milli_value() < exact * 1000 + 1
    negative = parse_quantity("-" + text)
    assert negative.value() == -positive.value()
    assert negative.milli_value() == -positive.milli_value()


@given(
    st.integers(min_value=0, max_value=10**12),
    st.integers(min_value=0, max_value=10**9 - 1),
    st.sampled_from(["", "k", "m", "M"]),
)
def test_an_inf_dec_quantity_truncates_and_adds_one_whatever_its_sign(
    whole: int, nanos: int, suffix: str
) -> None:
    # Ten more decimals, zeros (over 18 digits), make apimachinery keep the same amount as
    # an inf.Dec: positive values round up as before; negative ones come out 1 above their
    # truncation.
    text = f"{whole}.{nanos:09d}{'0' * 10}{suffix}"
    int64_backed = parse_quantity(f"{whole}.{nanos:09d}{suffix}")
    positive, negative = parse_quantity(text), parse_quantity("-" + text)
    assert positive.amount == int64_backed.amount == -negative.amount
    assert positive.value() == int64_backed.value()
    fraction = positive.amount.denominator != 1
    assert negative.value() == -positive.value() + (2 if fraction else 0)
    milli_fraction = (positive.amount * 1000).denominator != 1
    assert negative.milli_value() == -positive.milli_value() + (2 if milli_fraction else 0)


@given(st.text(alphabet="0123456789.+-eEinumkKMGTP ", max_size=12) | st.text(max_size=40))
@example("1.2.3")
@example("1e99999999999")
@example("9" * 5000)
def test_any_text_parses_or_raises_quantity_error(text: str) -> None:
    try:
        quantity = parse_quantity(text)
    except QuantityError:
        return
    # Whatever parses has a canonical form that reads back as the same quantity.
    assert parse_quantity(str(quantity)) == quantity
