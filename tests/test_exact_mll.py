"""ExactMLL against GPyTorch's ExactMarginalLogLikelihood: the same loss and gradients, the same failures."""

from __future__ import annotations

import gpytorch
import pytest
import torch
from linear_operator.utils.errors import NotPSDError

import lazykern
from lazykern.regression import ExactMLL
from lazykern.regression.likelihood import _CholeskyInvQuadLogdet

BATCH = torch.Size([2])


class _BatchGP(gpytorch.models.ExactGP):
    """A batch of two GPs on lazykern's compiled projected kernel, as a user builds one."""

    def __init__(self, x, y, likelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=BATCH)
        base = lazykern.MaternKernel(nu=2.5, batch_shape=BATCH)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            lazykern.ProjectedAdditiveKernel(base, 3, 4, learn_projections=True), batch_shape=BATCH)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _model():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*BATCH, 40, 3, generator=g, dtype=torch.float64)
    y = torch.sin(2 * x).sum(-1) + 0.1 * torch.randn(*BATCH, 40, generator=g, dtype=torch.float64)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=BATCH).double()
    model = _BatchGP(x, y, likelihood).double()
    model.covar_module.base_kernel.base_kernel.register_prior(
        "lengthscale_prior", gpytorch.priors.GammaPrior(3.0, 6.0), "lengthscale")
    model.train()
    return model, likelihood, x, y


def _loss_and_grads(mll_class, model, likelihood, x, y):
    model.zero_grad()
    loss = -mll_class(likelihood, model)(model(x), y).sum()
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_loss_and_every_gradient_equal_gpytorchs_on_a_batch_with_a_prior():
    model, likelihood, x, y = _model()
    ours, our_grads = _loss_and_grads(ExactMLL, model, likelihood, x, y)
    theirs, their_grads = _loss_and_grads(gpytorch.mlls.ExactMarginalLogLikelihood, model, likelihood, x, y)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-13)
    assert "covar_module.base_kernel.projections" in our_grads  # gradients reach the directions W
    for name, grad in their_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-11, atol=1e-13, msg=name)


def test_the_closed_form_gradient_passes_gradcheck():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)
    covariance = (a @ a.mT + 6 * torch.eye(6, dtype=torch.float64)).requires_grad_()
    residual = torch.randn(2, 6, generator=g, dtype=torch.float64, requires_grad=True)
    # Symmetrized: the closed form is the gradient on symmetric matrices, the only ones a likelihood holds.
    assert torch.autograd.gradcheck(lambda c, r: _CholeskyInvQuadLogdet.apply((c + c.mT) / 2, r),
                                    (covariance, residual))


def test_second_derivatives_equal_gpytorchs():
    model, likelihood, x, y = _model()
    raw_noise = likelihood.noise_covar.raw_noise
    second = []
    for mll_class in (ExactMLL, gpytorch.mlls.ExactMarginalLogLikelihood):
        loss = -mll_class(likelihood, model)(model(x), y).sum()
        (grad,) = torch.autograd.grad(loss, raw_noise, create_graph=True)
        second.append(torch.autograd.grad(grad.sum(), raw_noise)[0])
    torch.testing.assert_close(second[0], second[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("setting", [
    lambda: gpytorch.settings.max_cholesky_size(10),
    lambda: gpytorch.settings.fast_computations(log_prob=False),
    lambda: gpytorch.settings.observation_nan_policy("mask"),
])
def test_outside_the_cholesky_path_it_is_gpytorchs_likelihood(setting):
    model, likelihood, x, y = _model()
    with setting():  # the same probe vectors on the conjugate-gradient path: the same seed
        torch.manual_seed(0)
        ours, our_grads = _loss_and_grads(ExactMLL, model, likelihood, x, y)
        torch.manual_seed(0)
        theirs, their_grads = _loss_and_grads(gpytorch.mlls.ExactMarginalLogLikelihood, model, likelihood, x, y)
    assert ours.item() == theirs.item()
    for name, grad in their_grads.items():
        assert torch.equal(our_grads[name], grad), name


@pytest.mark.parametrize("mll_class", [ExactMLL, gpytorch.mlls.ExactMarginalLogLikelihood])
def test_a_matrix_that_is_not_positive_definite_raises_gpytorchs_error(mll_class):
    # Every point twice, a kernel variance of 1e4 over a noise of 1e-4: float32's rounding of K is
    # larger than the noise, and GPyTorch's jitter does not rescue the factorization.
    x = torch.randn(30, 2, generator=torch.Generator().manual_seed(0)).repeat(2, 1)
    model, likelihood = lazykern.regression.build_model(x, torch.sin(x[:, 0]), "rbf-ard")
    model.covar_module.outputscale, model.covar_module.base_kernel.lengthscale, likelihood.noise = 1e4, 30.0, 1e-4
    model.train()
    with pytest.raises(NotPSDError):
        mll_class(likelihood, model)(model(x), model.train_targets)


def test_botorch_fits_a_model_through_it_to_gpytorchs_optimum():
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP

    g = torch.Generator().manual_seed(2)
    x = torch.rand(30, 2, generator=g, dtype=torch.float64)
    y = torch.sin(6 * x).sum(-1, keepdim=True)
    losses = []
    for mll_class in (ExactMLL, gpytorch.mlls.ExactMarginalLogLikelihood):
        kernel = gpytorch.kernels.ScaleKernel(lazykern.MaternKernel(nu=2.5, ard_num_dims=2))
        model = SingleTaskGP(x, y, covar_module=kernel)
        fit_gpytorch_mll(mll_class(model.likelihood, model))
        model.train()
        with torch.no_grad():
            losses.append(-gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(
                model(*model.train_inputs), model.train_targets))
    assert losses[0].item() == pytest.approx(losses[1].item(), abs=1e-6)
