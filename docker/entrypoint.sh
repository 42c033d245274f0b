#!/bin/sh
# /usr/local/bin/entrypoint.sh: the path the fleet manager's onstart command has always started,
#   --onstart-cmd "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"
# (Vast's --ssh mode replaces the image's ENTRYPOINT and runs that instead). It only execs the
# supervisor: no shell stays in between to swallow signals or exit statuses, and the supervisor,
# not being PID 1 there, makes itself a child subreaper. Arguments go to the supervisor (default: run).
[ "$#" -gt 0 ] || set -- run
exec /opt/prover-supervisor/bin/python -I /opt/prover-supervisor/entrypoint.py "$@"
