"""compute_lora_delta (2D and stacked 3D) and stack_group_factors: values, layout, padding, errors."""

import pytest
import torch

from h3app.lora.delta import compute_lora_delta, stack_group_factors


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_2d_delta_is_x_At_Bt_times_scale():
    x, A, B = _rand(3, 5, 7, seed=1), _rand(4, 7, seed=2), _rand(6, 4, seed=3)
    got = compute_lora_delta(x, A, B, scale=0.25)
    assert got.shape == (3, 5, 6)
    torch.testing.assert_close(got, 0.25 * (x @ A.T @ B.T), rtol=1e-12, atol=1e-12)


def test_stacked_delta_is_group_major_hand_example():
    # x = [2, 3]; group 0 reads x0 and writes [1, 2]·x0, group 1 reads x1 and writes [3, 4]·x1.
    x = torch.tensor([[2.0, 3.0]])
    A = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # [g=2, r=1, in=2]
    B = torch.tensor([[[1.0], [2.0]], [[3.0], [4.0]]])  # [g=2, out_g=2, r=1]
    assert compute_lora_delta(x, A, B).tolist() == [[2.0, 4.0, 9.0, 12.0]]
    assert compute_lora_delta(x, A, B, group_scales=torch.tensor([1.0, -0.5])).tolist() == [[2.0, 4.0, -4.5, -6.0]]


def test_stacked_delta_equals_concatenated_2d_deltas_with_group_scales():
    x = _rand(2, 9, 11, seed=4)
    pairs = [(_rand(3, 11, seed=10 + g), _rand(5, 3, seed=20 + g)) for g in range(3)]
    scales = torch.tensor([0.5, 2.0, -1.0], dtype=torch.float64)
    A = torch.stack([a for a, _ in pairs])
    B = torch.stack([b for _, b in pairs])
    got = compute_lora_delta(x, A, B, group_scales=scales, scale=3.0)
    want = torch.cat([3.0 * s * compute_lora_delta(x, a, b) for (a, b), s in zip(pairs, scales)], dim=-1)
    assert got.shape == (2, 9, 15)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_unequal_ranks_zero_padded_and_uncovered_group_zero_filled():
    x = _rand(6, 8, seed=5)
    q = (_rand(2, 8, seed=6), _rand(4, 2, seed=7))
    v = (_rand(5, 8, seed=8), _rand(4, 5, seed=9))
    A, B = stack_group_factors([q, None, v], out_features_per_group=4, in_features=8, dtype=torch.float64, device="cpu")
    assert A.shape == (3, 5, 8) and B.shape == (3, 4, 5)
    got = compute_lora_delta(x, A, B)
    torch.testing.assert_close(got[:, :4], compute_lora_delta(x, *q), rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(got[:, 4:8]) == 0  # k not covered: exactly zero
    torch.testing.assert_close(got[:, 8:], compute_lora_delta(x, *v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "A_shape,B_shape,x_features,kwargs,needle",
    [
        ((4, 7), (6, 4), 5, {}, "input has 5 features but A (4, 7) expects in_features=7"),
        ((4, 7), (6, 3), 7, {}, "rank mismatch: A (4, 7) has rank 4 but B (6, 3) has rank 3"),
        ((3, 4, 7), (2, 6, 4), 7, {}, "group count mismatch: A (3, 4, 7) has 3 groups but B (2, 6, 4) has 2"),
        ((4, 7), (3, 6, 4), 7, {}, "got A with 2 dims (4, 7) and B with 3 dims (3, 6, 4)"),
        ((3, 4, 7), (3, 6, 4), 7, {"group_scales": torch.ones(2)}, "group_scales has shape (2,) but the stack has 3 groups"),
        ((4, 7), (6, 4), 7, {"group_scales": torch.ones(1)}, "group_scales needs stacked 3D factors"),
    ],
)
def test_mismatches_name_the_dims(A_shape, B_shape, x_features, kwargs, needle):
    with pytest.raises(ValueError) as error:
        compute_lora_delta(torch.zeros(2, x_features), torch.zeros(A_shape), torch.zeros(B_shape), **kwargs)
    assert needle in str(error.value)


def test_stack_rejects_wrong_group_shapes_naming_the_group():
    good = (torch.zeros(2, 8), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="group 1: B \\(5, 2\\) has out_features 5, expected 4"):
        stack_group_factors([good, (torch.zeros(2, 8), torch.zeros(5, 2))], out_features_per_group=4, in_features=8,
                            dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="at least one covered group"):
        stack_group_factors([None, None], out_features_per_group=4, in_features=8, dtype=torch.float32, device="cpu")
