"""argparse value types shared by every subcommand: one clear line for a bad value."""

from __future__ import annotations

import argparse
import math


def csv_list(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _whole(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None


def positive_int(value: str) -> int:
    number = _whole(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return number


def non_negative_int(value: str) -> int:
    number = _whole(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return number


def _number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if math.isnan(number):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number")
    return number


def positive_float(value: str) -> float:
    number = _number(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be more than 0")
    return number


def non_negative_float(value: str) -> float:
    number = _number(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return number
