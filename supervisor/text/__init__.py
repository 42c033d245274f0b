"""Text as the supervisor shows it: sizes and digits (units.py), terminal escapes (ansi.py), secrets masked
(redact.py), and stdout/stderr that may be closed or full (stdio.py).
"""
