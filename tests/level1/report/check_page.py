"""Checks hp-report's page as headless Chromium saw it.

check_page.py METRICS_JSONL DOM_HTML SCREENSHOT_PNG CHROMIUM_STDERR [KEY_REGEX,...]
  - the dumped DOM's plotted points (<circle data-key data-step data-value>)
    are exactly the non-null values of metrics.jsonl for the keys they plot,
    and a curve matches each KEY_REGEX;
  - the screenshot is not blank: enough non-white pixels, and the first
    series' colour is drawn;
  - the browser console logged nothing (the page has no script; a message
    would be a failed load or a parse problem).
Standard library only.
"""
import json
import re
import struct
import sys
import zlib
from html.parser import HTMLParser


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


class Circles(HTMLParser):
    def __init__(self):
        super().__init__()
        self.points = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "circle" and "data-key" in a:
            self.points.append((a["data-key"], int(a["data-step"]), float(a["data-value"])))


def decode_png(path):
    """(width, height, channels, rows of bytes) of an 8-bit RGB or RGBA PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(path + " is not a PNG")
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace:
                fail("unexpected PNG format depth=%d colour=%d interlace=%d" % (depth, colour, interlace))
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    channels = 3 if colour == 2 else 4
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif f == 3:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b, c = prev[i], (prev[i - channels] if i >= channels else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, channels, rows


metrics_path, dom_path, png_path, stderr_path = sys.argv[1:5]
rows = [json.loads(l) for l in open(metrics_path) if l.strip()]
by_step = {r["step"]: r for r in rows}
parser = Circles()
parser.feed(open(dom_path, encoding="utf-8").read())
points = parser.points
if not points:
    fail("no plotted points in the DOM")
for key, step, value in points:
    if step not in by_step or by_step[step].get(key) != value:
        fail("plotted %s at step %d = %r, metrics.jsonl has %r" % (key, step, value, by_step.get(step, {}).get(key)))
plotted = {(k, s) for k, s, _ in points}
if len(plotted) != len(points):
    fail("a point is plotted twice")
keys = {k for k, _, _ in points}
for key in keys:
    for r in rows:
        if r.get(key) is not None and (key, r["step"]) not in plotted:
            fail("metrics.jsonl has %s at step %d but the page does not plot it" % (key, r["step"]))
required = sys.argv[5].split(",") if len(sys.argv) > 5 else []
for pattern in required:
    if not any(re.fullmatch(pattern, k) for k in keys):
        fail("no curve for " + pattern + " (plotted: " + ", ".join(sorted(keys)) + ")")
print("DOM: %d points of %d keys equal metrics.jsonl (%d rows)" % (len(points), len(keys), len(rows)))

width, height, channels, image = decode_png(png_path)
ink = blue = 0
for line in image:
    for i in range(0, len(line), channels):
        r, g, b = line[i], line[i + 1], line[i + 2]
        if r < 235 or g < 235 or b < 235:
            ink += 1
        if r < 40 and 90 <= g <= 140 and 150 <= b <= 205:  # #0072b2, the first series
            blue += 1
share = ink / float(width * height)
print("screenshot %dx%d: %.1f%% non-white pixels, %d in the first series' colour" % (width, height, 100 * share, blue))
if share < 0.01 or blue < 50:
    fail("the screenshot looks blank")

console = [l.rstrip() for l in open(stderr_path, errors="replace") if ":CONSOLE" in l]
if console:
    fail("the browser console logged:\n" + "\n".join(console))
print("console: no messages")
