"""Telling the fleet manager: every call written to the outbox first (outbox.py), delivered in order by the
sender thread, the HTTP client that trusts no answer, the manager's own view of us (row.py, rowwatch.py,
view.py), and children's output shipped as log lines (logship.py).
"""
