"""EQueue against the brokers people pick instead (issue 15): one driver module per system, the
same workloads each, run by bench/peers/run.py (`python -m bench.peers`)."""
