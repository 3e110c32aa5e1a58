"""Bulk embedding jobs (`posy embed`): a file of texts in, Parquet shards of ids and vectors out, on the
in-process engine or on a Ray cluster through Ray Data."""
