"""The phases and the lifecycle: each phase's states and the words of its moves (states.py), the one function
that decides them and the phase that carries them out (phase.py), its attempts, their start and the timers
between them (attempt.py), its children and their verdicts, who observes the lifecycle (lifecycle.py), what the
phases share (runtime.py), what the last run learnt (resume.py), the machine's fitness, and the GPU-fault
decisions that end a phase's attempt.
"""
