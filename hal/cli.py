"""``hal --list-drivers`` and ``hal --dump-devices [--driver NAME] [--json]``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from hal.errors import HalError
from hal.registry import get_driver, list_drivers

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


def _human_bytes(value: Any) -> str:
    if not isinstance(value, int):
        return str(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{value} B"
        value /= 1024  # type: ignore[assignment]
    return str(value)


def _print_drivers(as_json: bool) -> int:
    infos = list_drivers()
    if as_json:
        print(json.dumps([{"name": i.name, "summary": i.summary, "available": i.available,
                           "reason": i.reason} for i in infos], indent=2))
        return EXIT_OK
    width = max(len(i.name) for i in infos)
    for info in infos:
        state = "available" if info.available else f"unavailable: {info.reason}"
        print(f"{info.name:<{width}}  {info.summary}  [{state}]")
    return EXIT_OK


def _collect_devices(driver_name: str | None) -> tuple[list[dict], list[dict]]:
    devices, skipped = [], []
    names = [driver_name] if driver_name else [i.name for i in list_drivers()]
    for name in names:
        try:
            driver = get_driver(name)
            for info in driver.query_devices():
                devices.append(info.as_dict())
        except HalError as exc:
            if driver_name:  # asked for explicitly: that is an error the caller must see
                raise
            skipped.append({"driver": name, "reason": exc.message})
    return devices, skipped


def _print_devices(driver_name: str | None, as_json: bool) -> int:
    devices, skipped = _collect_devices(driver_name)
    if as_json:
        print(json.dumps({"devices": devices, "unavailable_drivers": skipped}, indent=2, default=str))
        return EXIT_OK
    for device in devices:
        print(f"{device['uri']}  {device['name']}")
        print(f"  driver: {device['driver']}  ordinal: {device['ordinal']}  id: {device['id']}")
        for key, value in device["properties"].items():
            shown = _human_bytes(value) if key.startswith("memory") else value
            print(f"  {key}: {shown}")
    for entry in skipped:
        print(f"({entry['driver']}: {entry['reason']})")
    if not devices:
        print("no devices found")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hal", description="Inspect HAL drivers and devices.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--list-drivers", action="store_true", help="list every driver and whether it is available")
    action.add_argument("--dump-devices", action="store_true", help="describe the devices of available drivers")
    parser.add_argument("--driver", metavar="NAME", help="only this driver's devices (with --dump-devices)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    try:
        if args.list_drivers:
            return _print_drivers(args.json)
        return _print_devices(args.driver, args.json)
    except HalError as exc:
        print(f"hal: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE if exc.code.name == "UNAVAILABLE" else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
