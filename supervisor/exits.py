"""The supervisor's own exit statuses, named once (run, reporting, cli and the tests use these).

A phase failed by ``timeout``, ``stalled`` or ``too_slow`` exits EXIT_TIMEOUT (124), as timeout(1)
does; one a watcher failed (``gpu_fault``) EXIT_FAILURE (1); one failed for a reason a plugin registered
(plugin.py ``Plugin.reasons``) the status it registered with it. A plugin's own statuses (the prover's 69,
its benchmark rejected: prover/reasons.py) are its to name, outside the ones below. Any other status is
passed on from the child that failed the lifecycle: its exit code, or 128 + the signal that killed it
(127 command not found, 126 not executable), or 128 + n when the supervisor itself was stopped by
signal n: any signal that means "stop" in signals.py (143 SIGTERM, 130 SIGINT, 131 SIGQUIT, 152
SIGXCPU, 158 SIGPWR, 165 SIGRTMIN+3...).
A stop signal that comes once the lifecycle is over (during the exit flush) changes nothing:
the status is the lifecycle's.
"""

# Every phase completed (a service that ended cleanly counts as completed).
EXIT_OK = 0
# A failure with no child status to pass on (fitness, a deadline between attempts, a plugin's finding...).
EXIT_FAILURE = 1
# A bad config or command line: one line on stderr, nothing started.
EXIT_CONFIG_ERROR = 2
# `status`: no supervisor answers (like systemctl's "not running").
EXIT_NOT_RUNNING = 3
# A phase failed by its deadline (timeout_s, a daemon's ready_timeout_s) or a stall (stall_s), as timeout(1)
# exits: whatever the child did on the SIGTERM that ended it (143, 137 after the grace, or its own 1).
EXIT_TIMEOUT = 124
# A phase failed with internal_error, a bug of the supervisor's own (EX_SOFTWARE of sysexits.h),
# so a fleet can tell "the supervisor broke" from any status a child passes on.
EXIT_INTERNAL_ERROR = 70
# Another supervisor already runs the lifecycle from this state_dir (Vast runs onstart on every start).
EXIT_ALREADY_RUNNING = 75
# This state_dir's instance was given up (givenup.py) by an earlier start: nothing was run again (outside
# sysexits.h, so a fleet can tell it from any child's status); `run --fresh` starts over.
EXIT_GIVEN_UP = 79
# The manager killed this instance (its row says ``killed``: its UI, its 90/45-minute timeouts, a bad host):
# the lifecycle was stopped, nothing that could un-kill it was sent (manager/view.py). Kept like a give-up.
EXIT_KILLED = 80
# A command other than `run` interrupted by Ctrl-C (SIGINT), as a shell reports it.
EXIT_INTERRUPTED = 130
