"""What every report figure shares: the axes' labels, limits, grid and legend (`finish_axes`), and the PNG written
whole or not at all, never through a symlink in the output folder (`save_figure`). Used by `run_report` (one run)
and `compare` (runs against each other); the figures themselves are theirs."""

from __future__ import annotations

from pathlib import Path

from tracerl.io.files.run_folder import replacing, run_path


def finish_axes(ax, xlabel: str, ylabel: str, title: str, ylim=None, legend: bool = True) -> None:
    """Label `ax`, set its y range when `ylim` is given, grid it faintly, and add the legend unless told not to."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8)


def save_figure(plt, fig, path: Path, dpi: int = 110) -> Path:
    """Lay out `fig`, write it to `path` as a PNG (atomically; a symlink at `path` is refused) and close it."""
    fig.tight_layout()
    with replacing(run_path(path.parent, path.name), fsync=False) as f:
        fig.savefig(f, dpi=dpi, format="png")
    plt.close(fig)
    return path
