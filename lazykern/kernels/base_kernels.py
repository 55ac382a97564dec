"""Full-dimensional stationary kernels, each one lazy formula.

Each class subclasses its GPyTorch namesake, so constructor arguments (``ard_num_dims``,
``batch_shape``, ``active_dims``, priors, constraints), hyperparameter names and ``state_dict``
keys are GPyTorch's: migrating is a change of import. Only ``forward`` differs: it returns a
:class:`~lazykern.operators.LazyKernelOperator` that never stores the N x M matrix unless it fits
the dense budget.
"""

from __future__ import annotations

import gpytorch

from ..formulas.stationary import MATERN_NUS
from ..validation import check_choice
from .stationary import LazyStationaryKernel

__all__ = ["RBFKernel", "MaternKernel", "RQKernel", "PeriodicKernel"]


class RBFKernel(LazyStationaryKernel, gpytorch.kernels.RBFKernel):
    r"""Radial basis function kernel, evaluated lazily.

    .. math::

        k(x, x') = \exp\Big(-\tfrac12 \sum_d \frac{(x_d - x'_d)^2}{\ell_d^2}\Big)

    Args: as :class:`gpytorch.kernels.RBFKernel`.

    Example:
        >>> import torch, gpytorch, lazykern
        >>> x = torch.randn(1000, 4)
        >>> kernel = gpytorch.kernels.ScaleKernel(lazykern.kernels.RBFKernel(ard_num_dims=4))
        >>> K = kernel(x)                       # lazy: nothing 1000 x 1000 is stored
        >>> (K @ torch.ones(1000, 1)).shape
        torch.Size([1000, 1])
    """


class MaternKernel(LazyStationaryKernel, gpytorch.kernels.MaternKernel):
    r"""Matérn kernel with :math:`\nu \in \{1/2, 3/2, 5/2\}`, evaluated lazily.

    With :math:`r = \|(x - x') / \ell\|`:

    .. math::

        k_{1/2} = e^{-r}, \quad
        k_{3/2} = (1 + \sqrt3 r)\, e^{-\sqrt3 r}, \quad
        k_{5/2} = (1 + \sqrt5 r + \tfrac53 r^2)\, e^{-\sqrt5 r}.

    Gradients are finite at coincident points (the distance is :math:`\sqrt{r^2 + 10^{-30}}`).

    Args:
        nu: 0.5, 1.5 or 2.5 (default 2.5); other arguments as :class:`gpytorch.kernels.MaternKernel`.

    Example:
        >>> import torch, lazykern
        >>> kernel = lazykern.kernels.MaternKernel(nu=1.5)
        >>> kernel(torch.randn(10, 2), diag=True).shape
        torch.Size([10])
    """

    def __init__(self, nu: float = 2.5, **kwargs) -> None:
        # Before GPyTorch's own check, which raises a RuntimeError that names no argument.
        super().__init__(nu=check_choice("nu", nu, MATERN_NUS), **kwargs)


class RQKernel(LazyStationaryKernel, gpytorch.kernels.RQKernel):
    r"""Rational quadratic kernel with a learnable :math:`\alpha`, evaluated lazily.

    .. math::

        k(x, x') = \Big(1 + \frac{1}{2\alpha} \sum_d \frac{(x_d - x'_d)^2}{\ell_d^2}\Big)^{-\alpha}

    Args: as :class:`gpytorch.kernels.RQKernel`.

    Example:
        >>> import torch, lazykern
        >>> kernel = lazykern.kernels.RQKernel()
        >>> kernel.alpha = 2.0
        >>> kernel(torch.randn(10, 2)).to_dense().shape
        torch.Size([10, 10])
    """


class PeriodicKernel(LazyStationaryKernel, gpytorch.kernels.PeriodicKernel):
    r"""Periodic kernel with a learnable period, evaluated lazily (GPyTorch's parameterization).

    .. math::

        k(x, x') = \exp\Big(-2 \sum_d \frac{\sin^2(\pi (x_d - x'_d) / p_d)}{\ell_d}\Big)

    Args: as :class:`gpytorch.kernels.PeriodicKernel`.

    Example:
        >>> import torch, lazykern
        >>> kernel = lazykern.kernels.PeriodicKernel()
        >>> kernel.period_length = 0.5
        >>> kernel(torch.randn(10, 1)).to_dense().shape
        torch.Size([10, 10])
    """

    def __init__(self, **kwargs) -> None:
        # GPyTorch's PeriodicKernel breaks on an explicit ard_num_dims=None; it means "shared".
        if kwargs.get("ard_num_dims", 0) is None:
            del kwargs["ard_num_dims"]
        super().__init__(**kwargs)
