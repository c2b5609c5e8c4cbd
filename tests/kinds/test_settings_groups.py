"""A kind's own settings group: read from its PRECOMPUTE_<GROUP>_* variables once, given instead
where a caller has one, and refused at the registry where it would read another group's."""

from __future__ import annotations

import pytest
from pydantic_settings import BaseSettings, SettingsConfigDict

from precompute.kinds import KindError, check_group
from precompute.settings import Machine
from tests.kinds.lengths import Lengths, LengthsSettings


def test_a_kinds_group_is_read_once_from_its_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECOMPUTE_LENGTHS_UNIT", "bytes")
    machine = Machine.from_environment()
    first = machine.group(LengthsSettings)
    monkeypatch.setenv("PRECOMPUTE_LENGTHS_UNIT", "characters")
    assert first.unit == "bytes" and machine.group(LengthsSettings) is first
    given = Machine.from_environment(LengthsSettings(unit="bytes"))
    assert given.group(LengthsSettings).unit == "bytes"  # given, not read


def test_a_group_named_like_the_machines_own_or_off_the_pattern_is_refused() -> None:
    class Engine(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_ENGINE_")

    class Loose(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="LENGTHS_")

    for settings, refused in ((Engine, "'PRECOMPUTE_ENGINE_'"), (Loose, "'LENGTHS_'")):
        kind = Lengths()
        kind.settings = settings
        with pytest.raises(KindError, match=f"output kind 'lengths': its settings' env_prefix {refused} must be"):
            check_group(kind)
    check_group(Lengths())  # PRECOMPUTE_LENGTHS_: its own
