"""What each kernel family says about itself (LazyKernel's family methods), and family_of's
descriptions of GPyTorch's kernels: the answers initialisations, priors, random features and the
component analysis read instead of lists of kernel classes."""

from __future__ import annotations

import gpytorch
import pytest
import torch

import lazykern
from lazykern import backend
from lazykern.kernels import family_of

DTYPE = torch.float64


def _families() -> dict[str, gpytorch.kernels.Kernel]:
    rbf = lambda **kw: lazykern.RBFKernel(**kw)  # noqa: E731
    return {
        "ard": rbf(ard_num_dims=4),
        "additive": lazykern.AdditiveStructureKernel(rbf(ard_num_dims=4), num_dims=4, component_scales=True),
        "groups": lazykern.GroupAdditiveKernel(rbf(), groups=[(0, 1), (1, 2, 3)]),
        "orders": lazykern.NewtonGirardAdditiveKernel(rbf(ard_num_dims=4), num_dims=4, max_degree=3),
        "oak": lazykern.OrthogonalAdditiveKernel(num_dims=4, max_degree=2),
        "projected": lazykern.ProjectedAdditiveKernel(rbf(), num_dims=4, num_projections=6, input_lengthscales=True),
    }


#: name: (lengthscale_widths(4), variance_weights, component_axes, number of order variances)
ANSWERS = {
    "ard": ((4, 4, 4, 4), None, None, None),
    "additive": ((1, 1, 1, 1), ("component_scales", 4), "inputs", None),
    "groups": ((2, 3, 3, 3), ("component_scales", 2), None, None),
    "orders": ((3, 3, 3, 3), ("outputscale", 3), "inputs", 3),
    "oak": ((2, 2, 2, 2), ("outputscale", 2), "inputs", 2),
    "projected": ((1,) * 6, ("component_scales", 6), "projections", None),
}


@pytest.mark.parametrize("name", ANSWERS)
def test_each_family_answers_for_itself(name):
    kernel = _families()[name]
    widths, weights, axes, orders = ANSWERS[name]
    assert kernel.lengthscale_widths(4) == widths
    assert kernel.variance_weights == weights
    assert kernel.component_axes == axes
    assert (None if kernel.order_variances is None else kernel.order_variances.shape[-1]) == orders
    assert kernel.lengthscale_kernel is (kernel if name == "ard" else kernel.base_kernel)
    assert kernel.input_measure == ("gaussian" if name == "oak" else None)
    assert kernel.learns_projections is False
    module, attribute = kernel.per_input_lengthscale()
    assert getattr(module, attribute).shape[-1] == (1 if name == "groups" else 4)


@pytest.mark.parametrize("name", ["additive", "orders", "oak", "projected"])
def test_first_order_terms_are_the_first_order_part(name):
    """One matrix per component; for a first-order kernel (interaction kernels at max_degree=1)
    their sum is the kernel matrix, on the components' coordinates (a projected kernel's projections)."""
    if name in ("orders", "oak"):
        kernel = (lazykern.OrthogonalAdditiveKernel(num_dims=4, max_degree=1) if name == "oak" else
                  lazykern.NewtonGirardAdditiveKernel(lazykern.RBFKernel(ard_num_dims=4), num_dims=4, max_degree=1))
    else:
        kernel = _families()[name]
    kernel = kernel.double()
    if hasattr(kernel, "raw_component_scales"):
        count = kernel.component_scales.shape[-1]
        kernel.component_scales = torch.linspace(0.5, 2.0, count, dtype=DTYPE).unsqueeze(0)
    generator = torch.Generator().manual_seed(0)
    x, z = torch.randn(7, 4, dtype=DTYPE, generator=generator), torch.randn(5, 4, dtype=DTYPE, generator=generator)
    formula, u1, u2, params = kernel.first_order_terms(kernel.component_coordinates(x), kernel.component_coordinates(z))
    terms = backend.pairwise_dense(formula, u1, u2, params)
    count = 6 if name == "projected" else 4
    assert terms.shape == (count, 7, 5)
    torch.testing.assert_close(terms.sum(0), kernel(x, z).to_dense(), rtol=1e-10, atol=1e-12)
    with pytest.raises(TypeError, match="RBFKernel has no first-order components"):
        lazykern.RBFKernel().first_order_terms(x, z)


def test_projected_families_say_what_they_project():
    plain = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), num_dims=3, num_projections=4)
    module, attribute = plain.per_input_lengthscale()
    assert getattr(module, attribute) is None  # no input lengthscales: nothing per input
    learned = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), num_dims=3, num_projections=4,
                                               learn_projections=True)
    assert learned.learns_projections and not plain.learns_projections
    x = torch.randn(5, 3)
    assert torch.equal(learned.component_coordinates(x), learned.project(x))


def test_interaction_order_variances_are_its_outputscale():
    kernel = _families()["orders"]
    kernel.order_variances = torch.tensor([0.2, 0.3, 0.5])
    torch.testing.assert_close(kernel.outputscale.detach(), torch.tensor([0.2, 0.3, 0.5]))
    with pytest.raises(AttributeError):
        lazykern.RBFKernel().order_variances = torch.ones(1)


def test_family_of_describes_gpytorch_kernels_with_their_own_hyperparameters():
    lazy = lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), num_dims=3)
    scaled = gpytorch.kernels.ScaleKernel(lazy)
    assert family_of(scaled) == (lazy, scaled) and family_of(lazy) == (lazy, None)
    rbf = gpytorch.kernels.RBFKernel(ard_num_dims=3)
    family, scale = family_of(rbf)
    assert family.lengthscale_kernel is rbf and scale is None
    assert family.lengthscale_widths(3) == (3, 3, 3) and family.component_axes is None
    assert family.per_input_lengthscale() == (rbf, "lengthscale")
    assert rbf not in list(family.modules())  # a description owns nothing of what it describes
    base = gpytorch.kernels.MaternKernel(nu=2.5)
    family, _ = family_of(gpytorch.kernels.AdditiveStructureKernel(base, num_dims=3))
    assert family.lengthscale_kernel is base and family.lengthscale_widths(3) == (1, 1, 1)
    assert family.variance_weights == ("component_scales", 3) and not hasattr(family, "raw_component_scales")
    for other in (gpytorch.kernels.LinearKernel(), lazykern.RBFKernel() * lazykern.RBFKernel(), torch.nn.Identity()):
        assert family_of(other)[0] is None
