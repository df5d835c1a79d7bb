"""matplotlib's backend in a gearbox sandbox (`MPLBACKEND=module://gearbox_mpl_backend`):
figures render with Agg, and `plt.show()` hands every open figure to gearbox_display, which
sends it back to the caller as an image. Figures still open when the program ends are shown
then too (gearbox_display registers that at import).
"""
from matplotlib.backend_bases import FigureManagerBase as FigureManager  # noqa: F401
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401

import gearbox_display


def show(*args, **kwargs):
    gearbox_display.show()
