"""What lasts in state_dir across restarts: every file named once and written whole or not at all (files.py);
given-up.json, first-seen.json (the instance's clocks).
"""
