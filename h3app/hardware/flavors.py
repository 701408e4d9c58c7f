"""The GPU hardware a plan is judged against: every GPU flavor of huggingface_hub's ``SpaceHardware`` with its memory,
plus the two cards people rent elsewhere (``h100`` 80 GB, ``h200`` 141 GB).

Context parallel (``--ulysses``/``--ring``) splits activations over the GPUs of one box but not weights: each GPU
holds the whole transformer, so a multi-GPU flavor fits what one of its GPUs fits, with 1/N of the activations.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import H3AppError

GB = 10**9
GIB = 2**30


@dataclass(frozen=True)
class Flavor:
    """One kind of box: ``gpus`` × ``gpu_bytes`` of device memory. ``space`` is its ``SpaceHardware`` value (None
    for cards Spaces does not rent). ``zero_gpu``: a ZeroGPU slice, granted per decorated call."""

    name: str
    gpu: str
    gpus: int
    gpu_bytes: int
    space: str | None
    zero_gpu: bool = False

    @property
    def label(self) -> str:
        count = f"{self.gpus}× " if self.gpus > 1 else ""
        return f"{self.name} ({count}{self.gpu} {self.gpu_bytes / GB:.0f} GB)"


# Ordered small to large: "recommended" is the first that fits (least memory per GPU, then fewest GPUs).
FLAVORS: tuple[Flavor, ...] = (
    Flavor("t4-small", "T4", 1, 16 * GB, "t4-small"),
    Flavor("t4-medium", "T4", 1, 16 * GB, "t4-medium"),
    Flavor("a10g-small", "A10G", 1, 24 * GB, "a10g-small"),
    Flavor("a10g-large", "A10G", 1, 24 * GB, "a10g-large"),
    Flavor("l4x1", "L4", 1, 24 * GB, "l4x1"),
    Flavor("a10g-largex2", "A10G", 2, 24 * GB, "a10g-largex2"),
    Flavor("a10g-largex4", "A10G", 4, 24 * GB, "a10g-largex4"),
    Flavor("l4x4", "L4", 4, 24 * GB, "l4x4"),
    Flavor("l40sx1", "L40S", 1, 48 * GB, "l40sx1"),
    Flavor("l40sx4", "L40S", 4, 48 * GB, "l40sx4"),
    Flavor("l40sx8", "L40S", 8, 48 * GB, "l40sx8"),
    # ZeroGPU: Hugging Face documents 70 GB of VRAM per workload (an H200 slice); the flavor value is historic.
    Flavor("zero-a10g", "ZeroGPU slice", 1, 70 * GB, "zero-a10g", zero_gpu=True),
    Flavor("a100-large", "A100", 1, 80 * GB, "a100-large"),
    Flavor("h100", "H100", 1, 80 * GB, None),
    Flavor("a100x4", "A100", 4, 80 * GB, "a100x4"),
    Flavor("a100x8", "A100", 8, 80 * GB, "a100x8"),
    Flavor("rtx-pro-6000", "RTX Pro 6000", 1, 96 * GB, "rtx-pro-6000"),
    Flavor("rtx-pro-6000x2", "RTX Pro 6000", 2, 96 * GB, "rtx-pro-6000x2"),
    Flavor("rtx-pro-6000x4", "RTX Pro 6000", 4, 96 * GB, "rtx-pro-6000x4"),
    Flavor("rtx-pro-6000x8", "RTX Pro 6000", 8, 96 * GB, "rtx-pro-6000x8"),
    Flavor("h200", "H200", 1, 141 * GB, None),
)
BY_NAME = {flavor.name: flavor for flavor in FLAVORS}


def flavor(name: str) -> Flavor:
    """The flavor called ``name``; ``H3AppError`` naming the choices otherwise."""
    try:
        return BY_NAME[name.lower()]
    except KeyError:
        raise H3AppError(f"unknown hardware {name!r}: use one of {', '.join(BY_NAME)}.") from None


def detected(gpu_name: str, total_bytes: int) -> Flavor:
    """A flavor for a GPU seen at run time (``torch.cuda.get_device_properties``): its memory as reported."""
    return Flavor("detected", gpu_name, 1, int(total_bytes), None)
