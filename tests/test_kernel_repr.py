"""``repr`` of lazykern's kernels shows their structure and hyperparameters (one hook, LazyKernel.extra_repr)."""

from __future__ import annotations

import gpytorch
import torch

import lazykern


def _first_line(kernel: gpytorch.kernels.Kernel) -> str:
    return repr(kernel).splitlines()[1].strip()


def test_additive_kernel_shows_dimensions_active_dims_and_learned_scales() -> None:
    kernel = lazykern.AdditiveStructureKernel(lazykern.RBFKernel(ard_num_dims=3), num_dims=3, active_dims=(0, 2, 5),
                                              component_scales=True)
    kernel.component_scales = torch.tensor([0.5, 1.0, 2.0])
    assert _first_line(kernel) == "num_dims=3, active_dims=[0, 2, 5], component_scales=[0.5, 1.0, 2.0]"
    assert "lengthscale=[0.6931, 0.6931, 0.6931]" in repr(kernel)  # the base kernel, as a child


def test_fixed_unit_scales_are_not_shown() -> None:
    kernel = lazykern.AdditiveStructureKernel(lazykern.MaternKernel(nu=1.5), num_dims=4)
    assert _first_line(kernel) == "num_dims=4"
    assert "nu=1.5, lengthscale=[0.6931]" in repr(kernel)


def test_interaction_kernels_show_orders_and_their_variances() -> None:
    newton_girard = lazykern.NewtonGirardAdditiveKernel(lazykern.RBFKernel(), num_dims=4, max_degree=2)
    assert _first_line(newton_girard) == "num_dims=4, max_degree=2, outputscale=[0.5, 0.5]"
    oak = lazykern.OrthogonalAdditiveKernel(num_dims=3, max_degree=3)
    assert _first_line(oak) == "num_dims=3, max_degree=3, input_measure='gaussian', outputscale=[0.3333, 0.3333, 0.3333]"


def test_group_kernel_shows_its_groups() -> None:
    kernel = lazykern.GroupAdditiveKernel(lazykern.RQKernel(), groups=[(0, 1), (2,)])
    assert _first_line(kernel) == "num_dims=3, groups=((0, 1), (2,))"
    assert "lengthscale=[0.6931], alpha=[0.6931]" in repr(kernel)


def test_long_and_batched_hyperparameters_say_their_shape() -> None:
    long = lazykern.RBFKernel(ard_num_dims=12)
    assert _first_line(long) == "lengthscale=[" + ", ".join(["0.6931"] * 8) + ", ...] (shape (1, 12))"
    batched = lazykern.PeriodicKernel(batch_shape=torch.Size([2]))
    assert _first_line(batched) == "lengthscale=[0.6931, 0.6931] (shape (2, 1, 1)), period_length=[0.6931, 0.6931] (shape (2, 1, 1))"


def test_repr_inside_scale_kernel() -> None:
    kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), num_dims=2))
    assert "(base_kernel): AdditiveStructureKernel(\n    num_dims=2\n" in repr(kernel)
