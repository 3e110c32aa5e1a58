"""posy's benchmark suites: `python -m benchmarks SUITE` records, `python -m benchmarks render` renders."""
