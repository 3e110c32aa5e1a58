"""A bulk job's progress line: its total, rows/s, tokens/s and ETA (on a clock the test moves), the reason
in place of a total until there is one, and a terminal's bar."""

import io
import logging

import pytest

from api.bulk.progress import JobProgress

logger = logging.getLogger(__name__)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def started(no_total="counting the input", stream=None) -> tuple[JobProgress, Clock]:
    clock = Clock()
    progress = JobProgress(no_total, logger, stream=stream or io.StringIO(), clock=clock)
    clock.now += 30.0  # the model's load: not in the rates
    progress.start()
    return progress, clock


def test_a_counted_input_shows_its_total_rows_per_s_and_eta():
    progress, clock = started()
    progress.counted(1_000)
    progress.skipped(200)  # a run before's: done, not in the rates
    clock.now += 3.0
    progress.embedded(300, 3_000)
    assert progress.eta_s() == pytest.approx(5.0)  # 500 rows left at 100 rows/s
    assert progress.line() == "embedded 500 of 1,000 rows, 100 rows/s, 1,000 tokens/s, about 5 s left"
    clock.now += 5.0
    progress.embedded(500, 5_000)
    assert progress.line() == "embedded 1,000 of 1,000 rows, 100 rows/s, 1,000 tokens/s"  # nothing left


def test_until_there_is_a_total_the_line_says_why_in_its_place():
    progress, clock = started("a stream: no total, no ETA")
    clock.now += 2.0
    progress.embedded(300, 1_000)
    assert progress.eta_s() is None
    assert progress.line() == "embedded 300 rows (a stream: no total, no ETA), 150 rows/s, 500 tokens/s"
    progress.counted(None)  # a count that did not finish leaves it so
    assert progress.total_rows is None


@pytest.mark.parametrize("seconds, shown", [(42, "42 s"), (30 * 60, "30 min"), (9_000, "2.5 h")])
def test_an_eta_reads_in_units_that_fit_it(seconds, shown):
    progress, clock = started()
    progress.counted(2)
    clock.now += seconds
    progress.embedded(1, 1)
    assert progress.line().endswith(f"about {shown} left")


def test_a_terminal_gets_a_bar_that_takes_the_total_when_it_comes():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    progress, _ = started("a stream: no total, no ETA", terminal)
    progress.embedded(300, 1_000)
    progress.counted(1_000)
    progress.close()
    assert "300/1000" in terminal.getvalue() and "rows/s" in terminal.getvalue()
    assert "a stream: no total" in terminal.getvalue()  # before the total came


def test_log_lines_come_every_log_every_s(caplog):
    progress, clock = started()
    with caplog.at_level(logging.INFO, logger=__name__):
        progress.embedded(10, 10)
        clock.now += 10.0
        progress.embedded(10, 10)
    assert [record.getMessage() for record in caplog.records] == [
        "embedded 20 rows (counting the input), 2 rows/s, 2 tokens/s"
    ]
