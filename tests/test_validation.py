"""Bad input: a named ValueError/TypeError before any KeOps compile, and nothing changed."""

from __future__ import annotations

import gpytorch
import pytest
import torch

import lazykern
from lazykern import backend


@pytest.fixture
def no_reduction(monkeypatch):
    """Fail loudly if any reduction (hence any KeOps compile) starts."""

    def boom(*args, **kwargs):
        raise AssertionError("a reduction ran before validation")

    for name in ("pairwise_matmul", "pairwise_dense", "elementwise"):
        monkeypatch.setattr(backend, name, boom)


def additive(d=3, **kw):
    return lazykern.AdditiveStructureKernel(lazykern.RBFKernel(ard_num_dims=d), num_dims=d, **kw)


X = torch.randn(10, 3)


@pytest.mark.parametrize(
    "kernel, x1, x2, error, match",
    [
        (additive(), torch.randn(10, 4), torch.randn(10, 4), ValueError, "num_dims=3"),
        (lazykern.RBFKernel(ard_num_dims=3), torch.randn(10, 2), torch.randn(10, 2), ValueError, "ard_num_dims=3"),
        (additive(), X, torch.randn(10, 2), ValueError, "same number of features"),
        (additive(), X.bool(), X, TypeError, "x1 must hold real numbers"),
        (additive(), X, X.to(torch.complex64), TypeError, "x2 must hold real numbers"),
        (additive().half(), X.half(), X.half(), TypeError, "float32 or float64"),
        (additive(), torch.full((10, 3), float("nan")), X, ValueError, "x1 contains NaN"),
        (additive(), X, torch.full((10, 3), float("inf")), ValueError, "x2 contains NaN or infinite"),
        (additive(), torch.empty(0, 3), X, ValueError, "x1 must not be empty"),
    ],
)
def test_bad_inputs_raise_named_errors(no_reduction, kernel, x1, x2, error, match):
    state = {k: v.clone() for k, v in kernel.state_dict().items()}
    with pytest.raises(error, match=match):
        kernel.forward(x1, x2)
    assert all(torch.equal(state[k], v) for k, v in kernel.state_dict().items())


def test_bad_inputs_through_gpytorch_call_and_diag(no_reduction):
    kernel = gpytorch.kernels.ScaleKernel(additive())
    with pytest.raises(ValueError, match="num_dims=3"):
        kernel(torch.randn(10, 4), diag=True)
    with pytest.raises(ValueError, match="num_dims=3"):
        kernel(torch.randn(10, 4)).to_dense()


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: lazykern.AdditiveStructureKernel(gpytorch.kernels.LinearKernel(), 3), TypeError, "base_kernel must be"),
        (lambda: lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), 0), ValueError, "num_dims"),
        (lambda: lazykern.AdditiveStructureKernel(lazykern.RBFKernel(ard_num_dims=4), 3), ValueError, "ard_num_dims"),
        (lambda: lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), 3, active_dims=(0, 1)), ValueError, "active_dims"),
        (lambda: lazykern.AdditiveStructureKernel(lazykern.RBFKernel(active_dims=(0,)), 1), ValueError, "active_dims"),
        (lambda: lazykern.MaternKernel(nu=2.0), ValueError, "nu must be one of"),
    ],
)
def test_bad_constructor_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_last_dim_is_batch_is_refused(no_reduction):
    with pytest.raises(ValueError, match="AdditiveStructureKernel"):
        lazykern.RBFKernel()(X, X, last_dim_is_batch=True).to_dense()


def test_settings_validate():
    with pytest.raises(ValueError, match="engine"):
        lazykern.settings.engine("cuda")
    with pytest.raises(ValueError, match="max_dense_bytes"):
        lazykern.settings.max_dense_bytes(-1)


def test_settings_name_the_setting_and_the_expected_int():
    for setting, bad, expected in ((lazykern.settings.keops_min_size, -1, "a non-negative int"),
                                   (lazykern.settings.max_dense_bytes, 1.5, "a non-negative int"),
                                   (lazykern.settings.chunk_bytes, 0, "a positive int"),
                                   (lazykern.settings.keops_min_size, True, "a non-negative int")):
        # A set value to compare with: max_dense_bytes' default is a share of the memory available
        # now, which other processes move between two reads.
        setting.set_global(4096)
        try:
            with pytest.raises(ValueError, match=f"lazykern.settings.{setting.__name__} must be {expected}, got"):
                setting(bad)
            with pytest.raises(ValueError, match=f"lazykern.settings.{setting.__name__} must be"):
                setting.set_global(bad)
            assert setting.value() == 4096
        finally:
            setting.set_global(None)


