"""What every figure shares: the phases' colours, and a legend only where something was drawn."""

PHASE_COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}


def legend(ax, **kwargs) -> None:
    """A legend only where something labelled was drawn: a figure of no data asks for none
    (matplotlib warns "No artists with labels found to put in legend")."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)
