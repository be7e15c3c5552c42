"""The report's arithmetic, pure: GPU-hours held, the whole-GPU counterfactual, GPU-hours used,
tokens and cost per namespace, service and GPU model.

Each step's sample stands for the step that follows it, cut at the window's end, so a pod that
holds a GPU for the whole of a 1 h window holds 1 GPU-hour. At each step, for each pod:

* held: the fractions of GPUs it holds, added up (1 per whole GPU, 1/replicas per time slice,
  the memory share of a share or a MIG instance);
* whole: the number of distinct GPUs it holds, each counted whole, which is what it would
  have needed under binpack of whole GPUs (a share, a time slice or a MIG instance takes a
  GPU of its own; N whole GPUs stay N);
* used: its fraction of each GPU times that GPU's utilisation, so a shared GPU's utilisation
  is split among its holders by held ratio; measured: the fractions of GPUs whose
  utilisation was read at that step (utilisation is used over measured).

A pod's tokens are split among the GPU models it held by GPU-hours held; an engine pod that
held no GPU gets a row with model "-", and a pod that held a GPU with no engine series gets
service "-". Cost is GPU-hours times the model's price per GPU-hour.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from infergrid.report.prices import PriceTable
from infergrid.report.readings import Gpu, Pod, engine_pods, holdings, ms, utilization
from infergrid.report.rows import NO_GPU, NO_SERVICE, Point, Report, Row
from infergrid.report.series import Recording

SECONDS_PER_HOUR = 3600.0
TOTAL = "all"


@dataclass(frozen=True, slots=True)
class Gpus:
    """Held, whole-GPU, used and measured amounts: GPUs at a step, GPU-hours over the window."""

    held: float = 0.0
    whole: float = 0.0
    used: float = 0.0
    measured: float = 0.0

    def __add__(self, other: Gpus) -> Gpus:
        return Gpus(
            self.held + other.held,
            self.whole + other.whole,
            self.used + other.used,
            self.measured + other.measured,
        )

    def scaled(self, factor: float) -> Gpus:
        return Gpus(
            self.held * factor, self.whole * factor, self.used * factor, self.measured * factor
        )


@dataclass(frozen=True, slots=True)
class _Share:
    """One pod's GPU-hours on one GPU model, and the tokens it generated there."""

    pod: Pod
    service: str
    model: str
    hours: Gpus
    tokens: float


def compute_report(recording: Recording, prices: PriceTable) -> Report:
    """The report of ``recording`` priced by ``prices`` (see the module for each number)."""
    hours, timeline = _integrate(recording)
    shares = _shares(hours, *engine_pods(recording))
    groups: dict[tuple[str, str, str], list[_Share]] = defaultdict(list)
    for share in shares:
        groups[(share.pod[0], share.service, share.model)].append(share)
    return Report(
        start=recording.start,
        end=recording.end,
        step=recording.step,
        rows=tuple(_row(key, groups[key], prices) for key in sorted(groups)),
        total=_row((TOTAL, TOTAL, TOTAL), shares, prices),
        timeline=timeline,
        prices=prices,
    )


def _integrate(recording: Recording) -> tuple[dict[tuple[Pod, str], Gpus], tuple[Point, ...]]:
    """Each pod's GPU-hours per GPU model over the window, and the fleet's GPUs at each step."""
    held = holdings(recording)
    busy = utilization(recording)
    hours: dict[tuple[Pod, str], Gpus] = defaultdict(Gpus)
    timeline = []
    for time in _times(recording, held):
        now_busy = {gpu: percent[time] for gpu, percent in busy.items() if time in percent}
        per_pod = _pods_at(held.get(time, {}), now_busy)
        fleet = _total(per_pod.values())
        timeline.append(Point(time / 1000, fleet.held, fleet.whole, fleet.used, fleet.measured))
        length_h = min(recording.step, recording.end - time / 1000) / SECONDS_PER_HOUR
        for key, gpus in per_pod.items():
            hours[key] += gpus.scaled(length_h)
    return hours, tuple(timeline)


def _times(recording: Recording, held: Mapping[int, object]) -> list[int]:
    """Every step of the window (ms) and every time a GPU was held, before the window's end."""
    start, end, step = ms(recording.start), ms(recording.end), ms(recording.step)
    return sorted({*range(start, end, step), *(t for t in held if t < end)})


def _pods_at(
    held: Mapping[Pod, Mapping[Gpu, float]], busy: Mapping[str, float]
) -> dict[tuple[Pod, str], Gpus]:
    """Each pod's GPUs per model at one step, given each GPU's utilisation (percent) then."""
    out: dict[tuple[Pod, str], Gpus] = defaultdict(Gpus)
    for pod, gpus in held.items():
        for (model, uuid), ratio in gpus.items():
            percent = busy.get(uuid)
            measured = 0.0 if percent is None else ratio
            used = measured * (percent or 0.0) / 100
            out[(pod, model)] += Gpus(held=ratio, whole=1.0, used=used, measured=measured)
    return out


def _total(amounts: Iterable[Gpus]) -> Gpus:
    total = Gpus()
    for amount in amounts:
        total += amount
    return total


def _shares(
    hours: Mapping[tuple[Pod, str], Gpus], services: Mapping[Pod, str], tokens: Mapping[Pod, float]
) -> list[_Share]:
    """Each pod's hours per model with its tokens split by GPU-hours held (evenly where it held
    none); an engine pod that held no GPU gets one share of model "-"."""
    by_pod: dict[Pod, dict[str, Gpus]] = defaultdict(dict)
    for (pod, model), amount in hours.items():
        by_pod[pod][model] = amount
    shares = []
    for pod in sorted({*by_pod, *tokens}):
        models = by_pod.get(pod) or {NO_GPU: Gpus()}
        held = sum(amount.held for amount in models.values())
        service = services.get(pod) or NO_SERVICE
        for model, amount in models.items():
            weight = amount.held / held if held > 0 else 1 / len(models)
            shares.append(_Share(pod, service, model, amount, tokens.get(pod, 0.0) * weight))
    return shares


def _row(key: tuple[str, str, str], shares: list[_Share], prices: PriceTable) -> Row:
    """The row of a group of shares; its price is the model's, or None when it mixes models."""
    namespace, service, model = key
    hours = _total(s.hours for s in shares)
    return Row(
        namespace=namespace,
        service=service,
        model=model,
        pods=len({s.pod for s in shares}),
        held_gpu_hours=hours.held,
        whole_gpu_hours=hours.whole,
        measured_gpu_hours=hours.measured,
        used_gpu_hours=hours.used,
        tokens=sum(s.tokens for s in shares),
        price_per_gpu_hour=None if model in (TOTAL, NO_GPU) else prices.price(model),
        cost_held=sum(s.hours.held * prices.price(s.model) for s in shares),
        cost_whole=sum(s.hours.whole * prices.price(s.model) for s in shares),
    )
