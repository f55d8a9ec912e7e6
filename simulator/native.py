"""The shared core compiled to C with mypyc (`kvpd native build`), used when its sources match.

`simulator/core/` (and the simulator's step loop) is plain typed Python; mypyc compiles the
modules in `MODULES` as they are into C extensions that run the same code about 2x faster
on a whole simulation, with identical results. A build goes to a cache folder named after
what it depends on (the modules' bytes and this Python), never beside the sources: an edited
module stops matching and the pure-Python modules load again, so a stale build can never
shadow a change. `install()` (run when `simulator` is imported) puts a finder first on
`sys.meta_path` that serves those modules from a matching build when `KVPD_NATIVE=1`.

Opt-in: the compiled core checks its annotations, so a caller passing a numpy integer where
it says `int`, or a list where it says `tuple`, gets a TypeError where Python would have
carried on. kvpd's own callers pass what the annotations say: `.ci/run` runs the default test
suite under it too (one test that wraps a method on an instance is skipped there).

    kvpd native build | status | clean
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent  # simulator/
# the compiled modules: every module of the core but `engine` (a loop over an executor
# protocol, where the time is the executor's), and the simulator's loop: a replica's steps,
# the load generator, and the all-decode prices they ask for most
MODULES = tuple(f"simulator.core.{m}" for m in (
    "batch_shape", "batch_wait", "block_copies", "block_hash", "block_pool", "capacity", "config",
    "decode_burst", "kv_cache_manager", "parallel_sampling", "pd_handoff", "recv_gate",
    "request", "request_queue", "scheduler", "scheduler_output", "scheduler_state",
    "window_groups")) + (
    "simulator.cluster.replica", "simulator.cluster.load", "simulator.cost.decode_steps")
ENV = "KVPD_NATIVE"  # "1": load a matching build
BUILD_TIMEOUT_S = 900
SUFFIX = str(sysconfig.get_config_var("EXT_SUFFIX"))  # this interpreter's extension modules
# no fused multiply-adds: the compiled floats round as the interpreter's do, so both cores
# give bit-identical times on every platform (FMA is baseline on arm64)
CFLAGS = "-ffp-contract=off"


def _asked() -> bool:
    """Whether this environment asks for the native core (KVPD_NATIVE=1)."""
    return os.environ.get(ENV, "0") == "1"


def source(module: str) -> Path:
    """The .py file of a dotted module name under `simulator`."""
    return PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")


def cache_root() -> Path:
    """Where builds go: $KVPD_CACHE_DIR, else $XDG_CACHE_HOME/kvpd, else ~/.cache/kvpd."""
    if os.environ.get("KVPD_CACHE_DIR"):
        return Path(os.environ["KVPD_CACHE_DIR"]) / "native"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvpd" / "native"


def _mypyc_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("mypy")
    except Exception:  # not installed: nothing can be built
        return None


def build_key() -> str:
    """What a build depends on: the compiled modules' bytes, this interpreter and the C flags."""
    h = hashlib.sha256()
    h.update(sys.version.encode())
    h.update(SUFFIX.encode())
    h.update(CFLAGS.encode())
    for name in MODULES:
        h.update(name.encode())
        h.update(source(name).read_bytes())
    return h.hexdigest()[:20]


def _find_build() -> Path | None:
    """A finished build matching the current sources and interpreter."""
    root = cache_root()
    if not root.is_dir():
        return None
    key = build_key()
    folder = root / key
    return folder if (folder / "COMPLETE").is_file() else None


class _Finder:
    """Serves the modules of `MODULES` (and mypyc's shared runtime module) from a build."""

    def __init__(self, folder: Path) -> None:
        self.paths = {m: folder / f"{m}{SUFFIX}" for m in MODULES}
        for lib in folder.glob(f"*__mypyc{SUFFIX}"):
            self.paths[lib.name[:-len(SUFFIX)]] = lib
        self.folder = folder

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        so = self.paths.get(fullname)
        if so is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(so))
        return importlib.util.spec_from_file_location(fullname, so, loader=loader)


