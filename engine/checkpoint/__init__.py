"""Reading a checkpoint: where a model comes from, its files, and the ModelSpec that says how posy serves
it, before anything is built."""
