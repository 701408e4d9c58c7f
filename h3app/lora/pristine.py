"""Merged mode's pristine (pre-merge) copies of the base weights, and where they live.

Placements:

- ``device``: a copy beside the weight, on the weight's own device. A re-merge is then device-side reads and adds
  (no host→device traffic). On a CPU model this is simply a second copy in RAM.
- ``ram``: host RAM. When the weights are on an accelerator the copy is pinned, and a re-merge reads it in row
  chunks copied without blocking on a side stream, each chunk's copy overlapping the previous chunk's adds.
- ``disk``: one local safetensors file per weight, read back through a memory map.

``prefer="auto"`` (the default) takes ``device`` when the copies fit the device budget, else ``ram`` when host RAM
has room, else ``disk``; any other ``prefer`` forces that placement (refused with the reason when it does not fit).
``device_budget`` is the bytes of accelerator memory the copies may use (a memory planner sets it); None means the
free device memory minus a margin left for activations. ``reserve`` decides before anything is copied.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ..errors import H3AppError

PLACEMENTS = ("auto", "device", "ram", "disk")
# Accelerator memory left free for activations when no budget is given: a quarter of the device, at least 8 GiB.
DEVICE_MARGIN_FRACTION = 0.25
DEVICE_MARGIN_MIN = 8 << 30


def _available_ram() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def _total_ram() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().total)


def free_device_memory(device: torch.device) -> int | None:
    """Bytes of ``device`` memory the pristine copies may take by default (free minus the margin); None for the
    CPU or an unknown device (then host RAM rules apply)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(device)
    return max(0, int(free) - max(DEVICE_MARGIN_MIN, int(DEVICE_MARGIN_FRACTION * total)))


def _gib(n: int | float) -> str:
    return f"{n / 2**30:.1f} GiB"


