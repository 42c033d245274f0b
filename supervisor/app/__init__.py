"""The composition root: the commands (cli.py) and the init process start to end (run.py: startup.py's
steps, observers.py's wiring, teardown.py's exit). The only room that may hand the core a plugin.
"""
