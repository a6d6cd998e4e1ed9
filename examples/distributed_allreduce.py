"""Sum a vector over several devices with a HAL channel: one process per GPU, or one process for all.

    torchrun --nproc-per-node 2 examples/distributed_allreduce.py         # a process per GPU (cuda://LOCAL_RANK)
    python examples/distributed_allreduce.py --local 4 --driver local-task  # one process, four devices

A process per device takes its rank, the rank count and the communicator id from the launcher
(torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, or mpirun's variables):
``hal.create_channel(device)``. One process driving several devices makes every rank at once:
``hal.create_channels(devices)``. Each rank fills its vector with rank + 1, one command buffer
all-reduces it in place, and every rank checks it holds 1 + 2 + ... + count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import hal  # noqa: E402
from hal import channel_provider  # noqa: E402


def all_reduce(devices: list[hal.Device], channels: list[hal.Channel], n: int) -> list[np.ndarray]:
    """Fill each rank's vector with rank + 1, all-reduce it in place on every rank, read it back."""
    buffers, sems = [], []
    for device, channel in zip(devices, channels):
        buf = device.allocator.allocate(4 * n)
        device.write(buf, np.full(n, channel.rank + 1, np.float32))
        cb = device.create_command_buffer()
        with cb.record():
            cb.all_reduce(channel, buf, buf, n, "float32")
        sem = device.create_semaphore(0)
        device.queue_execute([cb], signal=[(sem, 1)])
        buffers.append(buf)
        sems.append(sem)
    for sem in sems:
        sem.wait(1, timeout=120)
    return [np.frombuffer(d.read(b), np.float32) for d, b in zip(devices, buffers)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", type=int, default=0, metavar="N",
                        help="drive N devices from this one process (default: one device, rank from the launcher)")
    parser.add_argument("--driver", default="cuda", help="driver of the devices (default: cuda)")
    parser.add_argument("--n", type=int, default=1 << 20, help="elements of the vector (default: 1M)")
    args = parser.parse_args()
    if args.n < 1 or args.local < 0:
        parser.error("--n must be at least 1 and --local at least 0")
    if args.local:
        devices = [hal.create_device(f"{args.driver}://{i}" if args.driver not in ("local-sync", "local-task")
                                     else args.driver) for i in range(args.local)]
        channels = hal.create_channels(devices)
    else:
        launch = channel_provider.launch_environment()
        local_rank = launch.local_rank if launch is not None else 0
        devices = [hal.create_device(f"{args.driver}://{local_rank}")]
        channels = [hal.create_channel(devices[0])]
    results = all_reduce(devices, channels, args.n)
    expected = sum(range(1, channels[0].count + 1))
    ok = all(bool(np.all(r == expected)) for r in results)
    for channel, result in zip(channels, results):
        print(f"rank {channel.rank} of {channel.count} on {channel.device.info.uri}: {result[0]:g} "
              f"(expected {expected}) -> {'OK' if ok else 'WRONG'}")
    for channel in channels:
        channel.close()
    for device in devices:
        device.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
