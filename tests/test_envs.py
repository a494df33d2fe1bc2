"""The settings registry (omni_platform.envs)."""

import pytest

from omni_platform import envs


def test_defaults_and_parsing(monkeypatch):
    monkeypatch.delenv("OMNI_IR_CPU_NORMS", raising=False)
    assert envs.OMNI_IR_CPU_NORMS is False
    monkeypatch.setenv("OMNI_IR_CPU_NORMS", "1")
    assert envs.OMNI_IR_CPU_NORMS is True
    monkeypatch.setenv("OMNI_KV_CACHE_MAX_FRACTION", "0.25")
    assert envs.OMNI_KV_CACHE_MAX_FRACTION == 0.25


def test_unknown_setting_is_an_error():
    with pytest.raises(AttributeError, match="no setting 'OMNI_TYPO'"):
        envs.OMNI_TYPO  # noqa: B018


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("OMNI_KV_CACHE_MAX_FRACTION", "3")
    with pytest.raises(ValueError, match="OMNI_KV_CACHE_MAX_FRACTION='3'"):
        envs.OMNI_KV_CACHE_MAX_FRACTION  # noqa: B018


def test_unknown_variables_in_the_environment_are_listed():
    assert envs.unknown_omni_variables({"OMNI_IR_CPU_NORM": "1", "OMNI_FEW_CPUS": "2", "PATH": "/"}) == [
        "OMNI_IR_CPU_NORM"
    ]
