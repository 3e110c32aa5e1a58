"""Engine replicas in worker processes: ReplicaSet starts and restarts them (replica_set.py), each serves
its engine over a socket and shared-memory rings (replica.py, protocol.py, shm_ring.py), and the gateway's
ReplicaPool splits requests over them (pool.py, link.py)."""
