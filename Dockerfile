# The prover image: a base that already holds the GPU programs (curio, cuzk) plus the supervisor.
#
# Build (no network needed inside the build; the wheels are made on the host first):
#   rm -rf build/wheels && python3 -m pip wheel . -w build/wheels   # the package and its dependencies
#   docker build --build-arg BASE_IMAGE=<the curio/cuzk image> -t <tag> .
# The wheels must suit the base's python3 (same X.Y as the host that built them, or fetched for it with
# `pip download --only-binary=:all: --python-version X.Y --platform manylinux2014_x86_64`).
# tests/container/images.py builds it this way against a debootstrap'ed Debian base.

# In production: the curio/cuzk image. It must have python3 (>= 3.11) with the venv module.
ARG BASE_IMAGE=localhost/prover-base:bookworm
FROM ${BASE_IMAGE}

# Where the host put the wheels, relative to the build context (build/ is git-ignored).
ARG WHEELS=build/wheels

# Its own venv, never the system site-packages: Debian's `supervisor` package (or any other
# `supervisor`, `requests`, `psutil` of the base) can neither be shadowed by it nor shadow it.
# --no-index: everything comes from the wheels in the context, so the build never reaches a registry.
COPY ${WHEELS}/ /tmp/prover-supervisor-wheels/
# A base without a usable python3 fails here, in one line, rather than deep inside pip.
RUN python3 -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' \
    || { echo "BASE_IMAGE needs python3 >= 3.11 with its venv module (Debian: python3 python3-venv)" >&2; exit 1; }
RUN python3 -m venv /opt/prover-supervisor \
 && /opt/prover-supervisor/bin/python -m pip install --no-index --no-cache-dir --disable-pip-version-check \
        --find-links /tmp/prover-supervisor-wheels prover-supervisor \
 && rm -rf /tmp/prover-supervisor-wheels \
 && /opt/prover-supervisor/bin/python -I -m supervisor --version

COPY entrypoint.py /opt/prover-supervisor/entrypoint.py
# On PATH, so `docker exec CONTAINER prover-supervisor status` works. A wrapper, not a link to the venv's
# script: that one's first line is the venv's python without -I, so a base image's PYTHONPATH (Debian's
# `supervisor`, supervisord's package) would be imported in place of ours.
RUN printf '#!/bin/sh\nexec /opt/prover-supervisor/bin/python -I -m supervisor "$@"\n' \
        > /usr/local/bin/prover-supervisor \
 && chmod 0755 /usr/local/bin/prover-supervisor

# The manager starts instances with Vast's --ssh mode, which replaces ENTRYPOINT and runs
#   --onstart-cmd "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"
# so that path must keep working: it is a thin shim that execs the supervisor (which then makes
# itself a child subreaper, since it is not PID 1 there).
COPY docker/entrypoint.sh /usr/local/bin/entrypoint.sh
RUN chmod 0755 /usr/local/bin/entrypoint.sh /opt/prover-supervisor/entrypoint.py

# `docker stop` (how Vast recycles instances) sends this; the supervisor stops its children's trees
# within its stop_budget_s (8 s unless set; their stop_grace_s shrunk to fit) and exits 143, before
# docker's own SIGKILL at 10 s.
STOPSIGNAL SIGTERM

# Exec form, no shell in between: the supervisor itself is PID 1 of `docker run`, receives the
# stop signal and reaps every orphan of the container. -I: isolated mode, so PYTHONPATH/PYTHONHOME
# or a user site of the base image cannot change which modules the supervisor runs.
ENTRYPOINT ["/opt/prover-supervisor/bin/python", "-I", "/opt/prover-supervisor/entrypoint.py"]
# `docker run IMAGE` runs the lifecycle; `docker run IMAGE demo` (or check --config F, --version) works too,
# and options alone are run's: `docker run IMAGE --config F` is `run --config F` (entrypoint.py).
CMD ["run"]
