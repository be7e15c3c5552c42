"""The thin edge to Prometheus: one ``query_range`` per series the report reads, over HTTP with
the standard library, and the answers kept as a recording.

Redirects are not followed (nothing in InferGrid that talks to a server follows them): a
3xx is an error naming the URL, so a report never reads from somewhere the user did not
name. An answer larger than ``MAX_ANSWER_BYTES`` is refused rather than held in memory.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Final

from infergrid.codec import expect
from infergrid.errors import ContractError
from infergrid.report.series import METRICS, Recording, check_window, parse_series

MAX_ANSWER_BYTES: Final = 256 * 1024 * 1024
MAX_POINTS: Final = 11_000  # Prometheus refuses a query_range of more points per series
TIMEOUT_S: Final = 30.0


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Turns every redirect into the 3xx it is (an HTTPError), instead of following it."""

    def redirect_request(self, *_: Any, **__: Any) -> None:
        return None


_OPENER: Final = urllib.request.build_opener(_NoRedirects)


def read_prometheus(
    url: str, start: float, end: float, step: float, timeout_s: float = TIMEOUT_S
) -> Recording:
    """The series a report reads, from the Prometheus at ``url`` over [start, end] every
    ``step`` seconds (Unix times)."""
    start, end = round(start, 3), round(end, 3)  # Prometheus' resolution: answers match them
    check_window(start, end, step)
    if (end - start) / step + 1 > MAX_POINTS:
        points = int((end - start) / step) + 1
        reason = f"gives {points} points per series; Prometheus answers at most {MAX_POINTS}"
        raise ContractError("step", f"{reason}: use a longer step or a shorter window")
    series = []
    for metric in METRICS:
        for i, item in enumerate(query_range(url, metric, start, end, step, timeout_s)):
            where = f"{url} {metric} result[{i}]"
            item = expect(item, dict, where)
            if isinstance(item.get("metric"), dict):  # named, whatever the query's answer kept
                item = {**item, "metric": {**item["metric"], "__name__": metric}}
            series.append(parse_series(item, where, start, end))
    return Recording(start=start, end=end, step=step, series=tuple(series), source=url)


def query_range(
    url: str, query: str, start: float, end: float, step: float, timeout_s: float = TIMEOUT_S
) -> list[dict[str, Any]]:
    """``data.result`` of Prometheus' ``/api/v1/query_range`` for ``query``."""
    params = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": step})
    endpoint = f"{url.rstrip('/')}/api/v1/query_range"
    answer = _get_json(f"{endpoint}?{params}", endpoint, timeout_s)
    if answer.get("status") != "success":
        raise ContractError("prometheus", f"{endpoint} answered {answer.get('error', answer)!r}")
    data = answer.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise ContractError("prometheus", f"{endpoint} answered no data.result list")
    return data["result"]


def _get_json(request_url: str, shown: str, timeout_s: float) -> dict[str, Any]:
    """The JSON object at ``request_url``; ``shown`` names it in errors (without the query)."""
    if urllib.parse.urlsplit(shown).scheme not in ("http", "https"):
        raise ContractError("prometheus", f"{shown!r} is not an http:// or https:// URL")
    try:
        with _OPENER.open(request_url, timeout=timeout_s) as response:
            body = response.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as error:
        raise ContractError("prometheus", _refusal(shown, error)) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", None) or error
        raise ContractError("prometheus", f"cannot reach {shown}: {reason}") from None
    if len(body) > MAX_ANSWER_BYTES:
        raise ContractError("prometheus", f"{shown} answered over {MAX_ANSWER_BYTES} bytes")
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        raise ContractError("prometheus", f"{shown} answered something not JSON") from None
    if not isinstance(answer, dict):
        raise ContractError("prometheus", f"{shown} answered JSON that is not an object")
    return answer


def _refusal(shown: str, error: urllib.error.HTTPError) -> str:
    """An HTTP error as the user should read it: a redirect says where to; Prometheus' own
    errors (400, 422, 503) carry a JSON ``error``."""
    if 300 <= error.code < 400:
        target = error.headers.get("Location", "?")
        return f"{shown} answered {error.code}, a redirect to {target}: not followed; name that URL"
    try:
        detail = json.loads(error.read(64 * 1024)).get("error", "")
    except (ValueError, AttributeError, OSError):
        detail = ""
    return f"{shown} answered {error.code} {error.reason}" + (f": {detail}" if detail else "")
