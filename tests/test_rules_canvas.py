"""The canvas rule is written once (``rules.canvas``): the CLI's check before torch and the loaded pipeline's
limits refuse the same canvas in the same words (only the flag's name differs)."""
import pytest

from h3app.backend.limits import Limits
from h3app.cli import build_parser
from h3app.commands.model_options import request_flags
from h3app.errors import H3AppError
from h3app.rules.canvas import check_canvas, largest_16_9
from h3app.rules.choices import REAL_REPO_ID
from h3app.rules.frames import RELEASED
from h3app.rules.request_defaults import FULL_DEFAULTS


def cli_refusal(height: int, width: int) -> str:
    args = build_parser().parse_args(["generate", "--model", REAL_REPO_ID, "--prompt", "x", "--out", "x.mp4",
                                      "--height", str(height), "--width", str(width)])
    with pytest.raises(H3AppError) as refused:
        request_flags(args, args.model)
    return str(refused.value)


@pytest.mark.parametrize(("height", "width"), [(100, 1344), (768, 1000), (1024, 1344), (32, 10**20)])
def test_the_cli_and_the_backend_refuse_a_canvas_in_the_same_words(height, width):
    full = FULL_DEFAULTS
    with pytest.raises(H3AppError) as backend:
        Limits(canvas_multiple=full.canvas_multiple, max_pixels=full.max_pixels, frames=RELEASED).check_canvas(
            height, width)
    cli = cli_refusal(height, width)
    assert cli.replace("--height", "height").replace("--width", "width") == str(backend.value)


def test_the_largest_hint_fits_the_rule():
    for multiple, max_pixels in ((32, 768 * 1344), (8, 64 * 96)):
        short, long = (int(side) for side in largest_16_9(multiple, max_pixels).split("×"))
        check_canvas(short, long, multiple, max_pixels)  # the hint itself is accepted
        assert 1.5 < long / short < 2.0 and (short + multiple) * long > max_pixels  # wide, and no taller one fits
