"""A bulk job that cannot run as asked: bad input, an output holding another job's shards."""


class JobError(Exception):
    """`posy embed` prints it and exits with status 2."""
