"""Where the pip CUDA wheels put their shared libraries (CUDA 12 and CUDA 13 layouts), for the
runtime preflight's `cuda_libs` check (`terra_rl.ops.runtime`)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

# (short name, directory under site-packages, shared library glob) of the pip CUDA 12 wheels
# that `jax[cuda12]` installs. CUDA 13 wheels bundle cuBLAS, CUPTI and NVRTC in
# nvidia/cu13/lib instead; `library_dir` finds either layout.
CUDA_WHEEL_LIBS: tuple[tuple[str, str, str], ...] = (
    ("cudnn", "nvidia/cudnn/lib", "libcudnn.so*"),
    ("cupti", "nvidia/cuda_cupti/lib", "libcupti.so*"),
    ("cublas", "nvidia/cublas/lib", "libcublas.so*"),
    ("nvrtc", "nvidia/cuda_nvrtc/lib", "libnvrtc.so*"),
    ("nccl", "nvidia/nccl/lib", "libnccl.so*"),
)


def nvidia_package_dirs(site_packages: str = "") -> list[Path]:
    """Directories holding the pip `nvidia` namespace package (`<site-packages>/nvidia`)."""
    if site_packages:
        return [Path(site_packages) / "nvidia"]
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(location) for location in spec.submodule_search_locations]


def library_dir(roots: Sequence[Path], relative: str, pattern: str) -> Path | None:
    """The directory of one CUDA library: its own CUDA 12 wheel directory `relative` when
    that exists, else any `nvidia/*/lib` holding `pattern` (the CUDA 13 layout)."""
    for root in roots:
        if (root / relative).is_dir():
            return root / relative
    for root in roots:
        for directory in sorted((root / "nvidia").glob("*/lib")):
            if any(directory.glob(pattern)):
                return directory
    return None
