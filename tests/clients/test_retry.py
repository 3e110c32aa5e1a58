"""RetryPolicy: what is retried, after how long (Retry-After in seconds or as an HTTP date), and when
it gives up."""

import email.utils

from clients.retry import RetryPolicy, parse_retry_after


def test_retry_after_seconds_and_dates():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0 ") == 0.0
    now = 1_800_000_000.0
    assert parse_retry_after(email.utils.formatdate(now + 7, usegmt=True), now=now) == 7.0
    assert parse_retry_after(email.utils.formatdate(now - 7, usegmt=True), now=now) == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None


def test_overload_and_unavailable_wait_what_the_server_asks_capped():
    policy = RetryPolicy(max_retries=3, backoff_s=0.5, max_wait_s=10.0)
    assert policy.delay(1, 429, "2") == 2.0
    assert policy.delay(2, 503, "4") == 4.0
    assert policy.delay(1, 429, "3600") == 10.0


def test_without_retry_after_the_wait_doubles_and_connection_errors_count():
    policy = RetryPolicy(max_retries=3, backoff_s=0.5)
    assert [policy.delay(attempt, 503, None) for attempt in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert policy.delay(1, None, None) == 0.5  # the connection failed


def test_client_errors_are_not_retried_and_retries_run_out():
    policy = RetryPolicy(max_retries=2)
    for status in (400, 401, 404, 413, 422, 500):
        assert policy.delay(1, status, "1") is None
    assert policy.delay(3, 429, "1") is None
    assert RetryPolicy(max_retries=0).delay(1, 429, "1") is None
