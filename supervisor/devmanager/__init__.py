"""``prover-supervisor dev-manager``: a stand-in of the fleet manager's HTTP API on 127.0.0.1, for the demo,
the tests and the benchmarks, able to misbehave on purpose (faults.py). Not part of the supervisor process.
"""
