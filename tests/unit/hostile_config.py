"""Configuration texts that must be refused with a reason, never with a crash or a hang."""

from __future__ import annotations

from nri_midbatch.config.model import MAX_CONFIG_BYTES


def _alias_bomb() -> str:
    """Nine levels of nine aliases each: a few hundred bytes standing for 9**9 strings."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 9):
        refs = ", ".join([f"*l{level - 1}"] * 9)
        lines.append(f"l{level}: &l{level} [{refs}]")
    return "\n".join(lines) + "\n"


#: id -> (text, what the refusal says)
HOSTILE_YAML: dict[str, tuple[str, str]] = {
    "nested-20000-deep": ("tiers: " + "[" * 20_000 + "]" * 20_000 + "\n", "levels deep"),
    "nested-mappings": ("rules: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n", "levels deep"),
    "number-of-5000-digits": ("failurePolicy: " + "9" * 5_000 + "\n", "digits"),
    "alias-bomb": (_alias_bomb(), "once its aliases are expanded"),
    "alias-cycle": ("tiers: &loop [*loop]\n", "refers to a node that contains it"),
    "unhashable-key": ("? [a, b]\n: 1\n", "not valid YAML"),
    "too-large": ("# " + "x" * MAX_CONFIG_BYTES + "\n", f"larger than {MAX_CONFIG_BYTES} bytes"),
}
