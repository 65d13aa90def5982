"""Top-level functions for process-pool tests (workers import them by module name)."""

from __future__ import annotations

import os
from typing import Any


def double(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "double": sample["id"] * 2, "pid": 0}


def keep_even(sample: dict[str, Any]) -> bool:
    return sample["id"] % 2 == 0


def fail_on_13(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["id"] == 13:
        raise KeyError(f"no luck for {sample['id']}")
    return sample


def die_on_7(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["id"] == 7:
        os._exit(3)  # a worker killed mid-task
    return sample


def drop_multiples_of_5(sample: dict[str, Any]) -> dict[str, Any] | None:
    return None if sample["id"] % 5 == 0 else sample
