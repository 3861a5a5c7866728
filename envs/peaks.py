"""Peak dense TFLOP/s per device and precision, read from device_peaks.toml (a datasheet
source per row): what a run's efficiency is measured against.

    peak("NVIDIA H200", "bf16")  -> Peak(model="NVIDIA H200 SXM", tflops=989.4, ...)
    peak("cpu:AMD EPYC 7763", "fp32") -> PeakUnknown("... CPUs ...")

A device or precision the table does not know gives a :class:`PeakUnknown` with the reason,
never a made-up number.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from dsenv.data import load_table

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class Peak:
    model: str  # the table's name for the device ("NVIDIA H200 SXM")
    precision: str  # the precision whose peak this is (tf32 falls back to fp32 on CDNA)
    tflops: float
    source: str
    note: str = ""

    def as_dict(self) -> dict:
        return {"model": self.model, "precision": self.precision, "tflops": self.tflops,
                "source": self.source, "note": self.note}


@dataclass(frozen=True)
class PeakUnknown:
    reason: str


def rows() -> list[dict]:
    return load_table("dsenv.envs", "device_peaks.toml")["device"]


def device_row(device_type: str) -> dict | None:
    """The first row whose ``match`` globs name this device (case-insensitive)."""
    name = device_type.strip().lower()
    for row in rows():
        if any(fnmatch.fnmatchcase(name, glob.lower()) for glob in row["match"]):
            return row
    return None


def peak(device_type: str, precision: str) -> Peak | PeakUnknown:
    """The dense peak of ``precision`` (fp32, tf32, bf16, fp16) on this device."""
    if device_type.startswith("cpu:"):
        return PeakUnknown("no peak for CPUs: dsenv keeps no table of CPU FLOP/s (it depends "
                           "on the cores, clocks and vector units a job gets, which the run "
                           "does not measure)")
    row = device_row(device_type)
    if row is None:
        return PeakUnknown(f"no peak for {device_type!r} in device_peaks.toml (add a row with "
                           "its datasheet's dense TFLOP/s)")
    note = ""
    if precision == "tf32" and "tf32" not in row:  # CDNA, Volta, Turing: fp32 math runs
        precision, note = "fp32", "no tf32 units: torch's tf32 switch leaves fp32 math"
    if precision not in row:
        return PeakUnknown(f"{row['model']} has no {precision} math units (its datasheet "
                           f"lists none: {row['source'].split(' ')[0]})")
    if "package" in row:
        note = (f"per GCD, the device torch sees: the package has {row['package']['gcds']} "
                f"({row['package'][precision]:g} TFLOP/s {precision})")
    return Peak(row["model"], precision, float(row[precision]), row["source"], note)
