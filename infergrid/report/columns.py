"""The report's columns, once, for every renderer: the text table's headings, the JSON keys
and the HTML classes all come from here, and so does how each number is rounded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from infergrid.report.rows import Row

Value = str | int | float | None


@dataclass(frozen=True, slots=True)
class Column:
    """One column: the row's attribute it shows, which is also its JSON key (and, with
    dashes, its HTML class); its heading in the text table and its label on the page; and
    its decimals (None for text)."""

    key: str
    heading: str
    label: str
    digits: int | None = None

    def value(self, row: Row) -> Value:
        return getattr(row, self.key)

    @property
    def css_class(self) -> str:
        return self.key.replace("_", "-")

    def rounded(self, row: Row) -> Value:
        """The value as JSON carries it: rounded to what is shown, plus three digits."""
        value = self.value(row)
        if self.digits is None or value is None:
            return value
        return round(value, self.digits + 3)

    def shown(self, row: Row) -> str:
        """The value as the table and the page show it; "-" where there is none."""
        value = self.value(row)
        if value is None:
            return "-"
        return str(value) if self.digits is None else f"{value:.{self.digits}f}"


COLUMNS: Final = (
    Column("namespace", "NAMESPACE", "Namespace"),
    Column("service", "SERVICE", "Service"),
    Column("model", "GPU_MODEL", "GPU model"),
    Column("pods", "PODS", "Pods", 0),
    Column("held_gpu_hours", "HELD_GPU_H", "GPU-hours held", 3),
    Column("whole_gpu_hours", "WHOLE_GPU_H", "GPU-hours with whole GPUs", 3),
    Column("used_gpu_hours", "USED_GPU_H", "GPU-hours used", 3),
    Column("utilization_pct", "UTIL%", "Utilisation %", 1),
    Column("tokens", "TOKENS", "Tokens", 0),
    Column("tokens_per_gpu_hour", "TOKENS/GPU_H", "Tokens per GPU-hour", 0),
    Column("price_per_gpu_hour", "$/GPU_H", "$ per GPU-hour", 2),
    Column("cost_held", "COST_HELD$", "Cost held $", 2),
    Column("cost_whole", "COST_WHOLE$", "Cost with whole GPUs $", 2),
)
# What sharing saved against whole GPUs, shown for the total.
SAVINGS: Final = (
    Column("saved_gpu_hours", "SAVED_GPU_H", "GPU-hours saved", 3),
    Column("saved_pct", "SAVED%", "Saved %", 1),
    Column("saved_cost", "SAVED$", "Saved $", 2),
)
