"""Print every driver and the devices of the available ones (what ``hal --dump-devices`` shows)."""

import hal

for info in hal.list_drivers():
    if not info.available:
        print(f"{info.name}: unavailable ({info.reason})")
        continue
    for device in hal.get_driver(info.name).query_devices():
        print(f"{info.name}: {device.uri} {device.name} id={device.id}")
