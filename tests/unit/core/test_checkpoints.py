"""Newest-first order of checkpoint directories: natural order of names."""

from __future__ import annotations

import pytest

from gateway.core.checkpoints import directory, natural_key


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("step_9", "step_10"),
        ("step_99", "step_100"),
        ("epoch_1_step_900", "epoch_2_step_100"),
        ("2026-11-09T23", "2026-11-10T01"),
        ("checkpoint-500", "checkpoint-1000"),
        ("step_10", "step_10_final"),
        ("global_step8", "global_step16"),
    ],
)
def test_natural_key_orders_numbers_as_numbers(older: str, newer: str) -> None:
    assert natural_key(older) < natural_key(newer)


def test_natural_key_ties_zero_padding_and_sorts_words() -> None:
    assert natural_key("step_010") == natural_key("step_10")
    assert sorted(["b", "a10", "a9"], key=natural_key) == ["a9", "a10", "b"]


def test_directory_normalizes_a_prefix() -> None:
    assert directory("ckpt") == "ckpt/" and directory("ckpt/") == "ckpt/" and directory("") == ""
