import math
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ASM = ROOT / "asm"

# x*y, then x*x, in one register with no ZERO between: in the gradient pass the shadow
# the second use leaves in f4 goes out through the first use's pair and back
REUSED = """\
.func f(f0, f1, f2)
    ADD.mul  f4, f0, f1
    ADD.sin  f3, f4
    SUB.mul  f4, f0, f1
    ADD.mul  f4, f0, f0
    ADD.mul  f2, f3, f4
    SUB.mul  f4, f0, f0
    ADD.mul  f4, f0, f1
    SUB.sin  f3, f4
    SUB.mul  f4, f0, f1
.end
"""


def close(a, b, rel=1e-12, abs_=1e-12):
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)
    return a == b


def states_close(s1, s2, rel=1e-12):
    """Machine snapshots equal: control state and ints exactly, floats within rel."""
    (f1, top1, heap1), (f2, top2, heap2) = s1, s2
    if top1 != top2 or (heap1 != heap2 and not _heaps_close(heap1, heap2, rel)):
        return False
    if len(f1) != len(f2):
        return False
    for a, b in zip(f1, f2):
        if a[:3] != b[:3]:
            return False
        for x, y in zip(a[3], b[3]):
            if type(x) is not type(y) or not close(x, y, rel, rel):
                return False
        if (a[4] is None) != (b[4] is None):
            return False
        if a[4] is not None and not all(close(x, y, rel, rel) for x, y in zip(a[4], b[4])):
            return False
    return True


def _heaps_close(h1, h2, rel):
    import struct
    n = len(h1) // 8
    d1, d2 = struct.unpack(f"<{n}d", h1), struct.unpack(f"<{n}d", h2)
    return all(x == y or (x != x and y != y and h1[8 * k:8 * k + 8] == h2[8 * k:8 * k + 8])
               or close(x, y, rel, rel) for k, (x, y) in enumerate(zip(d1, d2)))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("RVM_SLOW"):
        return
    skip = pytest.mark.skip(reason="slow; set RVM_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
