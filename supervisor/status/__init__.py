"""What the supervisor shows of itself: the snapshot taken in the loop (snapshot.py; its typed parts and their
JSON, model.py), status.json (file.py), the status socket and the ``status`` command, the text view (headline,
timers, render), /healthz and /metrics, the well-known pointer to the running supervisor.
"""
