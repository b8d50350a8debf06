"""gpflow-fed: federated and privacy-aware Gaussian processes for GPflow 2.

Submodules load on first use (``gpflow_fed.models``, ``from gpflow_fed import federated``), so that
``import gpflow_fed`` and the ``gpflow-fed`` command's ``--help`` do not import TensorFlow. The package's GPflow
dispatch registrations (``Kuu``/``Kuf``, posteriors, ``prior_kl``) are all for its own inducing variables, and
``gpflow_fed.inducing_variables`` loads them with the types, so they are active whenever a type they serve is.

Quiet by default. Imported before TensorFlow, the package keeps TensorFlow's start-up lines off the terminal, in
Python as on the command line, and nothing else:

* ``TF_CPP_MIN_LOG_LEVEL`` is set to :data:`TF_LOG_LEVEL` (2: no C++ INFO or WARNING lines; ERROR and FATAL still
  show, where 3 would hide them) unless the user has set it;
* lines written before TensorFlow's logging starts ignore that variable (``WARNING: All log messages before
  absl::InitializeLog() …``, the oneDNN notice, the CPU-instructions notice), so while ``tensorflow`` is first
  imported, and while it first lists the machine's devices (where the CUDA probe runs), standard error (file
  descriptor 2) is captured and written back without the lines of :data:`START_UP_NOISE`; on a machine without an
  NVIDIA device (no ``/dev/nvidia0``, ``/dev/dxg``) also without the CUDA lines, there the failed ``cuInit`` of a
  driver-less machine (:data:`CUDA_NOISE`). Everything else written meanwhile (errors, Python warnings) is kept.

``GPFLOW_FED_TF_LOGS=1`` keeps TensorFlow's output as it is. Imported after TensorFlow, the package changes nothing.
"""

from __future__ import annotations

import glob
import importlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile
from types import ModuleType
from typing import Any, Callable, List, Optional, Sequence, TypeVar

__version__ = "0.1.0"

#: ``TF_CPP_MIN_LOG_LEVEL`` set at import when the user has not set it (see the module docstring).
TF_LOG_LEVEL = "2"
#: TensorFlow's start-up lines that carry no news, dropped while it is imported and probes its devices; with them
#: the oneDNN build's once-a-process notice that an op type falls back to Eigen (logged at ERROR level, though the
#: op runs), which the command line spends at start-up (:func:`gpflow_fed.cli.quiet_tensorflow`).
START_UP_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} .*\] oneDNN custom operations are on"
    r"|I\d{4} .*cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\."
    r"|E\d{4} .*util\.cc:\d+\] oneDNN supports DT_\w+ only on platforms with AVX-512\. Falling back to the default "
    r"Eigen-based implementation)"
)
#: TensorFlow's CUDA lines, dropped on a machine with no NVIDIA device, where they say only that there is no GPU.
CUDA_NOISE = re.compile(r"^[IWE]\d{4} .*\b(cuda\w*|cudart_stub|gpu_device)\.cc:\d+\] ")
T = TypeVar("T")


def _has_nvidia_device() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/dxg")


def without_start_up_noise(text: str, gpu: Optional[bool] = None) -> str:
    """``text`` less the lines of :data:`START_UP_NOISE` (and of :data:`CUDA_NOISE` when the machine has no NVIDIA
    device; ``gpu`` overrides the check)."""
    cuda = not (_has_nvidia_device() if gpu is None else gpu)
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not START_UP_NOISE.match(line) and not (cuda and CUDA_NOISE.match(line))
    )


def filtered_stderr(call: Callable[[], T]) -> T:
    """``call()`` with file descriptor 2 captured, then written back :func:`without_start_up_noise`."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            return call()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = without_start_up_noise(captured.read().decode(errors="replace"))
            if kept:
                os.write(2, kept.encode())


def _quiet_device_probe() -> None:
    """The first listing of the machine's devices (TensorFlow's CUDA probe, at the first op or device query) runs
    under :func:`filtered_stderr`."""
    try:
        from tensorflow.python.eager import context
    except ImportError:  # pragma: no cover - a TensorFlow without it: its lines are left as they are
        return
    original = getattr(context.Context, "_initialize_physical_devices", None)
    if original is None:  # pragma: no cover - a TensorFlow that lists devices elsewhere
        return

    def first_listing(self: Any, *args: Any, **kwargs: Any) -> Any:
        context.Context._initialize_physical_devices = original  # once: later listings find nothing new
        return filtered_stderr(lambda: original(self, *args, **kwargs))

    context.Context._initialize_physical_devices = first_listing


class _QuietLoader(importlib.abc.Loader):
    """Loads ``tensorflow`` with its real loader, under :func:`filtered_stderr`."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # the real loader, for whatever asks the module later
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        filtered_stderr(lambda: self.loader.exec_module(module))
        _quiet_device_probe()


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` with the other finders and hands it to :class:`_QuietLoader` (the import system asks
    only while ``tensorflow`` is not yet in ``sys.modules``)."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != "tensorflow":
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _QuietTensorFlow) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _QuietLoader(spec.loader)
                return spec
        return None


def _quiet_tensorflow_start_up() -> None:
    """What the module docstring says, once, before TensorFlow is imported."""
    if "tensorflow" in sys.modules or os.environ.get("GPFLOW_FED_TF_LOGS") == "1":
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", TF_LOG_LEVEL)
    if not any(isinstance(finder, _QuietTensorFlow) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())


_quiet_tensorflow_start_up()

_SUBMODULES = (
    "baselines",
    "covariances",
    "data",
    "federated",
    "inducing_variables",
    "kernels",
    "likelihoods",
    "metrics",
    "models",
    "monitor",
    "posteriors",
)
#: public functions defined in a submodule and re-exported here: name -> module.
_FUNCTIONS = {"fit": "fitting"}

__all__ = ["__version__", *_SUBMODULES, *_FUNCTIONS]


def __getattr__(name: str) -> Any:
    """Import a submodule on first use (PEP 562); only that one (and what it imports itself)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _FUNCTIONS:
        function = getattr(importlib.import_module(f"{__name__}.{_FUNCTIONS[name]}"), name)
        globals()[name] = function
        return function
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
