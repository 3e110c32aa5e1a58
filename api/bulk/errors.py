"""A bulk job that cannot run as asked (bad input, an output holding another job's shards), or whose
tokenizer process died under it."""


class JobError(Exception):
    """`posy embed` prints it and exits with status 2."""


class TokenizerFailed(Exception):
    """A tokenizer process died (killed, out of memory): `posy embed` exits with status 1 and keeps the
    finished shards, like a model failure."""
