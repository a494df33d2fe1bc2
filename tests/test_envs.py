"""The settings registry (omni_platform.envs)."""

import os

import pytest

from omni_platform import envs

SHIPPED_DEFAULTS = {
    # what README and docs promise a user who sets nothing (the defaults that carry the wins, and the switches)
    "OMNI_SPECULATION": "auto", "OMNI_SPEC_MIN_MATCH": 3, "OMNI_SPEC_START_K": 4, "OMNI_SPEC_FOLLOW_EDITS": True,
    "OMNI_OPEN_METRICS": False, "OMNI_COMPILE_AHEAD": True, "OMNI_COMPILE_YIELD": True,
    "OMNI_KV_CACHE_MAX_MIB": 2048, "OMNI_KV_CACHE_MAX_FRACTION": 0.5, "OMNI_FEW_CPUS": 4,
    "OMNI_CPU_ATTN_ONE_OP": True, "OMNI_FUSED_LAYERS": True, "OMNI_MAPPED_WEIGHTS": True,
    "OMNI_INT4_KERNEL": "auto", "OMNI_IR_CPU_NORMS": False, "OMNI_ORPHAN_WATCHDOG": True,
    "OMNI_MALLOC_TRIM_S": 10, "OMNI_MALLOC_MMAP_THRESHOLD": 1 << 20,
}


def test_with_nothing_set_every_setting_reads_its_shipped_default(monkeypatch):
    """Every declared setting, read with no OMNI_* variable in the environment: the registry's default, and for
    the ones the docs promise, the value promised; every patch switch off (each patch on)."""
    from omni_platform.extensions import declare_installed_settings

    declare_installed_settings()
    for name in [k for k in os.environ if k.startswith("OMNI_")]:
        monkeypatch.delenv(name)
    read = {name: getattr(envs, name) for name in envs.SETTINGS}
    assert {k: read[k] for k in SHIPPED_DEFAULTS} == SHIPPED_DEFAULTS
    assert read == {name: s.default for name, s in envs.SETTINGS.items()}
    switches = [n for n in read if n.startswith("OMNI_PATCH_") and n.endswith("_OFF")]
    assert len(switches) >= 19 and not any(read[n] for n in switches)


def test_parsing(monkeypatch):
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
