"""What a GPU-hour costs, per GPU model: a YAML or JSON mapping of model name to price, with a
``default`` entry for every model it does not name. ``prices.yaml`` beside this file is the
table used when none is given; it is a scale, not a quote."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from infergrid.codec import expect, join
from infergrid.errors import ContractError
from infergrid.yamlfile import read_yaml

DEFAULT_KEY: Final = "default"
BUILT_IN: Final = Path(__file__).with_name("prices.yaml")
BUILT_IN_SOURCE: Final = "built in (infergrid/report/prices.yaml)"


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Prices per GPU-hour by model name, the price of any other model, and where they came
    from (shown beside the report's cost)."""

    per_model: Mapping[str, float]
    default: float
    source: str

    def price(self, model: str) -> float:
        return self.per_model.get(model, self.default)

    def names(self, model: str) -> bool:
        """Whether the table prices ``model`` itself, rather than at its default."""
        return model in self.per_model


def parse_prices(doc: object, path: str, source: str) -> PriceTable:
    """A price table document; ``default`` is required so that every model has a price."""
    table = expect(doc, dict, path)
    prices = {str(model): _price(value, join(path, str(model))) for model, value in table.items()}
    if DEFAULT_KEY not in prices:
        raise ContractError(
            join(path, DEFAULT_KEY), "is required: the price of the models the table does not name"
        )
    default = prices.pop(DEFAULT_KEY)
    return PriceTable(per_model=prices, default=default, source=source)


def _price(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ContractError(path, f"expected a price per GPU-hour (a number), got {value!r}")
    if value < 0:
        raise ContractError(path, f"must be at least 0, got {value}")
    return float(value)


def load_prices(path: str | Path | None = None) -> PriceTable:
    """The table in the file ``path``, or the built-in one."""
    if path is None:
        return parse_prices(read_yaml(BUILT_IN), "prices", BUILT_IN_SOURCE)
    return parse_prices(read_yaml(path), str(path), str(path))
