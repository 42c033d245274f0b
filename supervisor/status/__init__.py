"""What the supervisor shows of itself: the snapshot taken in the loop (snapshot.py; its typed parts and their
JSON, model.py), status.json and the well-known pointer to the running supervisor (file.py), the status socket
(socket.py) and the ``status`` command (command.py), the text view (headline.py, render.py; the timers are
counted in snapshot.py), /healthz and /metrics (health.py).
"""
