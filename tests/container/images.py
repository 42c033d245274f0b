"""Build the test image with podman, without any container registry.

1. A minimal Debian base: ``debootstrap --variant=minbase`` from this machine's own apt mirror, tarred
   and ``podman import``ed as ``localhost/prover-base:bookworm``. The tarball is cached in
   ``/var/cache/prover-supervisor-test`` (``$PROVER_TEST_CACHE``), and the imported image is reused
   while ``podman image exists`` says so: only the first run pays for debootstrap.
2. A temporary build context: the repo's Dockerfile, entrypoint.py, docker/entrypoint.sh, and
   ``build/wheels`` holding the package and its dependencies as wheels made on this host (the
   Dockerfile installs them with ``--no-index``: the image build itself needs no network).
3. ``podman build --build-arg BASE_IMAGE=... -t localhost/prover-supervisor:test``.

podman here needs a containers.conf (``$CONTAINERS_CONF``): runc (crun does not work on this VM),
cgroupfs (no systemd), and explicit ulimits (podman's default ones are refused here).

Used by tests/test_container.py; also runnable by hand::

    python tests/container/images.py          # prints the image id; then e.g.
    CONTAINERS_CONF=/var/cache/prover-supervisor-test/containers.conf podman run --rm IMAGE demo
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PROVER_TEST_CACHE", "/var/cache/prover-supervisor-test"))
SUITE = "bookworm"
BASE_TAG = f"localhost/prover-base:{SUITE}"
IMAGE_TAG = "localhost/prover-supervisor:test"
# A previous test image younger than this is kept when a new one is built: a test run beside this one may run it.
KEEP_RECENT_IMAGE_S = 3600.0
TEST_IMAGE_LABEL = "prover.test-image=1"
# What the Dockerfile needs of a base (python3 + venv), and procps so a person can `ps` inside.
DEBOOTSTRAP_ARGS = ["--variant=minbase", "--include=python3,python3-venv,procps", SUITE]
CONTAINERS_CONF = """\
# Written by tests/container/images.py for podman on this machine.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""

Say = Callable[[str], None]


class CannotBuild(Exception):
    """The machine cannot build the image (a tool, the network or a permission is missing): skip, saying why."""


class BuildFailed(Exception):
    """``podman build`` of the Dockerfile failed on a machine that can build: a real failure, not a skip."""


def _stderr_say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- prerequisites


def missing_prerequisite() -> str | None:
    """None if this machine can build and run the image, else why not (a skip reason)."""
    if sys.platform != "linux":
        return "not Linux"
    if os.geteuid() != 0:
        return "not root (podman import/run with cgroup limits and debootstrap need root)"
    for tool in ("podman", "runc", "debootstrap", "tar"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is not installed (apt-get install podman runc debootstrap)"
    return None


def cache_dir() -> Path:
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        probe = CACHE / f".probe{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise CannotBuild(f"cache directory {CACHE} is not usable ({exc.strerror or exc}); "
                          "set PROVER_TEST_CACHE") from None
    return CACHE


def podman_env() -> dict[str, str]:
    """The environment for every podman call: CONTAINERS_CONF pointing at our containers.conf."""
    conf = cache_dir() / "containers.conf"
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        tmp = conf.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(CONTAINERS_CONF)
        tmp.replace(conf)
    path = os.environ.get("PATH", "/usr/bin:/bin")
    if "/usr/sbin" not in path.split(":"):
        path += ":/usr/sbin:/sbin"  # runc and debootstrap live there; a non-login root shell may lack it
    return {**os.environ, "CONTAINERS_CONF": str(conf), "PATH": path}


