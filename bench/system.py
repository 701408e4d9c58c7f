"""What machine a run was on: CPU model, cores, torch threads, load, library versions."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class SystemInfo:
    cpu_model: str
    logical_cpus: int
    torch_threads: int
    load_average: tuple[float, float, float] | None
    python: str
    versions: dict[str, str]

    def describe(self) -> str:
        """One markdown paragraph for the report header."""
        load = ("n/a" if self.load_average is None
                else " / ".join(f"{value:.2f}" for value in self.load_average) + " (1 / 5 / 15 min)")
        libraries = ", ".join(f"{name} {version}" for name, version in self.versions.items())
        return (f"CPU: {self.cpu_model}, {self.logical_cpus} logical CPUs; torch threads: {self.torch_threads}; "
                f"load average at start: {load}; Python {self.python}; {libraries}.")

    def to_json(self) -> dict:
        return asdict(self)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def system_info() -> SystemInfo:
    import torch

    versions = {name: _version(name) for name in ("torch", "diffusers", "peft", "safetensors")}
    return SystemInfo(
        cpu_model=cpu_model(),
        logical_cpus=os.cpu_count() or 0,
        torch_threads=torch.get_num_threads(),
        load_average=load_average(),
        python=platform.python_version(),
        versions={name: value if value is not None else "not installed" for name, value in versions.items()},
    )
