"""run_cases hands each case's records to `append` as the case ends: a GPU call cut short by its time
limit keeps the cases it finished."""

from benchmarks.records import RunContext, run_cases


def test_each_case_s_records_are_appended_as_it_ends_and_a_failing_case_loses_only_its_own():
    events: list = []
    context = RunContext(suite="demo", model="m", gpu=None, backend="torch")

    def measure(case: str, device: str, gpu: str | None, smoke: bool):
        events.append(("measure", case))
        if case == "bad":
            raise RuntimeError("out of memory")
        return [context.record(case, "speed", 1.0, "x/s")], None

    outcome = run_cases(["a", "bad", "b"], str, measure, smoke=True, append=lambda rows: events.append(rows))
    appended = [[record.case for record in event] for event in events if isinstance(event, list)]
    assert appended == [["a"], ["b"]]
    # case a's records were written before the failing case was measured
    assert [event if isinstance(event, tuple) else "append" for event in events] == [
        ("measure", "a"), "append", ("measure", "bad"), ("measure", "b"), "append",
    ]  # fmt: skip
    assert outcome.appended and [record.case for record in outcome.records] == ["a", "b"]
    assert outcome.failures == ["bad: RuntimeError: out of memory"]
