"""Every lazykern kernel class combines lazily: ``kernel * other`` and ``kernel + other`` are one
formula for ``K(X, Z)`` as well as ``K(X, X)``, checked per class (a kernel class exported without
an entry here fails the first test), and a group-additive product at N = M = 20,000 stays lazy.

``GroupAdditiveKernel`` lacked the mixin that makes ``*`` lazykern's ``ProductKernel``: GPyTorch's
then formed ``K(X, Z)`` densely (3.2 GB at 20,000 points in float64), with no warning.
"""

from __future__ import annotations

import gpytorch
import pytest
import torch

import lazykern
from lazykern import settings
from lazykern.operators import LazyKernelOperator

from . import reference_interactions as ref
from .memory import peak_rss_increase_mb
from .test_kernels import assert_close

F64 = torch.float64
D = 3

FACTORIES = {
    "RBFKernel": lambda: lazykern.RBFKernel(ard_num_dims=D),
    "MaternKernel": lambda: lazykern.MaternKernel(nu=2.5, ard_num_dims=D),
    "RQKernel": lambda: lazykern.RQKernel(),
    "PeriodicKernel": lambda: lazykern.PeriodicKernel(),
    "AdditiveStructureKernel": lambda: lazykern.AdditiveStructureKernel(lazykern.RBFKernel(ard_num_dims=D), D),
    "NewtonGirardAdditiveKernel": lambda: lazykern.NewtonGirardAdditiveKernel(lazykern.RBFKernel(), D, 2),
    "OrthogonalAdditiveKernel": lambda: lazykern.OrthogonalAdditiveKernel(D, 2),
    "GroupAdditiveKernel": lambda: lazykern.GroupAdditiveKernel(lazykern.RBFKernel(), [(0, 1), (1, 2)]),
    "ProductKernel": lambda: lazykern.RBFKernel() * lazykern.PeriodicKernel(),
    "ProjectedAdditiveKernel": lambda: lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), D, 4),
}


def test_every_exported_kernel_class_is_checked():
    exported = {name for name in lazykern.kernels.__all__
                if isinstance(getattr(lazykern.kernels, name), type)
                and issubclass(getattr(lazykern.kernels, name), gpytorch.kernels.Kernel)}
    assert exported == set(FACTORIES)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_products_and_sums_with_any_lazykern_kernel_stay_one_formula(name):
    kernel, other = FACTORIES[name]().double(), lazykern.MaternKernel(nu=1.5).double()
    assert isinstance(kernel, getattr(lazykern.kernels, name))
    x, z = torch.randn(15, D, dtype=F64), torch.randn(11, D, dtype=F64)
    v = torch.randn(11, 2, dtype=F64)
    with settings.max_dense_bytes(0):
        first, second = kernel(x, z).to_dense(), other(x, z).to_dense()
        for combined, expected in ((kernel * other, first * second), (kernel + other, first + second)):
            op = combined(x, z).evaluate_kernel()
            assert isinstance(op, LazyKernelOperator), f"{type(combined).__name__} gave {type(op).__name__}"
            assert_close(op @ v, expected @ v)


def test_group_product_equals_the_dense_reference():
    base = lazykern.RBFKernel(ard_num_dims=4).double()
    base.lengthscale = torch.tensor([[0.6, 0.9, 1.2, 1.5]], dtype=F64)
    groups = [(0, 1), (1, 2, 3)]
    group = lazykern.GroupAdditiveKernel(base, groups, component_scales=True).double()
    group.component_scales = torch.tensor([[0.7, 1.3]], dtype=F64)
    rbf = lazykern.RBFKernel().double()
    rbf.lengthscale = torch.tensor(0.8, dtype=F64)
    x, z = torch.randn(20, 4, dtype=F64), torch.randn(13, 4, dtype=F64)
    v = torch.randn(13, 3, dtype=F64)
    expected = ref.group("rbf", x, z, base.lengthscale, groups, group.component_scales)
    expected = expected * torch.exp(-0.5 * ((x[:, None] - z[None]) / 0.8).square().sum(-1))
    with settings.max_dense_bytes(0):
        assert_close((group * rbf)(x, z) @ v, expected @ v)


