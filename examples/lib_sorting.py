"""Sorting with the standard library's sorting network: sort and argsort out of place,
and the gradient of a trimmed sum (the sum of all but the k largest values), which flows
to the values that were kept.

    python examples/lib_sorting.py
"""

import numpy as np

import rvm
from rvm import Array, ancilla, compute, zeros
from rvm.lib import argsort, sort


@rvm.reversible
def trimmed_sum(out: float, x: Array[float], k: int):
    """out += the sum of x without its k largest values."""
    with ancilla(s=zeros(len(x))):
        with compute() as c:
            sort(s, x)
        for i in range(len(x) - k):
            out += s[i]
        ~c


def main():
    x = np.array([0.3, 2.5, -1.0, 7.0, 0.3, 4.2])
    print(f"sort {sort(np.zeros(6), x)[0]}")
    print(f"argsort {argsort(np.zeros(6, np.int64), x)[0]} "
          f"(numpy {np.argsort(x, kind='stable')})")
    values, grads = rvm.value_and_grad(trimmed_sum, loss="out")(0.0, x, 2)
    print(f"sum without the 2 largest: {values[0]}, gradient {grads[1]}")


if __name__ == "__main__":
    main()
