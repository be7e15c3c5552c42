"""The fault suite's tally: what bench/faults.py reads back, with every outcome present."""

import json
import threading

import pytest

from e2e.fault_report import OUTCOMES, REPORTS_ENV, Tally, publish


def test_a_tally_counts_from_many_threads_and_publishes_every_outcome(tmp_path, monkeypatch):
    tally = Tally("api server restarted", "40 pods")
    threads = [threading.Thread(target=lambda: [tally.count("answered") for _ in range(500)])]
    threads += [threading.Thread(target=lambda: tally.count("refused"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tally.recovery_s = 2.5
    monkeypatch.setenv(REPORTS_ENV, str(tmp_path))
    publish(tally)
    report = json.loads((tmp_path / "api-server-restarted.json").read_text())
    assert report["outcomes"] == {o: {"answered": 500, "refused": 1}.get(o, 0) for o in OUTCOMES}
    assert (report["sent"], report["recovery_s"], report["load"]) == (501, 2.5, "40 pods")


def test_an_outcome_outside_the_four_is_refused():
    with pytest.raises(ValueError, match="unknown outcome 'timeout'"):
        Tally("x", "y").count("timeout")


def test_without_a_reports_folder_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(REPORTS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    publish(Tally("x", "y"))
    assert list(tmp_path.iterdir()) == []
