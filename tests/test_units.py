"""Sizes and digits as written in configs: strict ASCII, finite, bounded, and a ValueError for anything else."""

from __future__ import annotations

import pytest

from supervisor.text.show import fmt_bytes
from supervisor.text.units import GIB, MAX_SIZE, MIB, is_ascii_digits, parse_size


@pytest.mark.parametrize(("text", "expected"), [
    ("128GiB", 128 * GIB), ("512MiB", 512 * MIB), ("64M", 64 * MIB), ("1.5G", int(1.5 * GIB)),
    ("4096", 4096), (" 2 GiB ", 2 * GIB), ("1kb", 1000), ("1KiB", 1024), ("3mb", 3_000_000), ("1T", 1 << 40),
    ("10b", 10), (12345, 12345), ("13.6GiB", int(13.6 * GIB)), (".5G", GIB // 2), ("0", 0),
    ("1024TiB", MAX_SIZE), (MAX_SIZE, MAX_SIZE), ("1PiB", MAX_SIZE), ("1p", MAX_SIZE), ("1pb", 10**15),
])
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


def test_a_unit_in_b_is_decimal_and_one_letter_or_ib_binary() -> None:
    # As docs/configuration.md and profile.md say: "128GB" lets through the "128 GB" machine (125.8 GiB) that
    # "128GiB" and "128G" refuse. curio's fetch-params size is read otherwise (prover configkeys.curio_size).
    machine = int(125.8 * GIB)
    assert parse_size("128GB") == 128 * 10**9 < machine < parse_size("128GiB") == parse_size("128G")
    assert [parse_size(f"1{unit}") for unit in ("kB", "KB", "MB", "GB", "TB")] == [10**e for e in (3, 3, 6, 9, 12)]


@pytest.mark.parametrize("text", [
    "", "GiB", "12XB", "-1GiB", "abc", "1.2.3M",
    # what float() and str.isdigit() let through
    "1e999", "1e9", "inf", "nan", "Infinity", "²", "²GiB", "١٢GiB", "𝟗M", "1_000", "0x10", "+5G",
    pytest.param("9" * 400, id="400-digits"), pytest.param("9" * 5000 + "GiB", id="5000-digits"),
    "1025TiB", "1.01PiB", "2PiB", "1 G i B", "1\x00G",
    "1.5", "0.5b", "2.25 B",  # a fraction of a byte (was cut to whole bytes: "1.5" was 1)
    -1, MAX_SIZE + 1, pytest.param(10**400, id="10**400"), True, 1.5, None,
])
def test_parse_size_refuses(text: object) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(text)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message and len(message) < 200, message


@pytest.mark.parametrize(("n", "expected"), [
    (None, "?"), (0, "0B"), (1023, "1023B"), (1024, "1.0KiB"), (64 * MIB, "64.0MiB"), (256 * MIB, "256.0MiB"),
    (int(1.5 * GIB), "1.5GiB"), (24 * GIB, "24.0GiB"),
])
def test_fmt_bytes(n: int | None, expected: str) -> None:
    assert fmt_bytes(n) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("0", True), ("65535", True), ("", False), ("²", False), ("١٢", False), ("𝟗", False), ("1.0", False),
    (" 1", False), ("-1", False),
])
def test_is_ascii_digits(text: str, expected: bool) -> None:
    assert is_ascii_digits(text) is expected