@pytest.mark.parametrize(
    "check, error, match",
    [
        (lambda v: v.check_non_negative_int("n", -1), ValueError, "n must be a non-negative int, got -1"),
        (lambda v: v.check_non_negative_int("n", False), ValueError, "n must be a non-negative int, got False"),
        (lambda v: v.check_non_negative_int("n", "3", optional=True), ValueError,
         "n must be a non-negative int or None, got '3'"),
        (lambda v: v.check_positive_int_at_most("r", 0, 4, "num_dims=4"), ValueError, "r must be a positive int, got 0"),
        (lambda v: v.check_positive_int_at_most("r", 5, 4, "num_dims=4"), ValueError, "r must be at most num_dims=4, got 5"),
        (lambda v: v.check_choice("nu", 1, (0.5, 1.5)), ValueError, r"nu must be one of \(0.5, 1.5\), got 1"),
        (lambda v: v.check_choice("measure", "u", ("gaussian",)), ValueError, "measure must be 'gaussian', got 'u'"),
        (lambda v: v.check_per_dimension("m", [1.0, 2.0], 3, dtype=torch.float64), ValueError,
         r"m must be a number or 3 numbers \(one per dimension\), got shape \(2,\)"),
        (lambda v: v.check_per_dimension("m", float("nan"), 3, dtype=torch.float64), ValueError, "m must be finite"),
        (lambda v: v.check_per_dimension("s", [1.0, -1.0], 2, dtype=torch.float64, positive=True), ValueError,
         r"s must be positive, got \[1.0, -1.0\]"),
        (lambda v: v.check_index_groups("groups", "ab"), ValueError, "groups must be a non-empty sequence"),
        (lambda v: v.check_index_groups("groups", [(0,), ()]), ValueError, r"got group \(\)"),
        (lambda v: v.check_index_groups("groups", [(0, True)]), ValueError, r"got group \(0, True\)"),
        (lambda v: v.check_index_groups("groups", [(0, -1)]), ValueError, r"got group \(0, -1\)"),
        (lambda v: v.check_index_groups("groups", [[0, 1.0]]), ValueError, r"got group \[0, 1.0\]"),
    ],
)
def test_check_helpers_name_the_argument_and_what_was_expected(check, error, match):
    from lazykern import validation

    with pytest.raises(error, match=match):
        check(validation)


def test_check_helpers_return_what_they_accept():
    from lazykern import validation

    assert validation.check_non_negative_int("n", 0) == 0
    assert validation.check_non_negative_int("n", None, optional=True) is None
    assert validation.check_positive_int_at_most("r", 4, 4, "num_dims=4") == 4
    assert validation.check_choice("nu", 1.5, (0.5, 1.5)) == 1.5
    value = validation.check_per_dimension("m", torch.tensor([1.0, 2.0]), 2, dtype=torch.float64, positive=True)
    assert value.dtype == torch.float64 and value.tolist() == [[1.0, 2.0]]
    assert validation.check_index_groups("groups", [[2], range(2)]) == ((2,), (0, 1))


def test_matern_nu_is_checked_once_where_the_formula_is_built(no_reduction):
    """lazykern's MaternKernel refuses a bad nu at construction; GPyTorch's, whose nu is a plain
    attribute, when the formula is built, before any reduction: both by the formula's one check."""
    with pytest.raises(ValueError, match=r"nu must be one of \(0.5, 1.5, 2.5\), got 2.0"):
        lazykern.formulas.StationaryFormula("matern", nu=2.0)
    base = gpytorch.kernels.MaternKernel(nu=1.5)
    base.nu = 2.0
    with pytest.raises(ValueError, match=r"nu must be one of \(0.5, 1.5, 2.5\), got 2.0"):
        lazykern.AdditiveStructureKernel(base, num_dims=3)
    mixed = lazykern.RBFKernel() * lazykern.MaternKernel()
    mixed.kernels[1].nu = 3.5
    with pytest.raises(ValueError, match="nu must be one of"):
        mixed(X, X).to_dense()


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: lazykern.GroupAdditiveKernel(lazykern.RBFKernel(active_dims=(0,)), [(0,)]),
         "pass active_dims to GroupAdditiveKernel instead"),
        (lambda: lazykern.NewtonGirardAdditiveKernel(lazykern.RBFKernel(active_dims=(0,)), 2),
         "pass active_dims to NewtonGirardAdditiveKernel instead"),
        (lambda: lazykern.GroupAdditiveKernel(lazykern.RBFKernel(), [(0,)], num_dims=2, active_dims=(0, 1, 2)),
         "active_dims has 3 entries but num_dims=2"),
        (lambda: lazykern.GroupAdditiveKernel(lazykern.RBFKernel(), [(0,)], num_dims=0), "num_dims must be a positive int"),
        (lambda: lazykern.GroupAdditiveKernel(lazykern.RBFKernel(), [(0, True)]), r"got group \(0, True\)"),
        (lambda: lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), component_scales=True),
         "component_scales=True needs num_dims"),
        (lambda: lazykern.OrthogonalAdditiveKernel(2, measure_std=[1.0, float("inf")]), "measure_std must be finite"),
        (lambda: lazykern.OrthogonalAdditiveKernel(2, measure_std=[1.0, -2.0]), "measure_std must be positive"),
    ],
)
def test_sum_kernels_share_one_constructor_check(build, match):
    with pytest.raises(ValueError, match=match):
        build()
