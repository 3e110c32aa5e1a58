"""The HTTP suites' throughput window (benchmarks/load.py): a server's rate, read from its clients."""

from benchmarks.load import throughput_window


def closed_loop(num_clients: int, service_s: float, warmup_s: float, duration_s: float):
    """The samples (start, end, tokens, error, stages) of clients that each keep one request in flight, back
    to back, on a server that runs requests one at a time in arrival order, `service_s` each; each client
    stops starting requests at the window's end. (The server's rate: 1 / service_s.)"""
    deadline = warmup_s + duration_s
    free_at, samples = 0.0, []
    arrivals = [(0.0, client) for client in range(num_clients)]
    while arrivals:
        arrivals.sort()
        started, client = arrivals.pop(0)
        free_at = max(free_at, started) + service_s
        samples.append((started, free_at, 100, None, None))
        if free_at < deadline:
            arrivals.append((free_at, client))
    return samples


def test_the_window_gives_a_servers_rate_for_requests_that_take_seconds():
    # four clients of requests that take 1.38 s of the server each (100 x 4,096 tokens of pplx-embed on an
    # H100), a warm-up of 1 s and a window of 16.6 s: the server answers 0.725 requests a second
    samples = closed_loop(4, 1.38, 1.0, 16.6)
    timed = [sample for sample in samples if sample[0] >= 1.0]
    done = sorted((end, tokens) for _, end, tokens, _, _ in samples)
    wall_s, completed, tokens = throughput_window(done, 1.0, timed)
    assert abs(completed / wall_s - 1 / 1.38) < 0.01 / 1.38
    assert tokens == 100 * completed
    # what the window replaced, the timed requests from the first one's start, is a fifth low here
    first_start = min(start for start, *_ in timed)
    old_rate = len(timed) / (max(end for _, end, *_ in timed) - first_start)
    assert old_rate < 0.85 / 1.38


def test_short_requests_read_the_same_rate_and_a_single_response_still_has_one():
    samples = closed_loop(4, 0.01, 0.1, 2.0)
    timed = [sample for sample in samples if sample[0] >= 0.1]
    done = sorted((end, tokens) for _, end, tokens, _, _ in samples)
    wall_s, completed, _ = throughput_window(done, 0.1, timed)
    assert abs(completed / wall_s - 100) < 1
    # one sequential request: its own time
    wall_s, completed, tokens = throughput_window([(0.5, 7)], 0.0, [(0.2, 0.5, 7, None, None)])
    assert (round(wall_s, 6), completed, tokens) == (0.3, 1, 7)
    assert throughput_window([], 0.0, []) == (0.0, 0, 0)
