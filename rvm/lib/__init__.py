"""rvm's standard library, written in the reversible Python subset (docs/lib.md).

    from rvm.lib import bennett, leapfrog, logsumexp, norm, sort, csr_matvec

Each is an @rvm.reversible function: call it from Python or from reversible code, uncall
it with `~f`, differentiate it with rvm.grad. Functions that take a function (`bennett`'s
step, `leapfrog`'s force) take a reversible function as an argument.
"""

from .bennett import bennett, pebble_counts
from .integrators import leapfrog
from .reductions import logsumexp, norm
from .sorting import argsort, sort
from .sparse import csr_dot, csr_matmat, csr_matvec, csr_rmatvec

__all__ = ["argsort", "bennett", "csr_dot", "csr_matmat", "csr_matvec", "csr_rmatvec",
           "leapfrog", "logsumexp", "norm", "pebble_counts", "sort"]
