"""The phases and the lifecycle: each phase's states and moves (states.py, phase.py), its attempts, their
start, pacing and policy, its children and their verdicts, what the last run learnt (resume.py), the
machine's fitness, and the GPU-fault decisions that end a phase's attempt.
"""