_installed: _Finder | None = None


def install() -> Path | None:
    """With KVPD_NATIVE=1, load the core from a matching build from now on; the build's
    folder, or None (pure Python: not asked for, none built, or sources changed since). Call
    before the core is imported (`simulator/__init__.py` does)."""
    global _installed
    if _installed is not None:
        return _installed.folder
    if not _asked():
        return None
    if any(m in sys.modules for m in MODULES):
        return None  # the pure modules are already loaded: mixing the two would not work
    folder = _find_build()
    if folder is None:
        return None
    _installed = _Finder(folder)
    sys.meta_path.insert(0, _installed)
    return folder


def wanted() -> bool:
    """Whether a process started now with this environment would load a native build."""
    return _asked() and _find_build() is not None


def active() -> bool:
    """Whether the core was loaded from a native build."""
    mod = sys.modules.get("simulator.core.scheduler")
    return mod is not None and str(getattr(mod, "__file__", "")).endswith(SUFFIX)


def build(*, quiet: bool = False) -> Path:
    """Compile the core with mypyc into the cache (a C compiler and `mypy` are needed:
    `pip install -e ".[native]"`); returns the build's folder. Compiles a copy of the sources,
    so nothing is written beside them."""
    version = _mypyc_version()
    if version is None:
        raise RuntimeError("kvpd native build needs mypyc: pip install -e \".[native]\" "
                           "(or pip install mypy)")
    folder = cache_root() / build_key()
    if (folder / "COMPLETE").is_file():
        return folder
    with tempfile.TemporaryDirectory(prefix="kvpd-native-") as tmp:
        # a copy of the package's sources, so that the modules the compiled ones import are
        # typed and nothing is written beside the real ones
        shutil.copytree(PACKAGE, Path(tmp) / "simulator",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "catalog"))
        (Path(tmp) / "mypy.ini").write_text(
            "[mypy]\nignore_missing_imports = True\nfollow_imports = silent\n")
        rel = {m: source(m).relative_to(PACKAGE.parent) for m in MODULES}  # (as in the copy)
        cmd = [sys.executable, "-m", "mypyc", *(str(p) for p in rel.values())]
        cflags = f"{os.environ.get('CFLAGS', '')} {CFLAGS}".strip()
        res = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True,
                             timeout=BUILD_TIMEOUT_S, env={**os.environ, "CFLAGS": cflags})
        if res.returncode != 0:
            tail = "\n".join((res.stdout + res.stderr).splitlines()[-30:])
            raise RuntimeError(f"mypyc failed (exit status {res.returncode}):\n{tail}")
        built = {m: (Path(tmp) / p).with_suffix(SUFFIX) for m, p in rel.items()}
        missing = [m for m, p in built.items() if not p.is_file()]
        if missing:
            raise RuntimeError(f"mypyc produced no module for {', '.join(missing)}")
        staging = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for m, p in built.items():
            shutil.copy2(p, staging / f"{m}{SUFFIX}")
        for p in Path(tmp).glob(f"*__mypyc{SUFFIX}"):
            shutil.copy2(p, staging / p.name)
        (staging / "COMPLETE").write_text(f"mypy {version}\n")
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    if not quiet:
        print(f"built the native core with mypy {version} in {folder}")
    return folder


def clean() -> int:
    """Remove every build; returns how many there were."""
    root = cache_root()
    if not root.is_dir():
        return 0
    n = sum(1 for p in root.iterdir() if p.is_dir())
    shutil.rmtree(root)
    return n


def status() -> str:
    """One line: whether a matching build exists and whether this process uses it."""
    folder = _find_build()
    if folder is None:
        return ("native core: not built for these sources (pure Python; "
                "`kvpd native build` compiles it)")
    if not _asked():
        return f"native core: built ({folder}); not in use: set KVPD_NATIVE=1"
    return f"native core: {'in use' if active() else 'built'} ({folder})"
