"""The init process's machinery: the one event loop, signals, worker threads, the reaper, a child spawned in
its own process group and its tree stopped, the process table, survivors, the stop budget, the freeze
tick, the console and log files, readiness probes and who holds a port.
"""
