r"""Per-layer empirical-NTK formulas over per-sample features.

For a dense layer :math:`z = W a + b` the Jacobian of output :math:`f_o` with respect to
:math:`W` is the outer product :math:`g_o a^\top`, where :math:`a` is the layer's input and
:math:`g_o = \partial f_o / \partial z` its output cotangent. The layer's NTK contribution
therefore factorizes:

.. math::

    \Theta^{(l)}_{oo'}(x, x') = \langle \tilde a(x), \tilde a(x') \rangle\,
    \langle g_o(x), g_{o'}(x') \rangle, \qquad \tilde a = (a, 1)\ \text{(the 1 for the bias)}.

Summed over the outputs (the *trace* kernel) the second factor is a dot product of the flattened
cotangents :math:`\operatorname{vec} G = (g_1, \dots, g_k)`. In the *full* kernel a matrix product
needs, per layer, only :math:`w_i = \sum_j \langle \tilde a_i, \tilde a_j\rangle u_j` with
:math:`u_j = \sum_{o'} v_{jo'}\, g_{o'}(x_j)`, and then :math:`(\Theta v)_{io} = \sum_l \langle g^{(l)}_o(x_i), w^{(l)}_i\rangle`.

Every function here runs on pairwise-expanded KeOps ``LazyTensor`` objects (``x1``: ``(N, 1, D)``,
``x2``: ``(1, M, D)``), which never store anything pairwise, and on plain tensors of matching
shapes (elementwise, for diagonals and gathered entries).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

__all__ = ["dot", "factored_entry", "factored_weights"]


def dot(x1: Any, x2: Any) -> Any:
    r""":math:`\langle x_1, x_2 \rangle` over the last dimension, kept as a size-1 dimension.

    KeOps scalars are 1-vectors; keeping the dimension on tensors too lets the same expression
    broadcast against vector-valued factors on both engines.

    Example:
        >>> import torch
        >>> dot(torch.ones(2, 3), torch.ones(2, 3)).shape
        torch.Size([2, 1])
    """
    prod = x1 * x2
    return prod.sum(-1, keepdim=True) if isinstance(prod, Tensor) else prod.sum(-1)


def factored_entry(a1: Any, a2: Any, g1: Any, g2: Any) -> Any:
    r"""One layer's kernel entry :math:`\langle \tilde a_1, \tilde a_2\rangle \langle g_1, g_2\rangle`.

    With ``g`` the flattened cotangents of all outputs this is the layer's trace-NTK entry; with
    ``g`` the cotangent of one output each it is one entry of the full NTK.

    Example:
        >>> import torch
        >>> a, g = torch.randn(4, 3), torch.randn(4, 5)
        >>> factored_entry(a, a, g, g).shape  # elementwise: the diagonal
        torch.Size([4, 1])
    """
    return dot(a1, a2) * dot(g1, g2)


def factored_weights(a1: Any, a2: Any, u2: Any) -> Any:
    r"""The summand :math:`\langle \tilde a_i, \tilde a_j \rangle\, u_j` of :math:`w_i` (full-mode products).

    Example:
        >>> import torch
        >>> a, u = torch.randn(4, 3), torch.randn(4, 6)
        >>> w = factored_weights(a[:, None, :], a[None, :, :], u[None, :, :]).sum(1)
        >>> torch.allclose(w, (a @ a.T) @ u)
        True
    """
    return dot(a1, a2) * u2