@pytest.mark.slow
def test_group_product_at_20000_points_stays_lazy():
    """K(X, Z) alone would be 20,000 x 20,000 float32 numbers: 1.6 GB."""
    setup = """
import torch, lazykern
from lazykern import settings
torch.manual_seed(0)
group = lazykern.GroupAdditiveKernel(lazykern.RBFKernel(ard_num_dims=4), [(0, 1), (1, 2, 3)])
kernel = group * lazykern.RBFKernel()
x, z, v = torch.randn(20_000, 4), torch.randn(20_000, 4), torch.randn(20_000, 1)
with settings.max_dense_bytes(0), torch.no_grad():
    kernel(x[:300], z[:300]) @ v[:300]  # compiles, lazy imports
"""
    body = """
with settings.max_dense_bytes(0), torch.no_grad():
    out = kernel(x, z) @ v
assert out.shape == (20_000, 1) and torch.isfinite(out).all()
"""
    increase = peak_rss_increase_mb(setup, body, timeout=600)
    print(f"peak RSS increase: {increase:.0f} MB")
    assert increase < 100, f"peak RSS grew by {increase:.0f} MB"


def test_every_lazykern_kernel_has_the_one_forward_and_lazy_products():
    """One base: each exported kernel (groups included) runs :class:`LazyKernel`'s ``forward``
    (ProductKernel, a combination, has its own) and builds lazykern's ``ProductKernel`` for ``*``."""
    from lazykern.kernels.base import LazyKernel
    from lazykern.kernels.combination import LazyKernelMixin

    for name in FACTORIES:
        cls = getattr(lazykern.kernels, name)
        assert issubclass(cls, LazyKernelMixin), name
        if name != "ProductKernel":
            assert issubclass(cls, LazyKernel) and cls.forward is LazyKernel.forward, name


class _HalfRBF(lazykern.kernels.base.LazyKernel):
    """A kernel written only through the base's hooks: k(x, z) = exp(-|x - z|^2 / 8)."""

    formula = lazykern.formulas.StationaryFormula("rbf")

    def formula_arguments(self, x1, x2):
        return x1 / 2, x2 / 2, {}

    def _input_spec(self):
        return 2, "num_dims", F64


def test_a_new_kernel_gets_forward_checks_and_lazy_products_from_the_base():
    kernel = _HalfRBF()
    x, z = torch.randn(9, 2, dtype=F64), torch.randn(7, 2, dtype=F64)
    expected = torch.exp(-((x[:, None, :] - z[None, :, :]) ** 2).sum(-1) / 8)
    rbf = lazykern.RBFKernel().double()
    rbf.lengthscale = torch.tensor(0.7, dtype=F64)
    other = torch.exp(-0.5 * ((x[:, None, :] - z[None, :, :]) ** 2).sum(-1) / 0.49)
    v = torch.randn(7, 1, dtype=F64)
    with settings.engine("torch"), settings.max_dense_bytes(0):
        assert_close(kernel(x, z).to_dense(), expected)
        assert_close(kernel(x, x, diag=True), torch.ones(9, dtype=F64))
        product = (kernel * rbf)(x, z).evaluate_kernel()
        assert isinstance(product, LazyKernelOperator)
        assert_close(product @ v, (expected * other) @ v)
    with pytest.raises(ValueError, match=r"expects 2 \(num_dims=2\)"):
        kernel(torch.randn(9, 3, dtype=F64)).to_dense()
    with pytest.raises(ValueError, match="_HalfRBF does not take last_dim_is_batch"):
        kernel.forward(x, z, last_dim_is_batch=True)
