"""Fibonacci, recursively and reversibly (after the NiLang paper, Liu & Zhao).

rrfib(out, n) adds F(n + 1) to out (F(1) = F(2) = 1). A counter steps down from n by 2,
making one recursive call per step; the while loop's post-condition (counter != n) is false
on entry and true after every pass, which is what lets it run backwards.
"""

import rvm
from rvm import ancilla


@rvm.reversible
def rrfib(out: int, n: int):
    if n >= 1:
        with ancilla(counter=0):
            counter += n
            while (counter > 1, counter != n):
                rrfib(out, counter - 1)
                counter -= 2
            counter -= n % 2
    out += 1
