"""One device object per URI: hal.open_device shares the device a program created, the runtime resolves its
URIs through it and takes a hal.Device wherever it takes a URI, and it never closes a device it did not open."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from rt_helpers import DEVICES

import hal
import runtime as rt

CPU = [uri for uri in DEVICES if uri != "cuda"]


@pytest.fixture(autouse=True)
def _restore_default():
    before = rt.default_device()
    yield
    rt.set_default_device(before)


@pytest.mark.parametrize("uri", CPU)
def test_open_device_shares_the_oldest_open_device_of_a_uri(uri):
    first = hal.create_device(uri)
    second = hal.create_device(uri)
    try:
        assert second is not first  # create_device always makes a new one
        shared = hal.open_device(uri)
        assert shared.info.uri == first.info.uri
        for spelling in (uri, f"{uri}://", f"{uri}://0", f"{uri}:0"):
            assert hal.open_device(spelling) is shared
    finally:
        first.close()
        second.close()
    assert hal.open_device(uri) is not first and not hal.open_device(uri).closed


@pytest.mark.parametrize("uri", CPU)
def test_a_closed_device_is_not_shared(uri):
    dev = hal.create_device(uri)
    dev.close()
    again = hal.open_device(uri)
    assert again is not dev and not again.closed
    with pytest.raises(hal.NotFoundError):
        hal.open_device(f"{uri}://7")


@pytest.mark.parametrize("uri", CPU)
def test_the_runtime_takes_a_device_object_and_uses_it(uri):
    dev = hal.create_device(uri)
    try:
        x = rt.arange(5, device=dev) * 2
        assert x.device is dev
        assert rt.array(np.ones(3), device=dev).device is dev
        assert rt.zeros((2,), device=dev).device is dev
        previous = rt.default_device()
        with rt.set_default_device(dev) as inside:
            assert inside is dev and rt.default_device() is dev
            y = rt.ones((3,)) + 1
            assert y.device is dev
        assert rt.default_device() is previous  # restored, and the device left open
        assert not dev.closed
        handle = rt.set_default_device(dev)
        assert handle.device is dev and rt.default_device() is dev
        np.testing.assert_array_equal(x.numpy(), np.arange(5) * 2)
        np.testing.assert_array_equal(y.numpy(), [2, 2, 2])
        dev.wait_idle()  # the runtime's work was submitted on this very device
        assert not dev.closed
    finally:
        dev.close()


def _run(code: str) -> dict:
    """Run `code` in a fresh interpreter (no device opened before it) and return the JSON it prints."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("uri", CPU)
def test_the_runtime_uses_the_device_a_program_created_for_its_uri(uri, tmp_path):
    got = _run(f"""
        import json, numpy as np, hal, runtime as rt
        dev = hal.create_device({uri!r})
        trace = {str(tmp_path / "trace.json")!r}
        with hal.trace(trace):
            x = rt.arange(6, device={uri!r}) * 3
            y = rt.array(np.ones(4), device="{uri}://0") + 1
            rt.eval(x, y)
            dev.wait_idle()
        same = [x.device is dev, y.device is dev, hal.open_device({uri!r}) is dev]
        with rt.set_default_device({uri!r}) as d:
            same.append(d is dev)
        values = [x.numpy().tolist(), y.numpy().tolist()]
        events = json.load(open(trace))["traceEvents"]
        names = sorted({{e["name"] for e in events if e.get("ph") == "X"}})
        dev.close()  # the program's to close; the runtime then opens the URI anew
        z = rt.arange(3, device={uri!r})
        print(json.dumps({{"same": same, "values": values, "names": names,
                          "reopened": z.device is not dev and not z.device.closed,
                          "z": z.numpy().tolist()}}))
    """)
    assert got["same"] == [True, True, True, True]
    assert got["values"] == [[0, 3, 6, 9, 12, 15], [2, 2, 2, 2]]
    assert "rt.eval" in got["names"] and "wait_idle" in got["names"]
    assert got["reopened"] and got["z"] == [0, 1, 2]


@pytest.mark.parametrize("uri", CPU)
def test_the_runtime_closes_no_device_it_did_not_open(uri):
    got = _run(f"""
        import json, hal, runtime as rt
        dev = hal.create_device({uri!r})
        with rt.set_default_device(dev):
            a = rt.arange(3) + 1
        with rt.set_default_device({uri!r}) as d:
            b = rt.arange(3) * 2
        rt.set_default_device("local-sync" if {uri!r} == "local-task" else "local-task")
        import gc; del a, b; gc.collect()
        print(json.dumps({{"closed": dev.closed, "shared": d is dev,
                          "works": (rt.arange(2, device=dev) + 1).numpy().tolist()}}))
    """)
    assert got == {"closed": False, "shared": True, "works": [1, 2]}


@pytest.mark.parametrize("uri", CPU)
def test_arrays_of_a_closed_device_raise_typed_errors_and_still_print(uri):
    device = hal.create_device(uri)
    x = rt.array(np.ones((2, 2), np.float32), device=device)
    evaluated, lazy, compiled = x + 1, x * 3, rt.compile(lambda a: a * 2)
    rt.eval(evaluated)
    compiled(x).numpy()
    device.close()
    for read in (evaluated.numpy, lazy.numpy, lambda: (x + 2).numpy(), lambda: compiled(x).numpy(),
                 lambda: rt.asarray([1.0], device=device), lambda: rt.grad(lambda a: a.sum())(x).numpy(),
                 lambda: x[0, 0].item(), lambda: rt.asarray(x, device=hal.open_device(uri)).numpy()):
        with pytest.raises(hal.FailedPreconditionError):
            read()
    text = repr(x)
    assert "unavailable: FailedPreconditionError" in text and "shape=(2, 2)" in text and "float32" in text


def test_contexts_of_closed_devices_are_dropped():
    """The runtime kept the context of every device it was given, closed or not (its caches and
    recordings with it): a program making and closing devices in turn grew by one each time."""
    from runtime.device import contexts

    for k in range(30):
        device = hal.create_device("local-task")
        assert float((rt.ones(8, device=device) * k).sum()) == 8 * k
        device.close()
    assert sum(ctx.device.closed for ctx in contexts()) <= 1  # (the last, until another device is used)
