"""A minimal SVG writer with deterministic output (fixed number formatting, attribute
order as given)."""

from __future__ import annotations

from xml.sax.saxutils import escape

FONT = "font-family=\"DejaVu Sans Mono, monospace\""


def num(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


class Canvas:
    def __init__(self):
        self.items: list[str] = []
        self.width = self.height = 0.0

    def grow(self, x: float, y: float) -> None:
        self.width, self.height = max(self.width, x), max(self.height, y)

    def line(self, x1, y1, x2, y2, stroke="#444", width=1.0, cls="", dash="") -> None:
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.items.append(f'<line class="{cls}" x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" '
                          f'y2="{num(y2)}" stroke="{stroke}" stroke-width="{num(width)}"'
                          f'{extra}/>')
        self.grow(max(x1, x2), max(y1, y2))

    def rect(self, x, y, w, h, fill="#fff", stroke="#444", cls="", rx=3.0) -> None:
        self.items.append(f'<rect class="{cls}" x="{num(x)}" y="{num(y)}" width="{num(w)}" '
                          f'height="{num(h)}" rx="{num(rx)}" fill="{fill}" '
                          f'stroke="{stroke}"/>')
        self.grow(x + w, y + h)

    def circle(self, x, y, r, fill="#222", cls="") -> None:
        self.items.append(f'<circle class="{cls}" cx="{num(x)}" cy="{num(y)}" r="{num(r)}" '
                          f'fill="{fill}"/>')
        self.grow(x + r, y + r)

    def text(self, x, y, s: str, size=11.0, anchor="middle", fill="#111", cls="") -> None:
        self.items.append(f'<text class="{cls}" x="{num(x)}" y="{num(y)}" {FONT} '
                          f'font-size="{num(size)}" text-anchor="{anchor}" '
                          f'fill="{fill}">{escape(s)}</text>')
        self.grow(x + (len(s) * size * 0.62 if anchor == "start" else 0), y)

    def path(self, d: str, stroke="#444", cls="", width=1.2, fill="none") -> None:
        self.items.append(f'<path class="{cls}" d="{d}" stroke="{stroke}" '
                          f'stroke-width="{num(width)}" fill="{fill}"/>')

    def render(self, margin: float = 10.0) -> str:
        w, h = num(self.width + margin), num(self.height + margin)
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
                f'viewBox="0 0 {w} {h}">\n<rect width="100%" height="100%" fill="#fff"/>\n'
                + "\n".join(self.items) + "\n</svg>\n")