def podman(*args: str, check: bool = True, timeout: float = 300, capture: bool = True,
           ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *args], env=podman_env(), text=True, timeout=timeout,
                          capture_output=capture)
    if check and proc.returncode != 0:
        raise CannotBuild(f"podman {' '.join(args[:3])} failed ({proc.returncode}): "
                          f"{(proc.stderr or '').strip()[-2000:]}")
    return proc


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    """One builder at a time on this machine (two test runs must not debootstrap or tag at once)."""
    with open(cache_dir() / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------- the apt mirror


def apt_mirror(etc: Path | str = "/etc/apt") -> str | None:
    """The Debian mirror this machine's apt uses for SUITE (from sources.list and sources.list.d)."""
    etc = Path(etc)
    files = [etc / "sources.list"]
    with contextlib.suppress(OSError):
        files += sorted((etc / "sources.list.d").iterdir())
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":
            found = _mirror_deb822(text)
        elif path.suffix == ".list":
            found = _mirror_one_line(text)
        else:
            continue
        if found:
            return found
    return None


def _is_debian_main(uri: str, suites: list[str]) -> bool:
    return SUITE in suites and uri.startswith(("http://", "https://")) and "security" not in uri


def _mirror_one_line(text: str) -> str | None:
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        line = re.sub(r"\[[^\]]*\]", "", line)  # drop options: deb [arch=amd64 signed-by=...] URI ...
        words = line.split()
        if len(words) >= 3 and words[0] == "deb" and _is_debian_main(words[1], [words[2]]):
            return words[1]
    return None


def _mirror_deb822(text: str) -> str | None:
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for raw in stanza.splitlines():
            if raw.startswith("#") or ":" not in raw or raw[:1].isspace():
                continue
            key, _, value = raw.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
            continue
        for uri in fields.get("uris", "").split():
            if _is_debian_main(uri, fields.get("suites", "").split()):
                return uri
    return None


# ---------------------------------------------------------------- the base image


def ensure_base(say: Say = _stderr_say) -> str:
    """``localhost/prover-base:bookworm``: reuse the image, else import the cached tarball, else debootstrap.

    The image carries the debootstrap arguments it was made with (a label), the tarball a ``.args``
    stamp: either is reused only while DEBOOTSTRAP_ARGS are the same.
    """
    with cache_lock():
        tarball = CACHE / f"base-{SUITE}.tar"
        stamp = CACHE / f"base-{SUITE}.args"
        wanted = " ".join(DEBOOTSTRAP_ARGS)
        label = podman("image", "inspect", "--format", '{{index .Labels "prover.debootstrap"}}', BASE_TAG,
                       check=False)
        if label.returncode == 0 and label.stdout.strip() == wanted:
            say(f"base image {BASE_TAG}: present, reused")
            return BASE_TAG
        if not (tarball.exists() and stamp.exists() and stamp.read_text() == wanted):
            mirror = apt_mirror()
            if mirror is None:
                raise CannotBuild(f"no http(s) Debian mirror for {SUITE} in /etc/apt/sources.list(.d)")
            started = time.monotonic()
            say(f"base image: debootstrap {wanted} from {mirror} (first run only; cached in {tarball})")
            _debootstrap(mirror, tarball)
            stamp.write_text(wanted)
            say(f"base image: debootstrap + tar took {time.monotonic() - started:.0f}s "
                f"({tarball.stat().st_size >> 20} MiB)")
        old = podman("image", "inspect", "--format", "{{.Id}}", BASE_TAG, check=False).stdout.strip()
        started = time.monotonic()
        podman("import", "--change", 'CMD ["/bin/sh"]', "--change", f'LABEL prover.debootstrap="{wanted}"',
               str(tarball), BASE_TAG)
        say(f"base image {BASE_TAG}: imported from {tarball} in {time.monotonic() - started:.1f}s")
        if old:
            podman("rmi", old, check=False)  # the outdated base, untagged now (kept if something uses it)
        return BASE_TAG


def _debootstrap(mirror: str, tarball: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=CACHE))
    root = work / "rootfs"
    try:
        proc = subprocess.run(["debootstrap", *DEBOOTSTRAP_ARGS, str(root), mirror], env=podman_env(),
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise CannotBuild(f"debootstrap failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-1500:]}")
        # Downloaded .debs and apt lists are half the size and of no use in the image.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / junk).glob("*"):
                if entry.is_file():
                    entry.unlink()
        partial = tarball.with_suffix(".tar.partial")
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(partial), "."],
                       check=True, timeout=600)
        partial.replace(tarball)  # atomically: a killed run never leaves a half tarball to reuse
    finally:
        shutil.rmtree(work, ignore_errors=True)


def base_python(base: str) -> str:
    """The base image's ``python3`` version, "X.Y"."""
    proc = podman("run", "--rm", "--network", "none", "--entrypoint", "python3", base, "-c",
                  "import sys; print('%d.%d' % sys.version_info[:2])", timeout=120)
    return proc.stdout.strip()


