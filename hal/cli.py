"""``hal --list-drivers``, ``hal --dump-devices``, ``hal --version``; ``--driver NAME`` and ``--json`` on both."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from hal import __version__
from hal.distribution import NAME as DISTRIBUTION
from hal.driver import DriverInfo
from hal.errors import HalError, NotFoundError, StatusCode
from hal.registry import get_driver, list_drivers, parse_uri, plugin_problems

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3

EXIT_CODES = f"""exit codes:
  {EXIT_OK}  success (also when the reader of the output closes it early, as `| head` does)
  {EXIT_ERROR}  error: an unknown driver, a failing driver or device, an output that cannot be written
  {EXIT_USAGE}  usage error: unknown or conflicting options
  {EXIT_UNAVAILABLE}  the driver asked for with --driver is unavailable on this machine"""


def _human_bytes(value: Any) -> str:
    if not isinstance(value, int):
        return str(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{value} B"
        value /= 1024  # type: ignore[assignment]
    return str(value)


def _driver_and_device(selected: str | None) -> tuple[str | None, str | None]:
    """``--driver`` takes a driver name or a device URI (as HAL_DEVICE does): (driver name, device key)."""
    return parse_uri(selected) if selected is not None else (None, None)


def _drivers(driver_name: str | None) -> list[DriverInfo]:
    infos = list_drivers()
    if driver_name is None:
        return infos
    chosen = [i for i in infos if i.name == driver_name]
    if not chosen:
        raise NotFoundError(f"no driver named {driver_name!r}; known drivers: {', '.join(i.name for i in infos)}")
    return chosen


def _print_drivers(driver_name: str | None, as_json: bool) -> int:
    infos = _drivers(driver_name)
    if as_json:
        print(
            json.dumps(
                [{"name": i.name, "summary": i.summary, "available": i.available, "reason": i.reason} for i in infos],
                indent=2,
            )
        )
    else:
        width = max(len(i.name) for i in infos)
        for info in infos:
            state = "available" if info.available else f"unavailable: {info.reason}"
            print(f"{info.name:<{width}}  {info.summary}  [{state}]")
    for problem in plugin_problems():
        print(f"hal: plugin {problem}", file=sys.stderr)
    return EXIT_OK


def _collect_devices(driver_name: str | None, device_key: str | None) -> tuple[list[dict], list[dict]]:
    devices, skipped = [], []
    for info in _drivers(driver_name):
        try:
            found = get_driver(info.name).query_devices()
            if device_key is not None:
                found = [d for d in found if d.selected_by(device_key)]
                if not found:
                    raise NotFoundError(f"driver {info.name!r} has no device {device_key!r}")
            for device in found:
                devices.append(device.as_dict())
        except HalError as exc:
            if driver_name:  # asked for explicitly: that is an error the caller must see
                raise
            skipped.append({"driver": info.name, "reason": exc.message})
    return devices, skipped


def _print_devices(driver_name: str | None, device_key: str | None, as_json: bool) -> int:
    devices, skipped = _collect_devices(driver_name, device_key)
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hal",
        description="Inspect HAL drivers and devices.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--list-drivers", action="store_true", help="list every driver and whether it is available")
    action.add_argument("--dump-devices", action="store_true", help="describe the devices of available drivers")
    parser.add_argument("--driver", metavar="NAME|URI",
                        help="only this driver, or with a device URI (cuda://0) only that device")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--version", action="version", version=f"hal ({DISTRIBUTION}) {__version__}")
    return parser


def _quiet_broken_pipe() -> int:
    """The reader went away (``hal ... | head``): send what Python still flushes at exit nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_OK


def _unwritable(exc: OSError | None) -> int:
    """Standard output is closed (``hal ... >&-``) or cannot take the output (``> /dev/full``): say so on
    standard error and leave with an error, instead of a traceback or a silent success."""
    why = "standard output is closed" if exc is None else f"cannot write the output: {exc.strerror or exc}"
    if sys.stderr is not None:
        print(f"hal: {why}", file=sys.stderr)
    if sys.stdout is not None:  # what is still buffered must not fail again when Python flushes at exit
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    # Unknown flags first: argparse would otherwise report "--list-drivers is required" for `hal --bogus`.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not (args.list_drivers or args.dump_devices):
        parser.error("one of the arguments --list-drivers --dump-devices is required")
    if sys.stdout is None:
        return _unwritable(None)
    try:
        driver_name, device_key = _driver_and_device(args.driver)
        if args.list_drivers:
            code = _print_drivers(driver_name, args.json)
        else:
            code = _print_devices(driver_name, device_key, args.json)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except OSError as exc:
        return _unwritable(exc)
    except HalError as exc:
        print(f"hal: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE if exc.code is StatusCode.UNAVAILABLE else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
