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
    usd_per_hour: float | None = None  # the published on-demand price of the box (None: not published here)

    @property
    def label(self) -> str:
        count = f"{self.gpus}× " if self.gpus > 1 else ""
        return f"{self.name} ({count}{self.gpu} {self.gpu_bytes / GB:.0f} GB)"


# One row per card Spaces rents: GPU, GB per GPU, and its flavors as Spaces names them → GPUs per box.
SPACE_CARDS: tuple[tuple[str, int, dict[str, int]], ...] = (
    ("T4", 16, {"t4-small": 1, "t4-medium": 1}),
    ("A10G", 24, {"a10g-small": 1, "a10g-large": 1, "a10g-largex2": 2, "a10g-largex4": 4}),
    ("L4", 24, {"l4x1": 1, "l4x4": 4}),
    ("L40S", 48, {"l40sx1": 1, "l40sx4": 4, "l40sx8": 8}),
    ("A100", 80, {"a100-large": 1, "a100x4": 4, "a100x8": 8}),
    ("RTX Pro 6000", 96, {"rtx-pro-6000": 1, "rtx-pro-6000x2": 2, "rtx-pro-6000x4": 4, "rtx-pro-6000x8": 8}),
)
# Hugging Face's published hourly prices (Spaces GPU table; h200 from the Jobs table), US dollars per box-hour.
USD_PER_HOUR = {"t4-small": 0.40, "t4-medium": 0.60, "a10g-small": 1.00, "a10g-large": 1.50, "a10g-largex2": 3.00,
                "a10g-largex4": 5.00, "l4x1": 0.80, "l4x4": 3.80, "l40sx1": 1.80, "l40sx4": 8.30, "l40sx8": 23.50,
                "a100-large": 2.50, "a100x4": 10.00, "a100x8": 20.00, "rtx-pro-6000": 2.75, "rtx-pro-6000x2": 5.50,
                "rtx-pro-6000x4": 11.00, "rtx-pro-6000x8": 22.00, "h200": 5.00}
# ZeroGPU: Hugging Face documents 70 GB of VRAM per workload (an H200 slice); the flavor value is historic.
ZERO_GPU = Flavor("zero-a10g", "ZeroGPU slice", 1, 70 * GB, "zero-a10g", zero_gpu=True)
# Cards people rent elsewhere: no Spaces value.
ELSEWHERE = (Flavor("h100", "H100", 1, 80 * GB, None),
             Flavor("h200", "H200", 1, 141 * GB, None, usd_per_hour=USD_PER_HOUR["h200"]))

# Ordered small to large: "recommended" is the first that fits (least memory per GPU, then fewest GPUs; a tie keeps
# the order above).
FLAVORS: tuple[Flavor, ...] = tuple(sorted(
    (*(Flavor(name, gpu, gpus, gb * GB, name, usd_per_hour=USD_PER_HOUR.get(name))
       for gpu, gb, boxes in SPACE_CARDS for name, gpus in boxes.items()),
     ZERO_GPU, *ELSEWHERE),
    key=lambda box: (box.gpu_bytes, box.gpus)))
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
