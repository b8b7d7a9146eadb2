"""Kubernetes resource.Quantity, parsed and rounded exactly as apimachinery does.

Values are kept as exact fractions; nothing here ever touches a float.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "Format",
    "Quantity",
    "QuantityError",
    "parse_quantity",
    "quantity_value",
]

#: The range of Go's int64, which every value a Quantity or a cgroup file holds must fit.
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


class Format(StrEnum):
    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


_DECIMAL_SUFFIXES = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIX_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIX_BY_POWER = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")

# apimachinery's documented grammar: <sign>? <digits>[.<digits>] | <sign>? .<digits>, then a
# suffix. The split is loose on purpose; the suffix is checked against the tables.
_SHAPE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")
_SUFFIX_ALPHABET = frozenset("eEinumkKMGTP+-0123456789")

# Kubernetes accepts any length; these bounds keep exact arithmetic cheap and stay far
# beyond anything a cgroup value (int64) can use.
_MAX_LENGTH = 1000
_MAX_EXPONENT = 1000

# Parsing rounds to nano resolution, away from zero (inf.RoundUp), like apimachinery.
_NANO = 10**9


@dataclass(frozen=True, slots=True, eq=False)
class Quantity:
    """An exact quantity plus the format it was written in (used only for str())."""

    amount: Fraction
    format: Format = Format.DECIMAL_SI
    #: apimachinery holds it as an `inf.Dec` rather than an int64 and a scale: ParseQuantity's
    #: slow path (`_parsed_as_inf_dec`). Its Value() and MilliValue() round differently.
    inf_dec: bool = False

    def __post_init__(self) -> None:
        if (self.amount * _NANO).denominator != 1:
            raise QuantityError(f"{self.amount} is finer than the nano resolution of a quantity")

    def __eq__(self, other: object) -> bool:
        # Like Quantity.Cmp: "1k", "1000" and "1e3" are the same quantity.
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.amount == other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    def value(self) -> int:
        """Quantity.Value(): the integer value, rounded as apimachinery rounds it."""
        return self._scaled(self.amount)

    def milli_value(self) -> int:
        """Quantity.MilliValue(): value * 1000, rounded as apimachinery rounds it."""
        return self._scaled(self.amount * 1000)

    def _scaled(self, amount: Fraction) -> int:
        # An int64-backed quantity rounds away from zero (negativeScaleInt64). An inf.Dec
        # one goes through scaledValue (scale_int.go), which truncates toward zero as Go's
        # `/` does and adds 1 for any remainder, whatever the sign: -1.5 -> 0, -1n -> 1.
        if not self.inf_dec:
            return _round_away_from_zero(amount)
        truncated = int(amount)
        return truncated + 1 if amount != truncated else truncated

    def __str__(self) -> str:
        """Kubernetes canonical form (Quantity.String())."""
        amount = self.amount
        if amount == 0:
            return "0"
        if (
            self.format is Format.BINARY_SI
            and not -1024 < amount < 1024
            and amount.denominator == 1
        ):
            return _binary_string(amount.numerator)
        mantissa, exponent = _decimal_mantissa(amount)
        if self.format is not Format.DECIMAL_EXPONENT:
            suffix = _DECIMAL_SUFFIX_BY_EXPONENT.get(exponent)
            if suffix is not None:
                return f"{mantissa}{suffix}"
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)


def parse_quantity(text: str) -> Quantity:
    """Parse a Kubernetes quantity string ("500m", "1k", "2Gi", "1e3", "-1.5")."""
    if not text:
        raise QuantityError("empty quantity")
    if len(text) > _MAX_LENGTH:
        raise QuantityError(f"quantity is longer than {_MAX_LENGTH} characters")
    shape = _SHAPE.fullmatch(text)
    if shape is None:  # pragma: no cover - the pattern matches every string
        raise QuantityError(f"invalid quantity {text!r}")
    sign, whole, fraction, suffix = shape.groups()
    fraction = fraction or ""
    # apimachinery's scanner reads a missing number as 0 ("k", "Mi", "-", "."), and the API
    # server stores such quantities, so a pod can carry them: they are zero here too.
    fmt, exponent = _interpret_suffix(text, suffix, bool(whole or fraction))
    inf_dec = _parsed_as_inf_dec(whole, fraction, fmt, exponent)
    amount = Fraction(int(whole + fraction or "0"), 10 ** len(fraction))
    if fmt is Format.BINARY_SI:
        amount *= 2**exponent
    else:
        amount *= Fraction(10) ** exponent
    if sign == "-":
        amount = -amount
    amount = Fraction(_round_away_from_zero(amount * _NANO), _NANO)
    if fmt is Format.BINARY_SI:
        # apimachinery silently caps binary-suffixed quantities at MaxInt64 ("8Ei" -> 2^63-1).
        if abs(amount) > INT64_MAX:
            amount = Fraction(INT64_MAX if amount > 0 else -INT64_MAX)
        elif 0 < abs(amount) < 1:
            fmt = Format.DECIMAL_SI
    return Quantity(amount, fmt, inf_dec)


def _parsed_as_inf_dec(whole: str, fraction: str, fmt: Format, exponent: int) -> bool:
    """Whether ParseQuantity (quantity.go) leaves its int64 fast path for an inf.Dec.

    Decimal: more than 18 digits (leading zeros of the whole part not counted, an empty
    whole part counted as one digit), or finer than nano as written (`1e-10`, `0.5n`,
    `0.0000000001`, even when the digits are zeros). Binary: any fraction, or more digits
    than the suffix leaves room for in int64 (`15 - digits - exponent*3/10 - 1 < 0`).
    """
    digits = len(whole.lstrip("0") or "0")
    if fmt is Format.BINARY_SI:
        return bool(fraction) or 14 - digits - exponent * 3 // 10 < 0
    return digits + len(fraction) > 18 or exponent - len(fraction) < -9


# The shape of nearly every real quantity: digits, then no suffix or one of the tables'
# (no sign, fraction or exponent). Its value is plain integer arithmetic: the number
# times the first of its suffix's pair, divided by the second (m, u and n), rounded up.
_PLAIN = re.compile(r"([0-9]+)([numkMGTPE]?|[KMGTPE]i)")
_PLAIN_SCALE: dict[str, tuple[int, int]] = {
    suffix: (10**exponent, 1) if exponent >= 0 else (1, 10**-exponent)
    for suffix, exponent in _DECIMAL_SUFFIXES.items()
}


def quantity_value(text: str) -> int:
    """parse_quantity(text).value(), the same value or error, without exact fractions.

    The fractions are most of the cost of parsing (some 20 us a quantity); a plain
    quantity needs none of them.
    """
    plain = _PLAIN.fullmatch(text)
    if plain is None or len(text) > _MAX_LENGTH:
        return parse_quantity(text).value()
    digits, suffix = plain.groups()
    number = int(digits)
    power = _BINARY_SUFFIXES.get(suffix)
    if power is not None:
        return min(number << power, INT64_MAX)  # parse_quantity's cap of binary suffixes
    multiplier, divisor = _PLAIN_SCALE[suffix]
    # Exact at nano resolution; Value() rounds a fraction up (away from zero).
    return -(-number * multiplier // divisor)


def _interpret_suffix(text: str, suffix: str, has_number: bool) -> tuple[Format, int]:
    decimal = _DECIMAL_SUFFIXES.get(suffix)
    if decimal is not None:
        return Format.DECIMAL_SI, decimal
    binary = _BINARY_SUFFIXES.get(suffix)
    if binary is not None:
        return Format.BINARY_SI, binary
    exponent = _EXPONENT.fullmatch(suffix)
    if exponent is None:
        stray = next((ch for ch in suffix if ch not in _SUFFIX_ALPHABET), None)
        if stray is not None:
            where = (
                "after the number"
                if has_number
                else "(a quantity is a number such as 1, 1.5 or .5, then a suffix such as m or Mi)"
            )
            raise QuantityError(f"invalid quantity {text!r}: unexpected {stray!r} {where}")
        raise QuantityError(
            f"invalid quantity {text!r}: unknown suffix {suffix!r} (expected one of "
            "n u m k M G T P E Ki Mi Gi Ti Pi Ei, or an exponent such as e3)"
        )
    value = int(exponent.group(1))
    if abs(value) > _MAX_EXPONENT:
        raise QuantityError(f"invalid quantity {text!r}: exponent beyond +/-{_MAX_EXPONENT}")
    return Format.DECIMAL_EXPONENT, value


def _round_away_from_zero(amount: Fraction) -> int:
    whole, rest = divmod(abs(amount.numerator), amount.denominator)
    if rest:
        whole += 1
    return whole if amount.numerator >= 0 else -whole


def _decimal_mantissa(amount: Fraction) -> tuple[int, int]:
    """The integer mantissa and the largest exponent that is a multiple of 3."""
    exponent = 0
    while amount.denominator != 1:
        amount *= 10
        exponent -= 1
    mantissa = amount.numerator
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    return mantissa, exponent


def _binary_string(value: int) -> str:
    power = 0
    while value % 1024 == 0 and power < len(_BINARY_SUFFIX_BY_POWER) - 1:
        value //= 1024
        power += 1
    return f"{value}{_BINARY_SUFFIX_BY_POWER[power]}"
