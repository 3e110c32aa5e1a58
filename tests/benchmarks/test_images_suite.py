"""The images suite in its CPU smoke mode (tiny checkpoints, fp32): every case measures its engine against
transformers and what a client sees through `posy serve`, its rows within the parity bound (and a
vision-language case its image query held by 50 sequences, run once against once each), so that the
suite's code runs in CI before a GPU call spends device time on it."""

import argparse

from benchmarks import images


def test_every_case_measures_its_engine_and_http_against_transformers():
    options = argparse.Namespace(suite="images", rounds=1, backend="auto", smoke=True, shapes=None)
    outcome = images.run(options)
    assert outcome.failures == []
    measured = {(record.case, record.metric): record for record in outcome.records}
    for case in images.CASES:
        for kind in ("embed", "embed-http"):
            for metric in ("images_per_s", "tokens_per_s"):
                record = measured[f"{case} {kind}", metric]
                assert record.value > 0 and record.baseline > 0, (case, kind, metric)
        cosines = [measured[f"{case} embed", "min_cosine_vs_fp32"].value]
        if "-vl-" in case:  # a vision-language embedder's rows through HTTP are held to its parity too
            cosines.append(measured[f"{case} embed-http", "min_cosine_vs_fp32"].value)
            # an image held by 50 sequences (a ranker's image query), run once against once a sequence
            shared = measured[f"{case} image-query-50", "p50_ms"]
            assert shared.value > 0 and shared.baseline > 0, case
        else:  # a dual encoder's 50-image rerank, on its engine and through HTTP
            for kind in ("rerank-50", "rerank-http-50"):
                assert measured[f"{case} {kind}", "p50_ms"].baseline > 0, (case, kind)
        assert min(cosines) >= 0.9999, (case, cosines)
        # the server's own stages: where a request's time went (decoding is its tokenization)
        total = measured[f"{case} embed-http", "server_total_p50_ms"].value
        assert 0 < measured[f"{case} embed-http", "server_tokenization_p50_ms"].value <= total
