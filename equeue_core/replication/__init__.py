"""Master/replica replication of a broker group's commit log (docs/replication.md).

wire.py: request codes 50-59 and their headers; epochs.py: the epoch file; master.py: serving
replicas and counting their acknowledgements; replica.py: copying from a master;
replication.py: the `Replication` object the broker (and the controller's agent) drives.
"""
