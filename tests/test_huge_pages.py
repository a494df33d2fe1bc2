"""omni_quant.runtime.huge_pages: weights copied into THP-marked arenas keep their values, and the pages are huge."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_quant.runtime import huge_pages
from skips import NO_THP


def _mapping_of(addr: int) -> dict[str, int]:
    """The /proc/self/smaps fields (kB) of the mapping that holds virtual address ``addr``."""
    fields: dict[str, int] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            if fields is not None:
                return fields
            fields = {} if lo <= addr < hi else None
        elif fields is not None and line.endswith(" kB"):
            name, value = line.split(":")
            fields[name] = int(value.split()[0])
    assert fields is not None, f"no mapping holds {addr:#x}"
    return fields


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.int32])
def test_place_copies_values_shape_dtype(monkeypatch, dtype):
    monkeypatch.setenv("OMNI_INT4_HUGE_PAGES", "1")
    t = torch.randint(0, 120, (300, 517), dtype=torch.int32).to(dtype)
    out = huge_pages.place(t)
    assert out.shape == t.shape and out.dtype == dtype and out.is_contiguous()
    assert torch.equal(out, t)
    if huge_pages.thp_mode() in ("always", "madvise"):
        assert out.data_ptr() != t.data_ptr()
        assert out.data_ptr() % 64 == 0
        out2 = huge_pages.place(t)  # the next piece of the same arena, not overlapping
        assert abs(out2.data_ptr() - out.data_ptr()) >= t.numel() * t.element_size()


def test_small_tensors_and_setting_off_stay_put(monkeypatch):
    monkeypatch.setenv("OMNI_INT4_HUGE_PAGES", "1")
    small = torch.zeros(huge_pages.MIN_BYTES // 4 - 1, dtype=torch.float32)
    assert huge_pages.place(small) is small
    monkeypatch.setenv("OMNI_INT4_HUGE_PAGES", "0")
    big = torch.zeros(1 << 20, dtype=torch.uint8)
    assert huge_pages.place(big) is big


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert huge_pages.thp_mode(f) == "madvise"
    f.write_text("[always] madvise never\n")
    assert huge_pages.thp_mode(f) == "always"
    f.write_text("garbage\n")
    assert huge_pages.thp_mode(f) == "absent"
    assert huge_pages.thp_mode(tmp_path / "missing") == "absent"


def test_placed_weights_are_backed_by_huge_pages(monkeypatch):
    NO_THP.skip_if_holds()
    monkeypatch.setenv("OMNI_INT4_HUGE_PAGES", "1")
    t = torch.ones(16 << 20, dtype=torch.uint8)
    out = huge_pages.place(t)
    fields = _mapping_of(out.data_ptr())
    assert fields["AnonHugePages"] >= 8 << 10, fields  # at least half of the 16 MiB copy in 2 MiB pages


def test_a_placed_tensor_survives_the_loss_of_its_source(monkeypatch):
    monkeypatch.setenv("OMNI_INT4_HUGE_PAGES", "1")
    t = torch.arange(1 << 18, dtype=torch.int32)
    out = huge_pages.place(t)
    del t
    assert int(out[-1]) == (1 << 18) - 1 and int(out.sum(dtype=torch.int64)) == (1 << 18) * ((1 << 18) - 1) // 2
