"""gearbox's display hooks: the pictures a program shows come back to the caller as images.

    from gearbox_display import display
    display(obj)

`obj` may be a PIL image, a matplotlib figure, PNG/JPEG/GIF/SVG bytes, or anything with
`_repr_png_` / `_repr_svg_`; a pandas DataFrame prints as a compact text table; anything else
prints its repr. matplotlib needs nothing: the sandbox sets `MPLBACKEND=module://gearbox_mpl_backend`
(`gearbox_mpl_backend.py`: Agg rendering), so `plt.show()` displays every open figure, and
figures still open when the program ends are displayed then.

A picture is at most 1024 px on its long side and 256 KiB inline: a larger one is downscaled
here (with matplotlib or PIL), and its full size is written to /work/outputs/ (offered as a
resource: with the session's files, or with the run's outputs). Each picture leaves on stdout as one line,
"\\x1egearbox-display " and a JSON object, which the server takes out of the output.
"""
import base64
import io
import json
import os
import struct
import sys

MAX_SIDE = 1024
MAX_BYTES = 256 * 1024
MAX_PICTURES = 16
_MARK = "\x1egearbox-display "
_count = [0]


def _emit(mime, data, width, height, original=None, full=None, note=None):
    _count[0] += 1
    if _count[0] > MAX_PICTURES:
        if _count[0] == MAX_PICTURES + 1:
            print("[gearbox: more than %d pictures; the rest are not shown]" % MAX_PICTURES)
        return
    frame = {"mime": mime, "data": base64.b64encode(data).decode("ascii"),
             "width": width, "height": height}
    if original:
        frame["original"] = list(original)
    if full:
        frame["full"] = full
    if note:
        frame["note"] = note
    out = sys.__stdout__ if sys.stdout is None else sys.stdout
    try:
        out.flush()
    except Exception:
        pass
    out.write(_MARK + json.dumps(frame) + "\n")
    try:
        out.flush()
    except Exception:
        pass


def _png_size(data):
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    return None


def _gif_size(data):
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    return None


def _jpeg_size(data):
    if data[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        length = struct.unpack(">H", data[i + 2:i + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return w, h
        i += 2 + length
    return None


def _keep_full(data, ext):
    """Write the full-size picture under /work/outputs/; its path relative to /work."""
    try:
        os.makedirs("/work/outputs", exist_ok=True)
        n = 1
        while os.path.exists("/work/outputs/display-%d.%s" % (n, ext)):
            n += 1
        path = "outputs/display-%d.%s" % (n, ext)
        with open("/work/" + path, "wb") as f:
            f.write(data)
        return path
    except OSError:
        return None


def _show_pil(img):
    from PIL import Image

    w, h = img.size
    small = img
    if max(w, h) > MAX_SIDE:
        small = img.copy()
        small.thumbnail((MAX_SIDE, MAX_SIDE))
    if small.mode not in ("RGB", "RGBA", "L", "LA", "P"):
        small = small.convert("RGBA")
    data = _png_of(small)
    while len(data) > MAX_BYTES and max(small.size) > 64:
        small = small.resize((max(1, small.size[0] // 2), max(1, small.size[1] // 2)),
                             Image.LANCZOS)
        data = _png_of(small)
    full = None
    if small is not img:
        full_img = img if img.mode in ("RGB", "RGBA", "L", "LA", "P") else img.convert("RGBA")
        full = _keep_full(_png_of(full_img), "png")
    _emit("image/png", data, small.size[0], small.size[1],
          original=(w, h) if small.size != (w, h) else None, full=full)


def _png_of(img):
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def _show_figure(fig):
    w_in, h_in = fig.get_size_inches()
    dpi = float(fig.dpi)
    full_w, full_h = int(round(w_in * dpi)), int(round(h_in * dpi))
    scale = min(1.0, MAX_SIDE / max(full_w, full_h, 1))
    data = None
    for _ in range(6):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi * scale)
        data = buf.getvalue()
        if len(data) <= MAX_BYTES:
            break
        scale *= 0.7
    size = _png_size(data) or (int(full_w * scale), int(full_h * scale))
    full = None
    if size != (full_w, full_h):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        full = _keep_full(buf.getvalue(), "png")
    _emit("image/png", data, size[0], size[1],
          original=(full_w, full_h) if size != (full_w, full_h) else None, full=full)


def _show_bytes(data):
    data = bytes(data)
    text_start = data[:256].lstrip().lower()
    if text_start.startswith(b"<svg") or (text_start.startswith(b"<?xml") and b"<svg" in data[:1024]):
        if len(data) <= MAX_BYTES:
            _emit("image/svg+xml", data, 0, 0)
        else:
            full = _keep_full(data, "svg")
            print("[gearbox: an SVG of %d bytes is too large to show inline%s]"
                  % (len(data), "; kept as " + full if full else ""))
        return
    for mime, sizer, ext in (("image/png", _png_size, "png"), ("image/gif", _gif_size, "gif"),
                             ("image/jpeg", _jpeg_size, "jpg")):
        size = sizer(data)
        if size is None:
            continue
        if max(size) <= MAX_SIDE and len(data) <= MAX_BYTES:
            _emit(mime, data, size[0], size[1])
            return
        try:
            from PIL import Image
        except ImportError:
            full = _keep_full(data, ext)
            print("[gearbox: a %dx%d picture is too large to show inline and PIL is not there to "
                  "downscale it%s]" % (size[0], size[1], "; kept as " + full if full else ""))
            return
        _show_pil(Image.open(io.BytesIO(data)))
        return
    print(repr(data[:200]))


def display(*objs):
    """Show each object: pictures as images, tables as text, anything else as its repr."""
    for obj in objs:
        _display_one(obj)


def _display_one(obj):
    mod = type(obj).__module__ or ""
    if mod.startswith("PIL."):
        _show_pil(obj)
    elif mod.startswith("matplotlib.") and hasattr(obj, "savefig"):
        _show_figure(obj)
        # Shown once: a pyplot figure is closed, so the end of the run does not show it again.
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            plt.close(obj)
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        _show_bytes(obj)
    elif mod.startswith("pandas.") and hasattr(obj, "to_string"):
        print(obj.to_string(max_rows=30, max_cols=20))
    elif hasattr(obj, "_repr_png_"):
        data = obj._repr_png_()
        _show_bytes(data if isinstance(data, bytes) else base64.b64decode(data))
    elif hasattr(obj, "_repr_svg_"):
        svg = obj._repr_svg_()
        _show_bytes(svg.encode() if isinstance(svg, str) else svg)
    else:
        print(repr(obj))


def displayable(obj):
    """Whether `display` shows `obj` as a picture (a live session's cell result)."""
    mod = type(obj).__module__ or ""
    return (mod.startswith("PIL.") or (mod.startswith("matplotlib.") and hasattr(obj, "savefig"))
            or hasattr(obj, "_repr_png_") or hasattr(obj, "_repr_svg_"))


def show(*args, **kwargs):
    """plt.show(): display every open figure, then close them."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        _show_figure(plt.figure(num))
    plt.close("all")


def show_open_figures():
    """Display the figures still open (at the end of a run, or of a live session's cell)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        if plt.get_fignums():
            show()
    except Exception as e:  # a display failure must not change how the program ended
        print("[gearbox: figures left open could not be shown: %s]" % e, file=sys.stderr)


def _install():
    import atexit

    atexit.register(show_open_figures)


_install()