# ---------------------------------------------------------------- the build context and image


def make_context(dest: Path, python_version: str, say: Say = _stderr_say) -> Path:
    """A build context like the repo's (what .dockerignore lets through), wheels in build/wheels."""
    for name in ("Dockerfile", ".dockerignore", "entrypoint.py"):
        shutil.copy2(REPO / name, dest / name)
    (dest / "docker").mkdir()
    shutil.copy2(REPO / "docker" / "entrypoint.sh", dest / "docker" / "entrypoint.sh")
    wheels = dest / "build" / "wheels"
    wheels.mkdir(parents=True)
    # The package is built from a copy of its sources, so setuptools' build/ and egg-info stay out of the repo.
    src = dest.parent / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "supervisor", src / "supervisor",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    started = time.monotonic()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    host = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if python_version == host:
        _pip([*pip, "wheel", "-w", str(wheels), str(src)])
    else:
        # The base's python differs from ours: the package is pure Python, its dependencies are
        # fetched as binary wheels for the base's version.
        _pip([*pip, "wheel", "--no-deps", "-w", str(wheels), str(src)])
        built = next(wheels.glob("prover_supervisor-*.whl"))
        arch = os.uname().machine
        _pip([*pip, "download", "--only-binary=:all:", "--python-version", python_version,
              "--platform", f"manylinux2014_{arch}", "--platform", f"manylinux_2_17_{arch}",
              "--platform", f"manylinux_2_28_{arch}", "-d", str(wheels), str(built)])
    say(f"wheels for python {python_version}: {len(list(wheels.glob('*.whl')))} in "
        f"{time.monotonic() - started:.1f}s")
    return dest


def _pip(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise CannotBuild(f"cannot make the wheels ({' '.join(argv[3:5])}): {proc.stderr.strip()[-1500:]}")


def drop_old_images(keep: str) -> None:
    """Our earlier test images (by their label), untagged once a new one is built, are dropped with their layers
    once they are KEEP_RECENT_IMAGE_S old: a younger one may be in use by a test run beside this one (another
    xdist worker, another checkout), and one a container uses is kept by podman itself."""
    listed = podman("images", "--filter", f"label={TEST_IMAGE_LABEL}", "--format", "{{.Id}} {{.Created.Unix}}",
                    "--no-trunc", check=False).stdout.split("\n")
    for line in listed:
        image_id, _, created = line.strip().removeprefix("sha256:").partition(" ")
        if image_id and not keep.startswith(image_id[:12]) and created.isdigit() \
                and time.time() - int(created) > KEEP_RECENT_IMAGE_S:
            podman("rmi", image_id, check=False)


def build_image(say: Say = _stderr_say) -> str:
    """Build ``localhost/prover-supervisor:test`` from the repo's Dockerfile; return the image id."""
    why = missing_prerequisite()
    if why:
        raise CannotBuild(why)
    base = ensure_base(say)
    version = base_python(base)
    with tempfile.TemporaryDirectory(prefix="prover-image-") as tmp:
        context = Path(tmp) / "context"
        context.mkdir()
        make_context(context, version, say)
        with cache_lock():
            started = time.monotonic()
            iidfile = Path(tmp) / "iid"
            # --network none: the Dockerfile must build from the context alone. --layers=false: no
            # intermediate images to pile up run after run (the wheels differ each time anyway). The label
            # finds our earlier images again (drop_old_images).
            proc = podman("build", "--layers=false", "--network", "none", "--build-arg", f"BASE_IMAGE={base}",
                          "--label", TEST_IMAGE_LABEL, "--iidfile", str(iidfile), "-t", IMAGE_TAG, str(context),
                          check=False, timeout=600)
            if proc.returncode != 0:
                raise BuildFailed(f"podman build failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-2000:]}")
            image = iidfile.read_text().strip().removeprefix("sha256:")
            say(f"image {IMAGE_TAG} ({image[:12]}) built in {time.monotonic() - started:.1f}s")
            drop_old_images(keep=image)
    return image


def main() -> int:
    try:
        print(build_image())
    except (CannotBuild, BuildFailed) as exc:
        print(f"cannot build the image: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
