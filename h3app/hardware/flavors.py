"""The boxes a plan is judged against: every GPU flavor Hugging Face rents, with its GPUs, host RAM and price.

Source: Hugging Face's published hardware tables (hub-docs ``docs/hub/jobs-configuration.md``, the output of
``hf jobs hardware``, and ``docs/hub/spaces-gpus.md``): GPU memory, vCPUs, host RAM and $/h per flavor, GB = 10⁹
bytes. ``space_hardware`` is the flavor's ``huggingface_hub.SpaceHardware`` value (None for the Jobs-only ``h200*``
boxes). Spaces removed the H100 flavors in December 2025; none are listed.

ZeroGPU (hub-docs ``docs/hub/spaces-zerogpu.md``) runs on RTX Pro 6000 Blackwell cards: ``@spaces.GPU`` size
``large`` (the default) is half a card, 48 GB; ``xlarge`` the whole card, 96 GB, at twice the quota. Hugging Face
publishes no host RAM and no hourly price for it (it is part of a subscription), so those are None here; with no
price to compare it is judged but never recommended (h3app runs there: docs/hardware.md, ZeroGPU).

Context parallel (``--ulysses``/``--ring``) splits activations over the GPUs of one box but not weights: each GPU
holds the whole transformer, so a multi-GPU flavor fits what one of its GPUs fits, with 1/N of the activations.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import H3AppError

GB = 10**9


@dataclass(frozen=True)
class Flavor:
    """One kind of box: ``gpus`` × ``gpu_bytes`` of device memory, ``host_bytes`` of RAM, ``vcpus``, at
    ``usd_per_hour`` (None: not sold by the hour). ``zero_gpu``: a ZeroGPU size, granted per decorated call."""

    name: str
    gpu: str
    gpus: int
    gpu_bytes: int
    host_bytes: int | None
    vcpus: int | None
    usd_per_hour: float | None
    space_hardware: str | None
    zero_gpu: bool = False

    @property
    def label(self) -> str:
        count = f"{self.gpus}× " if self.gpus > 1 else ""
        return f"{self.name} ({count}{self.gpu} {self.gpu_bytes / GB:.0f} GB)"


# The published table, one row per flavor: name, GPU, GPUs, GB per GPU, vCPUs, host RAM GB, $/h, Spaces flavor?
_TABLE: tuple[tuple[str, str, int, int, int, int, float, bool], ...] = (
    ("t4-small", "T4", 1, 16, 4, 15, 0.40, True),
    ("t4-medium", "T4", 1, 16, 8, 30, 0.60, True),
    ("a10g-small", "A10G", 1, 24, 4, 15, 1.00, True),
    ("a10g-large", "A10G", 1, 24, 12, 46, 1.50, True),
    ("a10g-largex2", "A10G", 2, 24, 24, 92, 3.00, True),
    ("a10g-largex4", "A10G", 4, 24, 48, 184, 5.00, True),
    ("l4x1", "L4", 1, 24, 8, 30, 0.80, True),
    ("l4x4", "L4", 4, 24, 48, 186, 3.80, True),
    ("l40sx1", "L40S", 1, 48, 8, 62, 1.80, True),
    ("l40sx4", "L40S", 4, 48, 48, 382, 8.30, True),
    ("l40sx8", "L40S", 8, 48, 192, 1534, 23.50, True),
    ("a100-large", "A100", 1, 80, 12, 142, 2.50, True),
    ("a100x4", "A100", 4, 80, 48, 568, 10.00, True),
    ("a100x8", "A100", 8, 80, 96, 1136, 20.00, True),
    ("rtx-pro-6000", "RTX PRO 6000", 1, 96, 23, 256, 2.75, True),
    ("rtx-pro-6000x2", "RTX PRO 6000", 2, 96, 46, 512, 5.50, True),
    ("rtx-pro-6000x4", "RTX PRO 6000", 4, 96, 92, 1024, 11.00, True),
    ("rtx-pro-6000x8", "RTX PRO 6000", 8, 96, 184, 2048, 22.00, True),
    ("h200", "H200", 1, 141, 23, 256, 5.00, False),
    ("h200x2", "H200", 2, 141, 46, 512, 10.00, False),
    ("h200x4", "H200", 4, 141, 92, 1024, 20.00, False),
    ("h200x8", "H200", 8, 141, 184, 2048, 40.00, False),
)
ZERO_GPU_SPACE_HARDWARE = "zero-a10g"  # the one SpaceHardware value of ZeroGPU (the name is historic)
# ZeroGPU sizes: @spaces.GPU(size=...) → GB of the RTX Pro 6000 Blackwell it grants.
ZERO_GPU_SIZES = {"large": 48, "xlarge": 96}

FLAVORS: tuple[Flavor, ...] = (
    *(Flavor(name, gpu, gpus, gb * GB, ram * GB, vcpus, price, name if space else None)
      for name, gpu, gpus, gb, vcpus, ram, price, space in _TABLE),
    *(Flavor(f"zero-gpu-{size}", "ZeroGPU RTX Pro 6000", 1, gb * GB, None, None, None, ZERO_GPU_SPACE_HARDWARE,
             zero_gpu=True) for size, gb in ZERO_GPU_SIZES.items()),
)
BY_NAME = {flavor.name: flavor for flavor in FLAVORS}
# Cheapest first, then least memory per GPU: ``recommended`` is the first of these that fits.
BY_PRICE: tuple[Flavor, ...] = tuple(sorted((f for f in FLAVORS if f.usd_per_hour is not None and not f.zero_gpu),
                                            key=lambda f: (f.usd_per_hour, f.gpu_bytes, f.gpus)))


def flavor(name: str) -> Flavor:
    """The flavor called ``name``; ``H3AppError`` naming the choices otherwise."""
    try:
        return BY_NAME[name.lower()]
    except KeyError:
        raise H3AppError(f"unknown hardware {name!r}: use one of {', '.join(BY_NAME)}.") from None


def detected(gpu_name: str, total_bytes: int, host_bytes: int | None = None) -> Flavor:
    """A flavor for a GPU seen at run time (``torch.cuda.get_device_properties``): its memory as reported."""
    return Flavor("detected", gpu_name, 1, int(total_bytes), host_bytes, None, None, None)
