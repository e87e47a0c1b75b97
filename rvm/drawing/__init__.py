"""Pictures of programs: a function as a reversible circuit (one wire per register or
variable, one gate per instruction) and as a control-flow graph whose branch/comefrom
pairs are drawn as single paired edges. Written as SVG by hand: no dependency, and the
same program always gives the same bytes."""

from .pictures import Picture, draw

__all__ = ["Picture", "draw"]
