"""Start-up progress: items pass through in order; a terminal gets a bar, a log gets a line at the end
(and one every LOG_EVERY_S on the way), never one per item."""

import io
import logging

from engine import progress as progress_module
from engine.progress import progress

LOGGER = logging.getLogger("tests.progress")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_that_reaches_the_total():
    stream = Terminal()
    assert list(progress(["a", "b", "c"], "reading weight shards", LOGGER, stream)) == ["a", "b", "c"]
    drawn = stream.getvalue()
    assert "reading weight shards" in drawn and "3/3" in drawn


def test_a_log_gets_one_line_at_the_end_not_one_per_item(caplog):
    caplog.set_level("INFO", logger=LOGGER.name)
    assert list(progress(range(100), "copying weights", LOGGER, io.StringIO())) == list(range(100))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("copying weights: 100 of 100 in ")


def test_a_slow_step_logs_how_far_it_has_come_on_the_way(caplog, monkeypatch):
    caplog.set_level("INFO", logger=LOGGER.name)
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)  # every item counts as slow
    list(progress(["x", "y", "z"], "capturing CUDA graphs", LOGGER, io.StringIO()))
    lines = [record.getMessage() for record in caplog.records]
    assert lines[:2] == ["capturing CUDA graphs: 1 of 3", "capturing CUDA graphs: 2 of 3"]
    assert lines[2].startswith("capturing CUDA graphs: 3 of 3 in ")