class PristineStore:
    """Pristine copies keyed by module path (see the module docstring for placements and the budget)."""

    def __init__(self, spill_dir: str | Path | None = None, *, prefer: str = "auto", device_budget: int | None = None,
                 available_ram: Callable[[], int | None] = _available_ram,
                 free_disk: Callable[[Path], int] | None = None,
                 free_device: Callable[[torch.device], int | None] = free_device_memory) -> None:
        if prefer not in PLACEMENTS:
            raise ValueError(f"prefer must be one of {', '.join(PLACEMENTS)}, got {prefer!r}")
        self.prefer = prefer
        self.device_budget = device_budget
        self._spill_root = Path(spill_dir or os.environ.get("H3APP_PRISTINE_DIR") or tempfile.gettempdir())
        self._spill_dir: Path | None = None
        self._available_ram = available_ram
        self._free_disk = free_disk or (lambda path: shutil.disk_usage(path).free)
        self._free_device = free_device
        self._device: dict[str, torch.Tensor] = {}
        self._ram: dict[str, torch.Tensor] = {}
        self._disk: dict[str, tuple[Path, object]] = {}
        self._where = "ram"

    def set_placement(self, prefer: str, device_budget: int | None = None) -> None:
        """Change the placement rule (and the device budget, bytes; None = free device memory minus the margin) for
        copies made from now on; refused while copies are held (switch to unmerged mode first)."""
        if prefer not in PLACEMENTS:
            raise H3AppError(f"pristine placement must be one of {', '.join(PLACEMENTS)}, got {prefer!r}.")
        if device_budget is not None and (isinstance(device_budget, bool) or int(device_budget) < 0):
            raise H3AppError(f"the pristine device budget must be a number of bytes >= 0, got {device_budget!r}.")
        if len(self):
            raise H3AppError("the pristine placement cannot change while merged weights are in place: switch to "
                             "unmerged mode first.")
        self.prefer = prefer
        self.device_budget = None if device_budget is None else int(device_budget)

    def __contains__(self, key: str) -> bool:
        return key in self._device or key in self._ram or key in self._disk

    def __len__(self) -> int:
        return len(self._device) + len(self._ram) + len(self._disk)

    @property
    def ram_bytes(self) -> int:
        return sum(t.nbytes for t in self._ram.values())

    @property
    def device_bytes(self) -> int:
        return sum(t.nbytes for t in self._device.values())

    @property
    def disk_keys(self) -> tuple[str, ...]:
        return tuple(self._disk)

    def placement(self, key: str) -> str:
        """``device``, ``ram`` or ``disk`` for a held copy."""
        return "device" if key in self._device else "ram" if key in self._ram else "disk"

    # ------------------------------------------------------------------------------------------------ choice
    def reserve(self, need_bytes: int, device: torch.device | str | None = None) -> str:
        """Choose the placement of ``need_bytes`` more of copies of weights on ``device``; raise ``H3AppError`` with
        the reason when the forced (or every) placement is too small."""
        if need_bytes <= 0:
            return self._where
        device = torch.device(device if device is not None else "cpu")
        if self.prefer in ("auto", "device"):
            room = self._device_room(device)
            if room is not None and need_bytes <= room:
                self._where = "device"
                return "device"
            if self.prefer == "device":
                raise H3AppError(
                    f"merged mode: the pristine weights need {_gib(need_bytes)} on {device} but its budget leaves "
                    f"{_gib(room or 0)}: raise the device budget, or keep the copies in host RAM (placement ram).")
        ram_margin = max(2 << 30, int(0.05 * (_total_ram() or 0)))
        available = self._available_ram()
        ram_ok = available is None or available - need_bytes >= ram_margin
        if self.prefer == "ram" or (self.prefer == "auto" and ram_ok):
            if not ram_ok:
                raise H3AppError(
                    f"merged mode needs {_gib(need_bytes)} of host RAM for the pristine weights but only "
                    f"{_gib(available or 0)} is free: use unmerged mode, or free RAM.")
            self._where = "ram"
            return "ram"
        self._spill_root.mkdir(parents=True, exist_ok=True)
        free = self._free_disk(self._spill_root)
        if free - need_bytes < (1 << 30):
            ram_text = "unknown" if available is None else _gib(available)
            raise H3AppError(
                f"merged mode needs {_gib(need_bytes)} for the pristine weights, but host RAM (free {ram_text}) and "
                f"{self._spill_root} (free {_gib(free)}) are both too small: use unmerged mode, or point "
                f"H3APP_PRISTINE_DIR at a disk with room.")
        self._where = "disk"
        return "disk"

    def _device_room(self, device: torch.device) -> int | None:
        """Bytes the copies may still take on ``device``; None when the device placement does not apply (auto on
        the CPU, where it is the RAM placement)."""
        if device.type == "cpu":
            if self.prefer != "device":
                return None
            available = self._available_ram()
            return None if available is None else available - max(2 << 30, int(0.05 * (_total_ram() or 0)))
        if self.device_budget is not None:
            return int(self.device_budget) - self.device_bytes
        return self._free_device(device)

    # -------------------------------------------------------------------------------------------- copies
    def put(self, key: str, weight: torch.Tensor) -> None:
        """Copy ``weight`` (bitwise) to the placement ``reserve`` chose. The key appears only once the copy is
        complete."""
        if key in self:
            return
        if weight.is_meta:
            raise H3AppError("merged mode needs real weights, but the transformer is on the meta device: use unmerged mode.")
        if self._where == "device":
            self._device[key] = weight.detach().clone()
            return
        if self._where == "ram":
            pinned = weight.device.type == "cuda"
            copy = torch.empty(weight.shape, dtype=weight.dtype, device="cpu", pin_memory=pinned)
            copy.copy_(weight.detach())
            self._ram[key] = copy
            return
        from safetensors import safe_open
        from safetensors.torch import save_file

        if self._spill_dir is None:
            self._spill_dir = Path(tempfile.mkdtemp(prefix="h3app-pristine-", dir=self._spill_root))
            weakref.finalize(self, shutil.rmtree, str(self._spill_dir), True)
        path = self._spill_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", key) + ".safetensors")
        save_file({"weight": weight.detach().to("cpu").contiguous()}, str(path))
        handle = safe_open(str(path), framework="pt", device="cpu")
        self._disk[key] = (path, handle)

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of the pristine weight, where the copy lives (a view, or read from the map)."""
        if key in self._device:
            return self._device[key][start:stop]
        if key in self._ram:
            return self._ram[key][start:stop]
        _, handle = self._disk[key]
        return handle.get_slice("weight")[start:stop]  # type: ignore[attr-defined]

    def fp32_chunks(self, key: str, step: int, device: torch.device) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(start, stop, rows)`` for every ``step`` rows: a fresh fp32 copy of the pristine rows on ``device``,
        the caller's to add into. A pinned host copy bound for an accelerator is streamed: chunk ``i + 1`` is copied
        on a side stream while the caller works on chunk ``i``."""
        total = self._shape(key)[0]
        if key in self._ram and device.type == "cuda" and self._ram[key].is_pinned():
            yield from self._streamed(self._ram[key], step, device)
            return
        for start in range(0, total, step):
            stop = min(start + step, total)
            yield start, stop, self.rows(key, start, stop).to(device=device, dtype=torch.float32, copy=True)

    @staticmethod
    def _streamed(source: torch.Tensor, step: int, device: torch.device
                  ) -> Iterator[tuple[int, int, torch.Tensor]]:
        total = source.shape[0]
        compute = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)

        def issue(start: int) -> tuple[int, int, torch.Tensor, torch.cuda.Event]:
            stop = min(start + step, total)
            with torch.cuda.stream(side):
                raw = source[start:stop].to(device, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(side)
            return start, stop, raw, ready

        pending: tuple[int, int, torch.Tensor, torch.cuda.Event] | None = issue(0)
        while pending is not None:
            start, stop, raw, ready = pending
            compute.wait_event(ready)
            raw.record_stream(compute)  # allocated on the side stream, consumed on the compute stream
            pending = issue(stop) if stop < total else None
            yield start, stop, raw.to(torch.float32, copy=True)

    def _shape(self, key: str) -> tuple[int, ...]:
        if key in self._device:
            return tuple(self._device[key].shape)
        if key in self._ram:
            return tuple(self._ram[key].shape)
        _, handle = self._disk[key]
        return tuple(handle.get_slice("weight").get_shape())  # type: ignore[attr-defined]

    def full(self, key: str) -> torch.Tensor:
        if key in self._device:
            return self._device[key]
        if key in self._ram:
            return self._ram[key]
        _, handle = self._disk[key]
        return handle.get_tensor("weight")  # type: ignore[attr-defined]

    def pop(self, key: str) -> None:
        if key in self._device:
            del self._device[key]
        elif key in self._ram:
            del self._ram[key]
        elif key in self._disk:
            path, _ = self._disk.pop(key)
            path.unlink(missing_ok=True)
