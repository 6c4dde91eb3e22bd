"""Run by test_toolchains.py only (not collected: its name lacks the test_ prefix)."""

import pytest

from tests import toolchains


def test_needs_a_missing_toolchain() -> None:
    pytest.skip(toolchains.missing("frobnicator is not installed", "make tools"))


def test_skips_for_another_reason() -> None:
    pytest.skip("not a toolchain")
